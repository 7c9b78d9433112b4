"""logit_bias: added on the device on both paths (the fake GPU's loop and host path alike), on
the host where the device has none (the NumPy backend), checked in one line."""

import dataclasses

import numpy as np
import pytest

from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.devices.numpy_device import NumpyDevice
from arcpy.devices.reference import ReferenceModel
from arcpy.errors import InvalidArgumentError
from arcpy.loop import gate
from arcpy.loop.engine import DEVICE_LOOP, HOST, Engine
from arcpy.loop.request import Request
from arcpy.loop.settings import EngineSettings
from arcpy.model import SHAPES, random_model
from arcpy.sampling import Sampling

PROMPT = (1, 2, 3)


def engine(loop=True, script=None, **kw):
    return Engine(FakeDevice(script or FakeScript()), "fake", EngineSettings(device_loop=loop, **kw), environ={},
                  latch=gate.FallbackLatch())


def tokens(eng, bias, n=24, sampling=Sampling(), logprobs=None):
    return [p.token for p in eng.stream(Request(prompt_ids=PROMPT, max_new_tokens=n, logit_bias=bias,
                                                sampling=sampling, logprobs=logprobs)) if p.token is not None]


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, seed=12)])
def test_a_bias_changes_the_tokens_alike_on_both_paths(sampling):
    plain = tokens(engine(), {}, sampling=sampling)
    bias = {plain[0]: -100.0, plain[3]: -100.0, 7: 0.75}
    loop, host = engine(burst=8), engine(loop=False)
    added = []
    host.device._enqueue_bias = lambda real=host.device._enqueue_bias: (added.append(1), real())
    got = tokens(loop, bias, sampling=sampling)
    assert loop.stats.path == DEVICE_LOOP and loop.stats.host_waits == 0
    assert got == tokens(host, bias, sampling=sampling) and host.stats.path == HOST
    assert got != plain and plain[0] not in got and plain[3] not in got
    assert len(added) == 24  # the host path had the device add it after each forward


def test_a_large_bias_forces_a_token():
    got = tokens(engine(), {9: 100.0}, n=6)
    assert got == [9] * 6


def test_the_bias_is_cleared_for_the_next_request():
    eng = engine()
    plain = tokens(eng, {})
    tokens(eng, {plain[0]: -100.0})
    assert tokens(eng, {}) == plain and eng.device.bias == ()


def test_log_probabilities_are_those_of_the_biased_logits_on_both_paths():
    bias = {5: 2.5}
    loop = [p.logprob for p in engine().stream(Request(prompt_ids=PROMPT, max_new_tokens=8, logit_bias=bias,
                                                       logprobs=3))]
    host = [p.logprob for p in engine(loop=False).stream(Request(prompt_ids=PROMPT, max_new_tokens=8,
                                                                 logit_bias=bias, logprobs=3))]
    assert loop == host and all(lp is not None for lp in loop)


def test_a_device_without_a_bias_adds_it_on_the_host_path():
    eng = engine(script=FakeScript(supports_logit_bias=False))
    plain = tokens(engine(), {})
    got = tokens(eng, {plain[0]: -100.0})
    assert eng.stats.path == HOST and "logit_bias" in eng.path_reason
    assert got == tokens(engine(), {plain[0]: -100.0})


def test_a_bias_turns_speculation_off():
    eng = engine(script=FakeScript(speculate_k=3))
    tokens(eng, {4: 1.0}, n=8)
    assert eng.stats.speculation == "off" and eng.device.spec_steps == 0


@pytest.mark.parametrize("bias,words", [
    ({-1: 1.0}, "not a token id"), ({"3": 1.0}, "not a token id"), ({3: 101}, "[-100, 100]"),
    ({3: float("nan")}, "[-100, 100]"), ({3: True}, "[-100, 100]"), ([1, 2], "map token ids"),
    ({i: 1.0 for i in range(257)}, "at most 256"),
])
def test_a_bad_bias_is_one_line(bias, words):
    with pytest.raises(InvalidArgumentError, match=None) as err:
        Request(prompt_ids=PROMPT, logit_bias=bias)
    assert words in str(err.value)


def test_a_bias_id_outside_the_vocabulary_is_refused():
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        tokens(engine(), {64: 1.0})


def test_numpy_backend_adds_the_bias_to_the_reference_logits():
    model = random_model(dataclasses.replace(SHAPES["stories15M"], max_seq=64), seed=4)
    eng = Engine(NumpyDevice(ReferenceModel(model)), "numpy", environ={}, latch=gate.FallbackLatch())
    prompt = [3, 8, 13]
    ref = ReferenceModel(model)
    first = int(np.argmax(ref.prefill(prompt, 0)))
    bias = {first: -100.0, 77: 4.0}
    got = [p.token for p in eng.stream(Request(prompt_ids=prompt, max_new_tokens=5, logit_bias=bias))
           if p.token is not None]
    ref, pos = ReferenceModel(model), len(prompt)
    logits, want = ref.prefill(prompt, 0), []
    for _ in range(5):
        biased = logits.copy()
        biased[[first, 77]] += np.array([-100.0, 4.0], np.float32)
        want.append(int(np.argmax(biased)))
        logits = ref.forward(want[-1], pos)
        pos += 1
    assert got == want and first not in got
