"""Constrained output in the device loop (FakeDevice): each step applies the grammar's mask on the
device, the host writing the next mask as the tokens before it land, so a constrained answer costs
no host wait a token; its tokens are the host path's, greedy and seeded; a mask that never comes
latches the timeout fault, and the engine falls back with the grammar stepped back; a sequence
ended mid-burst lets the steps in flight pass."""

import json

import jsonschema
import pytest
from agent_helpers import family_text

from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.loop.engine import DEVICE_LOOP, HOST, Engine
from arcpy.loop.constrain import matcher_for
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.request import Constraint, Request
from arcpy.loop.settings import EngineSettings
from arcpy.sampling import Sampling

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "n"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}}}
FORMAT = Constraint.of({"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA, "strict": True}})
TEXT = family_text()


def engine(loop=True, burst=8, **script):
    dev = FakeDevice(FakeScript(vocab=TEXT.tokenizer.get_vocab_size(), latency=1, **script))
    eng = Engine(dev, "fake", EngineSettings(device_loop=loop, burst=burst), environ={}, latch=FallbackLatch())
    eng.text = TEXT
    return eng


def answer(eng, sampling=None, **kw):
    r = Request(messages=[{"role": "user", "content": "hi"}], max_new_tokens=120, response_format=FORMAT,
                sampling=sampling or Sampling(), **kw)
    tokens, text = [], []
    for piece in eng.stream(r):
        if piece.token is not None:
            tokens.append(piece.token)
        text.append(piece.text or "")
    return tokens, "".join(text)


@pytest.mark.parametrize("sampling", [None, Sampling(temperature=1.0, seed=1), Sampling(temperature=0.7, top_p=0.9,
                                                                                       seed=2)],
                         ids=["greedy", "t1", "t0.7-p0.9"])
def test_the_loop_applies_the_mask_on_the_device_and_makes_the_host_paths_tokens(sampling):
    loop, host = engine(), engine(loop=False)
    got, text = answer(loop, sampling)
    assert loop.stats.path == DEVICE_LOOP and loop.stats.host_waits == 0, loop.path_reason
    assert loop.stats.finish_reason == "stop_id"
    jsonschema.validate(json.loads(text), SCHEMA)
    want, want_text = answer(host, sampling)
    assert host.stats.path == HOST and got == want and text == want_text


def test_a_mask_that_never_comes_latches_the_timeout_and_the_engine_falls_back_in_step():
    eng = engine(mask_patience=20)
    dev, writes = eng.device, []
    real = dev.write_mask

    def late(n, words):  # the host stalls after the fourth mask
        writes.append(n)
        if len(writes) <= 4:
            real(n, words)
    dev.write_mask = late
    got, text = answer(eng)
    assert eng.stats.path == f"{DEVICE_LOOP}+{HOST}" and "no token mask from the host in time" in eng.stats.fallback
    assert dev.mask_timeouts == 1
    jsonschema.validate(json.loads(text), SCHEMA)
    dev.write_mask = real
    assert (got, text) == answer(engine(loop=False))  # the grammar stepped back over what was dropped


def test_a_stop_string_mid_burst_lets_the_steps_in_flight_pass():
    eng = engine(burst=16, mask_patience=50)
    first, _ = answer(eng)
    cut, text = answer(eng, stop=(",",))
    assert eng.stats.finish_reason == "stop_string" and len(cut) < len(first)
    again, _ = answer(eng)  # the next sequence starts once the abandoned steps retired
    assert again == first and eng.stats.path == DEVICE_LOOP
    assert eng.device.mask_timeouts == 0  # none of them waited for a mask that was not coming


def stepped(eng, prompt=(1, 2, 3)):
    """The constrained answer to raw prompt ids through Engine.step, which takes a whole burst
    before handing out its first token."""
    req = Request(prompt_ids=prompt, response_format=FORMAT, max_new_tokens=120)
    eng.start(list(prompt), 120, stop_ids=TEXT.eos_ids, matcher=matcher_for(TEXT, eng.device.vocab, req))
    out = []
    while (tok := eng.step()) is not None:
        out.append(tok)
    return out


def test_a_fallback_after_parked_tokens_steps_the_grammar_back_over_them():
    eng = engine(mask_patience=20)
    dev, writes = eng.device, []
    real = dev.write_mask

    def late(n, words):
        writes.append(n)
        if len(writes) <= 5:
            real(n, words)
    dev.write_mask = late
    got = stepped(eng)
    assert eng.stats.path == f"{DEVICE_LOOP}+{HOST}" and dev.mask_timeouts == 1
    assert got == stepped(engine(loop=False))
    json.loads(TEXT.tokenizer.decode(got))
