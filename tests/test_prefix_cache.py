"""Prefix reuse: a prompt that begins with the tokens of the last prefill prefills only the rest,
and its tokens are a cold run's."""

import dataclasses

import numpy as np
import pytest

from arcpy.devices.cpu import NumpyDevice
from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.devices.reference import ReferenceModel
from arcpy.loop import gate
from arcpy.loop.engine import Engine
from arcpy.model import SHAPES, random_model
from arcpy.sampling import Sampling


@pytest.fixture
def latch():
    return gate.FallbackLatch()


def fake(latch, granule=1, **kw):
    return Engine(FakeDevice(FakeScript(prefix_granule=granule)), "fake", device_loop=True, environ={},
                  latch=latch, **kw)


def test_a_prompt_that_extends_the_last_prefills_only_the_rest(latch):
    eng = fake(latch)
    first = list(range(1, 21))
    answer = list(eng.generate(first, 5))
    second = first + answer + [7, 8, 9]
    got = list(eng.generate(second, 12))
    # The rows of the answer were written by decode steps: not reused.
    assert eng.device.prefills[-1] == (tuple(second[20:]), 20)
    assert eng.stats.cached_tokens == 20 and eng.stats.prompt_tokens == len(second)
    cold = fake(gate.FallbackLatch())
    assert got == list(cold.generate(second, 12)) and cold.stats.cached_tokens == 0
    assert eng.prefix.stats.hits == 1 and eng.prefix.stats.cached_tokens == 20
    assert eng.prefix.stats.prefills == 2 and eng.prefix.stats.prompt_tokens == 20 + len(second)


def test_the_same_prompt_again_prefills_its_last_token(latch):
    eng = fake(latch)
    prompt = [5, 6, 7, 8]
    a = list(eng.generate(prompt, 8))
    b = list(eng.generate(prompt, 8))
    assert a == b and eng.device.prefills[-1] == ((8,), 3) and eng.stats.cached_tokens == 3


def test_reuse_stops_at_the_first_token_that_differs(latch):
    eng = fake(latch)
    list(eng.generate([1, 2, 3, 4, 5, 6], 2))
    list(eng.generate([1, 2, 3, 9, 5, 6, 7], 2))
    assert eng.device.prefills[-1] == ((9, 5, 6, 7), 3)
    list(eng.generate([2, 2, 3], 2))  # nothing shared
    assert eng.device.prefills[-1] == ((2, 2, 3), 0) and eng.stats.cached_tokens == 0


def test_the_reused_prefix_is_a_multiple_of_the_granule(latch):
    eng = fake(latch, granule=4)
    prompt = list(range(1, 12))       # 11 tokens: rows 0..7 are whole granules
    list(eng.generate(prompt, 2))
    assert eng.prefix.held == prompt[:8]
    list(eng.generate(prompt + [30, 31], 2))
    assert eng.device.prefills[-1] == (tuple(prompt[8:] + [30, 31]), 8)
    list(eng.generate(prompt[:6] + [40], 2))  # 6 shared: one granule
    assert eng.device.prefills[-1] == (tuple(prompt[4:6] + [40]), 4)


@pytest.mark.parametrize("how", ["prefix_cache", "prefill", "clear"])
def test_without_the_cache_every_prompt_is_prefilled_whole(latch, how):
    eng = fake(latch, prefix_cache=how != "prefix_cache", prefill=how != "prefill")
    prompt = [3, 4, 5, 6, 7]
    list(eng.generate(prompt, 3))
    if how == "clear":
        eng.prefix.clear()
    list(eng.generate(prompt + [8], 3))
    assert eng.stats.cached_tokens == 0 and eng.prefix.stats.hits == 0
    if how != "prefill":
        assert eng.device.prefills[-1] == (tuple(prompt + [8]), 0)


def test_a_device_without_a_granule_reuses_nothing(latch):
    eng = fake(latch, granule=0)
    list(eng.generate([1, 2, 3], 2))
    list(eng.generate([1, 2, 3, 4], 2))
    assert eng.device.prefills[-1] == ((1, 2, 3, 4), 0)


def test_a_poisoned_engine_forgets_its_prefix(latch):
    eng = fake(latch)
    list(eng.generate([1, 2, 3], 2))
    assert eng.prefix.held
    eng._poison("test")
    assert eng.prefix.held == []


# -- on the NumPy reference backend: the rows, the logits and the tokens of a cold run -----------

SHAPES_TESTED = ["stories15M", "qwen3-tiny", "gemma3-tiny"]


def _model(shape):
    return random_model(dataclasses.replace(SHAPES[shape], max_seq=256), seed=3)


@pytest.mark.parametrize("shape", SHAPES_TESTED)
def test_reference_rows_of_a_resumed_prefill_are_a_cold_prefills_bit_for_bit(shape):
    model = _model(shape)
    rng = np.random.default_rng(1)
    a = [int(t) for t in rng.integers(0, model.config.vocab, 150)]
    b = a[:97] + [int(t) for t in rng.integers(0, model.config.vocab, 60)]
    cold, warm = ReferenceModel(model), ReferenceModel(model)
    cold_logits = cold.prefill(b, 0)
    warm.prefill(a, 0)
    warm_logits = warm.prefill(b[97:], 97)
    n = len(b)
    assert np.array_equal(cold_logits, warm_logits)
    assert np.array_equal(cold.k_cache[:, :, :n], warm.k_cache[:, :, :n])
    assert np.array_equal(cold.v_cache[:, :, :n], warm.v_cache[:, :, :n])


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.9, top_k=40, top_p=0.95, seed=11)])
def test_reference_turns_with_the_cache_give_a_cold_runs_tokens(latch, sampling):
    model = _model("stories15M")
    rng = np.random.default_rng(2)
    warm = Engine(NumpyDevice(ReferenceModel(model)), "numpy", environ={}, latch=latch)
    history = [int(t) for t in rng.integers(0, model.config.vocab, 40)]
    for turn in range(3):
        answer = list(warm.generate(history, 6, sampling=sampling))
        cold = Engine(NumpyDevice(ReferenceModel(model)), "numpy", environ={}, latch=latch, prefix_cache=False)
        assert answer == list(cold.generate(history, 6, sampling=sampling)), turn
        assert (warm.stats.cached_tokens > 0) == (turn > 0)
        history = history + answer + [int(t) for t in rng.integers(0, model.config.vocab, 5)]
