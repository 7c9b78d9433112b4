"""Log-probabilities: the device loop's (written beside each token, read as tokens are) equal the
host path's and a float64 log_softmax of the same logits; the zero cost when off; the NumPy
backend against an independent float64 reference."""

import dataclasses

import numpy as np
import pytest

from arcpy.codes import MAX_TOP_LOGPROBS
from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.devices.numpy_device import NumpyDevice
from arcpy.devices.reference import ReferenceModel
from arcpy.errors import InvalidArgumentError
from arcpy.loop import gate
from arcpy.loop.engine import DEVICE_LOOP, HOST, Engine
from arcpy.loop.request import Request
from arcpy.loop.settings import EngineSettings
from arcpy.model import SHAPES, random_model
from arcpy.sampling import Sampling, TokenLogprob, logprob_entries, token_logprob

PROMPT = (1, 2, 3)


def log_softmax64(logits):
    x = np.asarray(logits, dtype=np.float64)
    return x - (x.max() + np.log(np.sum(np.exp(x - x.max()))))


def fake_logits(device, token, position):
    return device.script.forward(token, position)[0]


def engine(loop=True, script=None, **kw):
    return Engine(FakeDevice(script or FakeScript()), "fake", EngineSettings(device_loop=loop, **kw), environ={},
                  latch=gate.FallbackLatch())


def pieces(eng, n=24, top=5, sampling=Sampling(), stop_ids=()):
    return [p for p in eng.stream(Request(prompt_ids=PROMPT, max_new_tokens=n, logprobs=top, sampling=sampling,
                                          stop_ids=stop_ids)) if p.token is not None]


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.9, top_k=20, seed=4)])
@pytest.mark.parametrize("burst", [1, 4, 16])
def test_the_loops_log_probabilities_are_the_host_paths_and_float64s(sampling, burst):
    loop, host = engine(burst=burst), engine(loop=False)
    got, want = pieces(loop, sampling=sampling), pieces(host, sampling=sampling)
    assert loop.stats.path == DEVICE_LOOP and host.stats.path == HOST and loop.stats.host_waits == 0
    assert [p.token for p in got] == [p.token for p in want]
    assert [p.logprob for p in got] == [p.logprob for p in want]
    token, position = PROMPT[-1], len(PROMPT) - 1
    for p in got:
        ref = log_softmax64(fake_logits(loop.device, token, position))
        order = np.lexsort((np.arange(ref.size), -ref))[:5]
        assert abs(p.logprob.logprob - ref[p.token]) < 1e-9
        assert [i for i, _ in p.logprob.top] == list(order)
        assert np.allclose([v for _, v in p.logprob.top], ref[order], atol=1e-9, rtol=0)
        token, position = p.token, position + 1


def test_a_stop_id_whose_entry_lands_after_it_still_ends_the_burst_cleanly():
    eng = engine(burst=16, script=FakeScript(latency=4))
    want = pieces(engine(loop=False), n=30)
    tokens = [p.token for p in want]
    first = tokens.index(tokens[10])  # where that token first appears
    got = pieces(eng, n=30, stop_ids=(tokens[10],))
    assert eng.stats.finish_reason == "stop_id" and eng.stats.fallback is None
    assert first > 0 and [p.token for p in got] == tokens[:first]
    assert [p.logprob for p in got] == [p.logprob for p in want[:first]]
    assert eng.device.steps_enqueued == 16  # one burst: the stop token was taken in it, with its entry


def test_without_log_probabilities_the_loop_writes_none():
    eng = engine(burst=8)
    out = list(eng.stream(Request(prompt_ids=PROMPT, max_new_tokens=16)))
    assert all(p.logprob is None for p in out)
    assert eng.device.entries == [] and eng.device.top_logprobs is None
    pieces(eng, n=4)
    assert len(eng.device.entries) == 4
    list(eng.stream(Request(prompt_ids=PROMPT, max_new_tokens=4)))  # off again
    assert eng.device.top_logprobs is None and eng.device.entries == []


def test_zero_alternatives_give_the_chosen_tokens_alone():
    got = pieces(engine(), top=0)
    assert got and all(p.logprob.top == () and p.logprob.logprob <= 0 for p in got)


def test_a_loop_without_log_probabilities_sends_the_request_to_the_host_path():
    eng = engine(script=FakeScript(supports_logprobs=False))
    got = pieces(eng, n=6)
    assert eng.stats.path == HOST and "log-probabilities" in eng.path_reason and all(p.logprob for p in got)


def test_log_probabilities_turn_speculation_off():
    eng = engine(script=FakeScript(speculate_k=3), burst=8)
    pieces(eng, n=8)
    assert eng.stats.speculation == "off" and eng.device.spec_steps == 0


@pytest.mark.parametrize("bad", [-1, 21, 2.0, True, "3"])
def test_a_request_refuses_logprobs_outside_0_to_20(bad):
    with pytest.raises(InvalidArgumentError, match="logprobs"):
        Request(prompt_ids=PROMPT, logprobs=bad)


def test_token_logprob_orders_ties_by_id_and_keeps_minus_infinity():
    lp = token_logprob(np.array([1.0, 3.0, 3.0, -np.inf], np.float32), 3, 4)
    assert [i for i, _ in lp.top] == [1, 2, 0, 3] and lp.logprob == -np.inf
    assert isinstance(lp, TokenLogprob)


def test_numpy_backend_log_probabilities_match_a_float64_reference():
    model = random_model(dataclasses.replace(SHAPES["stories15M"], max_seq=64), seed=2)
    eng = Engine(NumpyDevice(ReferenceModel(model)), "numpy", environ={}, latch=gate.FallbackLatch())
    prompt = [5, 9, 11, 200]
    got = [p for p in eng.stream(Request(prompt_ids=prompt, max_new_tokens=6, logprobs=20)) if p.token is not None]
    ref = ReferenceModel(model)
    logits = ref.prefill(prompt, 0)
    pos = len(prompt)
    for p in got:
        want = log_softmax64(logits)
        assert p.token == int(np.argmax(logits))
        assert abs(p.logprob.logprob - want[p.token]) < 1e-3
        top = np.argsort(-want, kind="stable")[:20]
        assert [i for i, _ in p.logprob.top] == list(top)
        assert np.allclose([v for _, v in p.logprob.top], want[top], atol=1e-3, rtol=0)
        logits = ref.forward(p.token, pos)
        pos += 1


def test_the_prompts_own_log_probabilities_are_the_references_and_leave_the_cache_exact():
    model = random_model(dataclasses.replace(SHAPES["stories15M"], max_seq=256), seed=2)
    eng = Engine(NumpyDevice(ReferenceModel(model, 256)), "numpy", environ={}, latch=gate.FallbackLatch())
    prompt = [1, *range(40, 119)]  # 80 tokens: a whole granule (64) of prefilled rows to reuse
    first = list(eng.stream(Request(prompt_ids=prompt, max_new_tokens=6, logprobs=3)))
    # The prefill's rows, chunk by chunk as a cold prefill goes, each scored in float64 here.
    rows = ReferenceModel(model, 256).prefill(prompt + [first[0].token], 0, chunk=64, every_row=True)
    lps = eng.prompt_logprobs(prompt + [first[0].token], 3)
    assert len(lps) == len(prompt)
    for i, got in enumerate(lps):
        want = log_softmax64(rows[i])
        top = np.argsort(-want, kind="stable")[:3]
        assert abs(got.logprob - want[([*prompt, first[0].token])[i + 1]]) <= 1e-9
        assert [t for t, _ in got.top] == list(top) and np.allclose([v for _, v in got.top], want[top], atol=1e-9)
    # The last entry is the answer's first token, which the loop scored from the prompt's prefill.
    # Not bit for bit on this backend: the BLAS's threads split a product by its row count, so a
    # row's float32 sums depend on the prefill's length (80 rows here, 81 there), and through the
    # bf16 cache that moved this value by 8.2e-4 on a 2-core machine (it is equal with one thread).
    # Another row's entry for this token is off by tens (rows 70-78: -28 to -60, this one -0.65).
    assert abs(lps[-1].logprob - first[0].logprob.logprob) <= 2e-3
    assert [t for t, _ in lps[-1].top] == [t for t, _ in first[0].logprob.top]
    # The scoring's prefill wrote a cold prefill's rows: the next request reuses its whole granule
    # and decodes as before.
    assert list(eng.generate(prompt, 6)) == [p.token for p in first] and eng.stats.cached_tokens == 64
    assert eng.prompt_logprobs(prompt[:1], 3) == []
    for bad in (-1, 21):
        with pytest.raises(InvalidArgumentError, match="top_n must be an integer in 0..20"):
            eng.prompt_logprobs(prompt, bad)
    with pytest.raises(InvalidArgumentError, match="a prompt of 300 tokens to score"):
        eng.prompt_logprobs([1] * 300, 0)


def test_the_scored_prompt_is_held_at_any_position_and_a_device_without_a_prefill_refuses(latch):
    """On a device whose prefill may resume anywhere (granule 1, as the GPU's), the scoring's rows
    serve the next request but for its last token; each entry is the log-probability of the next
    token under a forward of the one before."""
    eng = Engine(FakeDevice(FakeScript(prefix_granule=1)), "fake", EngineSettings(device_loop=True), environ={},
                 latch=latch)
    prompt = [3, 9, 4, 17, 5]
    scored = eng.prompt_logprobs(prompt, 2)
    dev = eng.device
    assert dev.prefills[-1] == (tuple(prompt), 0) and len(scored) == len(prompt) - 1
    for i, got in enumerate(scored):
        assert got == token_logprob(dev.script.forward(prompt[i], i)[0], prompt[i + 1], 2)
    list(eng.generate(prompt, 3))
    assert eng.stats.cached_tokens == len(prompt) - 1 and dev.prefills[-1] == ((5,), 4)
    bare = Engine(FakeDevice(FakeScript(supports_prefill=False)), "fake", EngineSettings(device_loop=True),
                  environ={}, latch=latch)
    with pytest.raises(InvalidArgumentError, match="has no prefill to score a prompt with"):
        bare.prompt_logprobs(prompt, 2)


def test_entries_are_read_as_the_device_lays_them_out():
    """arc_ring_read_logprobs' and arc_model_prompt_logprobs' layout: a value per entry, then
    MAX_TOP_LOGPROBS ids and values per entry, of which the first top_n count; -1 is no id."""
    width = MAX_TOP_LOGPROBS
    ids = [7, 3, -1] + [99] * (width - 3) + [5, 6, 8] + [99] * (width - 3)
    values = [-0.5, -1.5, float("-inf")] + [9.0] * (width - 3) + [-0.1, -2.0, -3.0] + [9.0] * (width - 3)
    got = logprob_entries([-0.5, -0.25], ids, values, 3)
    assert got == [TokenLogprob(-0.5, ((7, -0.5), (3, -1.5))), TokenLogprob(-0.25, ((5, -0.1), (6, -2.0), (8, -3.0)))]
    assert logprob_entries([-0.5], ids, values, 0) == [TokenLogprob(-0.5, ())]
    assert logprob_entries([], [], [], 5) == []


def test_the_gpus_prompt_scores_are_read_from_its_mapped_arrays():
    """PromptScores.read_prompt_logprobs over arrays shaped as its pinned ones (max_seq entries)."""
    from arcpy.devices.prompt_scores import PromptScores

    class Idle(PromptScores):
        def _require_idle(self, what):
            pass

    rng = np.random.default_rng(5)
    lp = rng.standard_normal(16).astype(np.float32)
    ids = rng.integers(0, 1000, (16, MAX_TOP_LOGPROBS)).astype(np.int32)
    ids[1, 2] = -1
    values = rng.standard_normal((16, MAX_TOP_LOGPROBS)).astype(np.float32)
    dev = Idle()
    dev._scores, dev._scored = ((lp, None), (ids, None), (values, None)), (3, 4)
    want = [TokenLogprob(float(lp[k]), tuple((int(ids[k, j]), float(values[k, j])) for j in range(4) if ids[k, j] >= 0))
            for k in range(3)]
    assert dev.read_prompt_logprobs() == want and len(want[1].top) == 3
