"""Prefix reuse: a prompt that begins with the tokens of the last prefill prefills only the rest,
and its tokens are a cold run's."""

import dataclasses

import numpy as np
import pytest

from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.devices.numpy_device import NumpyDevice
from arcpy.devices.reference import ReferenceModel
from arcpy.errors import InvalidArgumentError
from arcpy.loop import gate
from arcpy.loop.engine import Engine
from arcpy.loop.settings import EngineSettings
from arcpy.model import SHAPES, random_model
from arcpy.sampling import Sampling


def fake(latch, granule=1, **kw):
    return Engine(FakeDevice(FakeScript(prefix_granule=granule)), "fake", EngineSettings(device_loop=True, **kw),
                  environ={}, latch=latch)


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
def test_reference_rows_of_a_prefill_resumed_at_a_chunk_are_a_cold_prefills_bit_for_bit(shape):
    model = _model(shape)
    rng = np.random.default_rng(1)
    a = [int(t) for t in rng.integers(0, model.config.vocab, 150)]
    b = a[:140] + [int(t) for t in rng.integers(0, model.config.vocab, 60)]
    chunk = NumpyDevice.prefix_granule
    cold, warm = ReferenceModel(model), ReferenceModel(model)
    cold_logits = cold.prefill(b, 0, chunk=chunk)
    warm.prefill(a, 0, chunk=chunk)
    warm_logits = warm.prefill(b[2 * chunk:], 2 * chunk, chunk=chunk)
    n = len(b)
    assert np.array_equal(cold_logits, warm_logits)
    assert np.array_equal(cold.k_cache[:, :, :n], warm.k_cache[:, :, :n])
    assert np.array_equal(cold.v_cache[:, :, :n], warm.v_cache[:, :, :n])


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.9, top_k=40, top_p=0.95, seed=11)])
def test_reference_turns_with_the_cache_give_a_cold_runs_tokens(latch, sampling):
    model = _model("stories15M")
    rng = np.random.default_rng(2)
    warm = Engine(NumpyDevice(ReferenceModel(model)), "numpy", environ={}, latch=latch)
    history = [int(t) for t in rng.integers(0, model.config.vocab, 100)]  # more than a chunk
    for turn in range(3):
        answer = list(warm.generate(history, 6, sampling=sampling))
        cold = Engine(NumpyDevice(ReferenceModel(model)), "numpy", EngineSettings(prefix_cache=False), environ={},
                      latch=latch)
        assert answer == list(cold.generate(history, 6, sampling=sampling)), turn
        assert (warm.stats.cached_tokens > 0) == (turn > 0)
        history = history + answer + [int(t) for t in rng.integers(0, model.config.vocab, 5)]


def test_reference_a_stored_prefix_restored_in_part_gives_a_cold_runs_tokens(latch):
    """A prefix saved with 128 positions and brought back for 64 of them: the rows come back from
    where they were saved (the store lays out each layer and head's run of the saved positions)."""
    model = _model("stories15M")
    rng = np.random.default_rng(3)
    a = [int(t) for t in rng.integers(0, model.config.vocab, 150)]
    b = [int(t) for t in rng.integers(0, model.config.vocab, 30)]
    c = a[:70] + [int(t) for t in rng.integers(0, model.config.vocab, 10)]
    device = NumpyDevice(ReferenceModel(model))
    warm = Engine(device, "numpy", EngineSettings(prompt_cache_bytes=200 * device.prefix_row_bytes), environ={},
                  latch=latch)
    list(warm.generate(a, 3))
    list(warm.generate(b, 3))  # a's 128 held positions are saved
    got = list(warm.generate(c, 6))
    assert warm.stats.cached_tokens == 64 and warm.prefix.restored
    cold = Engine(NumpyDevice(ReferenceModel(model)), "numpy", EngineSettings(prefix_cache=False), environ={},
                  latch=latch)
    assert got == list(cold.generate(c, 6))


# -- the store of earlier prefixes -------------------------------------------------------------

def stored_engine(latch, row=8, **kw):
    return Engine(FakeDevice(FakeScript(prefix_row_bytes=row)), "fake", EngineSettings(device_loop=True, **kw),
                  environ={}, latch=latch)


def test_alternating_prompts_get_their_rows_back_from_the_store(latch):
    eng = stored_engine(latch)
    assert eng.prefix.capacity == 64 * 8
    a, b = list(range(1, 21)), list(range(30, 50))
    list(eng.generate(a, 3))
    list(eng.generate(b, 3))                  # a's rows are saved before b's prefill rewrites them
    assert eng.device.prefix_ops == [("save", 0, 20)] and eng.stats.cached_tokens == 0
    list(eng.generate(a + [7, 8], 3))         # b's saved, a's copied back: only the new tokens prefilled
    assert eng.device.prefix_ops[1:] == [("save", 160, 20), ("load", 0, 20, 20)]
    assert eng.device.prefills[-1] == ((7, 8), 20) and eng.stats.cached_tokens == 20
    assert eng.prefix.stats.restored == 1 and eng.prefix.stats.stored == 2
    list(eng.generate(a + [7, 8, 9], 3))      # the held prefix serves: nothing copied
    assert len(eng.device.prefix_ops) == 3 and eng.stats.cached_tokens == 22


def test_the_least_recently_used_prefix_leaves_a_full_store(latch):
    eng = stored_engine(latch, prompt_cache_bytes=8 * 30)
    a, b, c = list(range(1, 21)), list(range(30, 50)), list(range(50, 60))
    for prompt in (a, b, c):
        list(eng.generate(prompt, 2))
    assert eng.prefix.stats.evicted == 1 and [e.tokens for e in eng.prefix.stored] == [tuple(b)]
    list(eng.generate(a + [1], 2))
    assert eng.stats.cached_tokens == 0       # a was evicted
    list(eng.generate(b + [1], 2))
    assert eng.stats.cached_tokens == 20 and eng.prefix.restored


def test_a_prefix_the_next_prompt_extends_is_not_saved(latch):
    eng = stored_engine(latch)
    list(eng.generate([1, 2, 3, 4], 2))
    list(eng.generate([1, 2, 3, 4, 5, 6], 2))
    assert eng.device.prefix_ops == []


def test_clearing_forgets_the_stored_prefixes_too(latch):
    eng = stored_engine(latch)
    list(eng.generate(list(range(1, 21)), 2))
    list(eng.generate(list(range(30, 50)), 2))
    eng.prefix.clear()
    list(eng.generate(list(range(1, 22)), 2))
    assert eng.stats.cached_tokens == 0 and eng.prefix.stored == []


@pytest.mark.parametrize("bad", [-1, 1.5, "1G"])
def test_a_bad_store_size_is_one_line(latch, bad):
    with pytest.raises(InvalidArgumentError, match="prompt_cache_bytes"):
        stored_engine(latch, prompt_cache_bytes=bad)


def test_reference_alternating_conversations_with_the_store_give_a_cold_runs_tokens(latch):
    model = _model("stories15M")
    rng = np.random.default_rng(5)
    warm = Engine(NumpyDevice(ReferenceModel(model)), "numpy", EngineSettings(prompt_cache_bytes=1 << 24), environ={},
                  latch=latch)
    cold = Engine(NumpyDevice(ReferenceModel(model)), "numpy", EngineSettings(prefix_cache=False), environ={},
                  latch=latch)
    histories = [[int(t) for t in rng.integers(0, model.config.vocab, 70)] for _ in range(2)]
    for turn in range(3):
        for k in range(2):
            answer = list(warm.generate(histories[k], 5))
            assert answer == list(cold.generate(histories[k], 5)), (turn, k)
            assert (warm.stats.cached_tokens > 0) == (turn > 0)
            n = len(histories[k])
            assert np.array_equal(warm.device.ref.k_cache[:, :, :n], cold.device.ref.k_cache[:, :, :n])
            histories[k] = histories[k] + answer + [int(t) for t in rng.integers(0, model.config.vocab, 4)]
    assert warm.prefix.stats.restored >= 4
