"""GPU tier: prefix reuse on a real-shaped preset (marker `gpu`), its KV cache in bf16 and in q8_0
(arc_model.h's arc_kv_form). A turn that extends the last reuses every row the last prefill wrote
that it shares (granule 1: a prefill row does not depend on its chunk, tests/test_gpu_prefill_rows.py),
and its KV rows, logits and tokens are a cold run's bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gpu_buffers import kv_planes

from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.kv_formats import kv_position_bytes
from arcpy.loop import gate
from arcpy.loop.engine import Engine
from arcpy.loop.settings import EngineSettings
from arcpy.model import SHAPES, random_model
from arcpy.model.hybrid import STATE_SLOTS
from arcpy.sampling import Sampling

pytestmark = pytest.mark.gpu

MAX_SEQ = 6144
CONFIG = dataclasses.replace(SHAPES["smollm2-135M"], max_seq=MAX_SEQ)


@pytest.fixture(scope="module", params=["bf16", "q8_0"])
def engine(request):
    model = random_model(CONFIG, seed=7)
    device = open_cuda_device(model, MAX_SEQ, kv_cache=request.param)
    with Engine(device, "cuda", EngineSettings(device_loop=True), environ={}, latch=gate.FallbackLatch()) as eng:
        eng.kv_cache = request.param
        yield eng


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, top_p=0.95, seed=5)])
def test_gpu_second_turn_reuses_the_last_prompts_rows_and_equals_a_cold_run(engine, sampling):
    assert engine.device.prefix_granule == 1
    second_turn_equals_a_cold_run(engine, sampling)


def second_turn_equals_a_cold_run(engine, sampling) -> None:
    """A turn of 2,600 tokens (more than a prefill chunk), then one that extends it: the second
    reuses every row of the first's prompt, and its tokens and KV rows are a cold run's."""
    engine.prefix.clear()  # what earlier tests left would share more than `first`
    rng = np.random.default_rng(3)
    vocab = engine.device.vocab
    first = [int(t) for t in rng.integers(0, vocab, 2600)]
    answer = list(engine.generate(first, 24, sampling=sampling))
    second = first + answer + [int(t) for t in rng.integers(0, vocab, 300)]
    warm = list(engine.generate(second, 48, sampling=sampling))
    assert engine.stats.cached_tokens == len(first) and engine.stats.path == "device-loop"
    warm_rows = kv_planes(engine.device, len(second))
    engine.prefix.clear()
    cold = list(engine.generate(second, 48, sampling=sampling))
    assert engine.stats.cached_tokens == 0
    assert warm == cold
    equal_rows(engine, len(second), warm_rows)


def equal_rows(engine, n: int, warm_rows) -> None:
    """The device's KV rows 0..n-1 now are `warm_rows`, bit for bit, in every plane of the cache."""
    for w, c in zip(warm_rows, kv_planes(engine.device, n), strict=True):
        assert np.array_equal(w, c), f"{np.count_nonzero(w != c)} of {w.size} cache bytes differ"


@pytest.mark.parametrize("n", [1, 37, 500])
def test_gpu_a_prompt_shorter_than_a_chunk_reuses_its_shared_rows(engine, n):
    rng = np.random.default_rng(4 + n)
    prompt = [int(t) for t in rng.integers(0, engine.device.vocab, n)]
    list(engine.generate(prompt, 4))
    longer = prompt + [1, 2, 3]
    warm = list(engine.generate(longer, 16))
    assert engine.stats.cached_tokens == n
    engine.prefix.clear()
    assert list(engine.generate(longer, 16)) == warm and engine.stats.cached_tokens == 0


def test_gpu_the_store_gives_alternating_conversations_their_rows_back(engine):
    assert engine.prefix.capacity > 0
    assert engine.prefix.row_bytes == kv_position_bytes(engine.kv_cache, CONFIG.n_layers, CONFIG.n_kv_heads, 64)
    rng = np.random.default_rng(9)
    vocab = engine.device.vocab
    engine.prefix.clear()
    a = [int(t) for t in rng.integers(0, vocab, 2300)]
    b = [int(t) for t in rng.integers(0, vocab, 2200)]
    list(engine.generate(a, 8))
    list(engine.generate(b, 8))
    a2 = a + [int(t) for t in rng.integers(0, vocab, 50)]
    warm = list(engine.generate(a2, 32))
    assert engine.stats.cached_tokens == len(a) and engine.prefix.restored
    warm_rows = kv_planes(engine.device, len(a2))
    engine.prefix.clear()
    cold = list(engine.generate(a2, 32))
    assert engine.stats.cached_tokens == 0 and warm == cold
    equal_rows(engine, len(a2), warm_rows)


def test_gpu_a_stored_prefix_restored_in_part_is_a_cold_runs(engine):
    """Saved with 2,300 positions, brought back for 1,000 of them: each layer and head's rows come
    from the run they were saved in."""
    rng = np.random.default_rng(10)
    vocab = engine.device.vocab
    engine.prefix.clear()
    a = [int(t) for t in rng.integers(0, vocab, 2300)]
    b = [int(t) for t in rng.integers(0, vocab, 40)]
    c = a[:1000] + [int(t) for t in rng.integers(0, vocab, 30)]
    list(engine.generate(a, 4))
    list(engine.generate(b, 4))  # a's rows are saved
    warm = list(engine.generate(c, 32))
    assert engine.stats.cached_tokens == 1000 and engine.prefix.restored
    warm_rows = kv_planes(engine.device, len(c))
    engine.prefix.clear()
    assert list(engine.generate(c, 32)) == warm and engine.stats.cached_tokens == 0
    equal_rows(engine, len(c), warm_rows)


# -- a hybrid: the DeltaNet layers' states come back with the rows --------------------------------

HYBRID = dataclasses.replace(SHAPES["qwen3.5-tiny"], max_seq=MAX_SEQ)


@pytest.fixture(scope="module")
def hybrid():
    device = open_cuda_device(random_model(HYBRID, seed=8), MAX_SEQ)
    with Engine(device, "cuda", EngineSettings(device_loop=True), environ={}, latch=gate.FallbackLatch()) as eng:
        yield eng


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, top_p=0.95, seed=5)])
def test_gpu_a_hybrids_second_turn_resumes_from_the_state_the_first_left(hybrid, sampling):
    """The rows after the reused prefix pass through every DeltaNet layer: equal to a cold run's
    bit for bit only where the restored states are the cold prefill's."""
    assert hybrid.device.capabilities.prefix_state_bytes > 0 and hybrid.prefix.state_bytes > 0
    assert hybrid.device.forward.state[2] == STATE_SLOTS  # arc_model_state's slots, which check_fits counts
    second_turn_equals_a_cold_run(hybrid, sampling)


def test_gpu_a_hybrids_stored_prefix_comes_back_with_its_state(hybrid):
    rng = np.random.default_rng(9)
    vocab = hybrid.device.vocab
    hybrid.prefix.clear()
    a = [int(t) for t in rng.integers(0, vocab, 2300)]
    b = [int(t) for t in rng.integers(0, vocab, 700)]
    list(hybrid.generate(a, 8))
    list(hybrid.generate(b, 8))  # a's rows and states go to the store
    a2 = a + [int(t) for t in rng.integers(0, vocab, 50)]
    warm = list(hybrid.generate(a2, 32))
    assert hybrid.stats.cached_tokens == len(a) and hybrid.prefix.restored
    warm_rows = kv_planes(hybrid.device, len(a2))
    hybrid.prefix.clear()
    assert list(hybrid.generate(a2, 32)) == warm and hybrid.stats.cached_tokens == 0
    equal_rows(hybrid, len(a2), warm_rows)
