"""GPU tier: Gemma 4 on libarc (marker `gpu`). libarc runs its dense layer: global layers with heads
of their own width and kv heads (k = v, proportional RoPE over a quarter of each head), v norms,
unscaled scores, layer scalars and the logits' soft cap (arcpy/model/gemma4.py). On gemma4-dense-tiny
(global heads of 64 over one kv head) and gemma4-wide-test (global heads of 512, libarc's widest,
eight query heads over one kv head), against the NumPy reference: the decode step at positions past
the windows, the replayed graph, greedy steps, the prefill (in one chunk or several), the verify's
rows as the decode's bits, the device loop as the host path; a soft cap small enough to change every
logit; and gemma4-ple-tiny's per-layer embeddings and its last two layers sharing K/V (one of each
kind) with their FFN twice as wide. The experts beside the FFN: tests/test_gpu_gemma4_moe.py."""

import dataclasses

import numpy as np
import pytest
from gpu_buffers import gpu_logits, host_logits
import test_gpu_forward
from test_gpu_moe import device_tokens, prefill, rel_error
from test_gpu_speculation import K, assert_verify_rows_are_decode_logits

from arcpy import open_engine
from arcpy.bench.speculate import repeating_prompt
from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.reference import ReferenceModel
from arcpy.errors import InvalidArgumentError
from arcpy.loop.engine import DEVICE_LOOP, HOST, Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.model import Model, gemma4, synthetic_model
from arcpy.model.gemma4 import cuda_refusal
from arcpy.sampling import Sampling

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def layer_checked():
    """These are the tests arcpy.model.gemma4.CUDA_LAYER_CHECKED waits for: they run the layer
    (module-scoped, so that it holds before the devices the module opens)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gemma4, "CUDA_LAYER_CHECKED", True)
        yield

SHAPES = ["gemma4-dense-tiny", "gemma4-wide-test", "gemma4-ple-tiny"]
MAX_SEQ = 2048
CHECK_POSITIONS = (0, 1, 100, 1500)  # past the windows of 16, several tiles of 64 into the global layers


def capped(model, cap: float):
    """`model` with its logits capped at `cap` instead of its config's."""
    return Model(dataclasses.replace(model.config, final_softcap=cap), model.tensors, model.name, model.source)


@pytest.fixture(scope="module", params=SHAPES)
def pair(request):
    model = synthetic_model(request.param, seed=7)
    dev = open_cuda_device(model, max_seq=MAX_SEQ)
    yield model, dev
    dev.close()


@pytest.mark.parametrize("cap", [None, 2.0], ids=["cap30", "cap2"])
def test_the_decode_matches_the_reference_at_positions_past_the_windows(pair, cap):
    model, dev = pair
    if cap is not None:  # a cap of 2 moves every logit far: a device that skipped it would be far off
        model = capped(model, cap)
        dev = open_cuda_device(model, max_seq=MAX_SEQ)  # its own: the module's device stays open
    try:
        ref = ReferenceModel(model, max_seq=MAX_SEQ)
        tokens = np.random.default_rng(11).integers(0, model.config.vocab, size=max(CHECK_POSITIONS) + 1)
        errors = {}
        for pos, tok in enumerate(tokens):
            want = ref.forward(int(tok), pos, logits=pos in CHECK_POSITIONS)
            if pos in CHECK_POSITIONS:
                got = gpu_logits(dev, int(tok), pos)
                assert np.max(np.abs(got)) <= model.config.final_softcap
                errors[pos] = rel_error(got, want)
            else:
                dev.set_input(int(tok), pos)
                dev.enqueue_forward()
        print(f"{model.name} cap {model.config.final_softcap}: relative logit error by position {errors}")
        assert all(e <= 1e-2 for e in errors.values()), errors
    finally:
        if cap is not None:
            dev.close()


# The forward tests' graph replay (the replayed graph the eager forward's bits) and greedy steps (the
# reference's token wherever its margin exceeds the error), run here on this module's devices.
test_graph_replay_equals_the_eager_forward_bit_for_bit = \
    test_gpu_forward.test_graph_replay_equals_the_eager_forward_bit_for_bit
test_greedy_matches_the_reference_where_the_margin_exceeds_the_error = \
    test_gpu_forward.test_greedy_matches_the_reference_where_the_margin_exceeds_the_error


@pytest.mark.parametrize("n", [1, 40, 300])
def test_the_prefill_matches_the_reference_with_bf16_products(pair, n):
    model, dev = pair
    tokens = np.random.default_rng(n).integers(0, model.config.vocab, size=n).astype(np.int32)
    want = ReferenceModel(model, max_seq=MAX_SEQ).prefill([int(t) for t in tokens], bf16_products=True)
    with device_tokens(dev, tokens) as d_tokens:
        prefill(dev, d_tokens, n, 0)
        err = rel_error(host_logits(dev), want)
    print(f"{model.name}: prefill of {n} rows, relative logit error {err:.3g}")
    assert err <= 2e-2


def test_the_prefill_in_chunks_gives_the_same_logits_as_at_once(pair):
    model, dev = pair
    tokens = np.random.default_rng(2).integers(0, model.config.vocab, size=150).astype(np.int32)
    with device_tokens(dev, tokens) as d_tokens:
        prefill(dev, d_tokens, 150, 0)
        whole = host_logits(dev).copy()
        prefill(dev, d_tokens, 67, 0)
        prefill(dev, d_tokens + 67, 83, 67)
        assert np.array_equal(host_logits(dev).view(np.uint32), whole.view(np.uint32))


@pytest.mark.parametrize("sampling", [None, Sampling(0.7, top_p=0.9, seed=3)], ids=["greedy", "sampled"])
def test_the_device_loop_and_the_host_path_give_the_same_tokens(pair, sampling):
    _, dev = pair
    prompt = [1, 17, 42, 99, 5]
    host = Engine(dev, "cuda", EngineSettings(device_loop=False), environ={}, latch=FallbackLatch())
    want = list(host.generate(prompt, 64, sampling=sampling))
    loop = Engine(dev, "cuda", EngineSettings(device_loop=True, burst=8), environ={}, latch=FallbackLatch())
    got = list(loop.generate(prompt, 64, sampling=sampling))
    assert host.stats.path == HOST and loop.stats.path == DEVICE_LOOP
    assert got == want and loop.stats.host_waits == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_verify_rows_are_the_decode_forwards_logits(shape):
    dev = open_cuda_device(synthetic_model(shape, seed=3), max_seq=512, speculate=K)
    try:
        assert_verify_rows_are_decode_logits(dev, repeating_prompt(dev.vocab))
    finally:
        dev.close()


def test_unchecked_the_layer_is_refused_in_one_line_and_the_numpy_backend_runs_it(monkeypatch):
    model = synthetic_model("gemma4-tiny", max_seq=64)
    monkeypatch.setattr(gemma4, "CUDA_LAYER_CHECKED", False)
    with pytest.raises(InvalidArgumentError) as e:
        open_engine(model, "auto")
    assert str(e.value) == cuda_refusal(model.config) and "--backend numpy" in str(e.value)
    with open_engine(model, "numpy") as engine:
        assert len(list(engine.generate([1, 2, 3], max_new_tokens=4))) == 4
    monkeypatch.setattr(gemma4, "CUDA_LAYER_CHECKED", True)
    with open_cuda_device(model, use_graph=False) as dev:  # every form at once: experts, per-layer inputs, shared K/V
        assert dev is not None
