"""Prefix reuse for a model with a recurrent state (Qwen3.5's DeltaNet layers): the state a
prefill leaves is copied into the prefix store before any step moves it on, a prompt reuses a
prefix only where it extends all of it, with that state copied back, and its tokens are a cold
run's (arcpy/loop/prefix.py)."""

import dataclasses

import numpy as np
import pytest

from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.devices.numpy_device import PREFILL_CHUNK, NumpyDevice
from arcpy.devices.reference import ReferenceModel
from arcpy.loop.engine import Engine
from arcpy.loop.settings import EngineSettings
from arcpy.model import SHAPES, random_model
from arcpy.sampling import Sampling

ROW, STATE = 8, 32  # the fake's bytes of a position's rows and of the state


def stateful(latch, **kw):
    script = FakeScript(prefix_row_bytes=ROW, prefix_state_bytes=STATE)
    return Engine(FakeDevice(script), "fake", EngineSettings(device_loop=True, **kw), environ={}, latch=latch)


def test_each_prefill_keeps_its_state_and_a_prompt_that_extends_it_resumes_there(latch):
    eng = stateful(latch)
    first = list(range(1, 21))
    answer = list(eng.generate(first, 5))
    assert eng.device.prefix_ops == [("save_state", 0, 20)]
    second = first + answer + [7, 8, 9]
    list(eng.generate(second, 4))
    assert eng.device.prefix_ops[1:] == [("load_state", 0, 20), ("save_state", 0, len(second))]
    assert eng.device.prefills[-1] == (tuple(second[20:]), 20) and eng.stats.cached_tokens == 20


@pytest.mark.parametrize("second", [list(range(1, 11)) + [59, 58], list(range(1, 21))],
                         ids=["part of it", "the same prompt"])
def test_a_prompt_that_does_not_extend_the_whole_prefix_is_prefilled_whole(latch, second):
    """The state is kept at the prefix's end only: sharing part of it, or all of it but as the
    prompt's last token (which is always prefilled again), reuses nothing."""
    eng = stateful(latch)
    list(eng.generate(list(range(1, 21)), 2))
    list(eng.generate(second, 2))
    assert eng.stats.cached_tokens == 0 and eng.device.prefills[-1] == (tuple(second), 0)
    assert not any(op[0].startswith("load") for op in eng.device.prefix_ops)


def test_a_stored_prefix_comes_back_with_its_state(latch):
    eng = stateful(latch)
    a, b = list(range(1, 21)), list(range(30, 50))
    list(eng.generate(a, 2))
    list(eng.generate(b, 2))  # a's rows and its state go to the store, behind the held state's bytes
    entry = 20 * ROW + STATE  # a stored prefix: its rows, then its state
    assert eng.device.prefix_ops == [("save_state", 0, 20), ("save", STATE, 20), ("move", STATE + 20 * ROW, 0, STATE),
                                     ("save_state", 0, 20)]
    list(eng.generate(a + [7], 2))  # b stored the same way; a's rows and state copied back
    assert eng.device.prefix_ops[4:] == [("save", STATE + entry, 20), ("move", STATE + entry + 20 * ROW, 0, STATE),
                                         ("load", STATE, 20, 20), ("load_state", STATE + 20 * ROW, 20),
                                         ("save_state", 0, 21)]
    assert eng.stats.cached_tokens == 20 and eng.prefix.restored


def test_a_longer_stored_prefix_does_not_stand_for_a_shorter_ones_state(latch):
    eng = stateful(latch)
    a = list(range(1, 21))
    list(eng.generate(a + [5, 6], 2))
    list(eng.generate([40, 41], 2))   # a + [5, 6] stored
    list(eng.generate(a, 2))          # a prefilled whole, then held
    list(eng.generate([42, 43], 2))   # a is stored too: the longer entry holds no state at 20
    assert [e.tokens for e in eng.prefix.stored] == [tuple(a + [5, 6]), (40, 41), tuple(a)]
    list(eng.generate(a + [9], 2))
    assert eng.stats.cached_tokens == 20 and eng.device.prefix_ops[-2][0] == "load_state"


def test_without_a_store_a_stateful_model_reuses_nothing(latch):
    eng = stateful(latch, prompt_cache_bytes=0)
    first = list(range(1, 21))
    list(eng.generate(first, 2))
    list(eng.generate(first + [3, 4, 5], 2))
    assert eng.stats.cached_tokens == 0 and eng.device.prefix_ops == []


# -- the NumPy reference's hybrid ---------------------------------------------------------------

def _hybrid():
    return random_model(dataclasses.replace(SHAPES["qwen3.5-tiny"], max_seq=256), seed=3)


def _same_states(a, b):
    for x, y in zip(a.device.ref.deltanet_state.values(), b.device.ref.deltanet_state.values()):
        assert np.array_equal(x.s, y.s) and np.array_equal(x.conv, y.conv) and x.position == y.position


def _cold(model, latch):
    return Engine(NumpyDevice(ReferenceModel(model)), "numpy", EngineSettings(prefix_cache=False), environ={},
                  latch=latch)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.9, top_k=40, top_p=0.95, seed=11)])
def test_reference_turns_of_a_hybrid_with_the_cache_give_a_cold_runs_tokens(latch, sampling):
    """Each turn resumes at the last whole chunk of the turn before (its state kept there), and
    gives the tokens, the KV rows and the states of a cold run."""
    model = _hybrid()
    rng = np.random.default_rng(2)
    warm = Engine(NumpyDevice(ReferenceModel(model)), "numpy", environ={}, latch=latch)
    assert warm.prefix.capacity == warm.device.prefix_state_bytes  # the default store: the held state
    history = [int(t) for t in rng.integers(0, model.config.vocab, 120)]
    for turn in range(3):
        answer = list(warm.generate(history, 6, sampling=sampling))
        cold = _cold(model, latch)
        assert answer == list(cold.generate(history, 6, sampling=sampling)), turn
        want = 0 if turn == 0 else (len(history) - 11) // PREFILL_CHUNK * PREFILL_CHUNK
        assert warm.stats.cached_tokens == want, turn
        n = len(history)
        assert np.array_equal(warm.device.ref.k_cache[:, :, :n], cold.device.ref.k_cache[:, :, :n])
        _same_states(warm, cold)
        history = history + answer + [int(t) for t in rng.integers(0, model.config.vocab, 5)]


def test_reference_alternating_conversations_of_a_hybrid_get_their_states_back_from_the_store(latch):
    model = _hybrid()
    rng = np.random.default_rng(5)
    warm = Engine(NumpyDevice(ReferenceModel(model)), "numpy", EngineSettings(prompt_cache_bytes=1 << 24), environ={},
                  latch=latch)
    cold = _cold(model, latch)
    histories = [[int(t) for t in rng.integers(0, model.config.vocab, 70)] for _ in range(2)]
    for turn in range(3):
        for k in range(2):
            answer = list(warm.generate(histories[k], 5))
            assert answer == list(cold.generate(histories[k], 5)), (turn, k)
            assert warm.stats.cached_tokens == (PREFILL_CHUNK if turn else 0), (turn, k)
            _same_states(warm, cold)
            histories[k] = histories[k] + answer + [int(t) for t in rng.integers(0, model.config.vocab, 4)]
    assert warm.prefix.stats.restored >= 4


def test_reference_a_scored_prompt_keeps_its_state_for_the_next(latch):
    model = _hybrid()
    rng = np.random.default_rng(7)
    prompt = [int(t) for t in rng.integers(0, model.config.vocab, 80)]
    warm = Engine(NumpyDevice(ReferenceModel(model)), "numpy", environ={}, latch=latch)
    warm.prompt_logprobs(prompt, 0)
    longer = prompt + [3, 4, 5]
    got = list(warm.generate(longer, 5))
    cold = _cold(model, latch)
    assert warm.stats.cached_tokens == PREFILL_CHUNK and got == list(cold.generate(longer, 5))
    _same_states(warm, cold)
