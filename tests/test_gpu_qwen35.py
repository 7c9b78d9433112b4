"""GPU tier: Qwen3.5's hybrids on libarc (marker `gpu`): gated DeltaNet layers beside gated
attention (arcpy/model/hybrid.py; libarc/model/deltanet.cu).

- The decode forward against the NumPy reference at positions up to 300 (dense, MoE, quantized).
- The state's slots: a step run again at its position gives the same logits, and the step after
  it the logits of a run that took the position once.
- The prefill against the reference's prefill; in one chunk or in chunks of 7, the same logits bit
  for bit, and so are the decode steps after it.
- The verify rows against the decode forward as bits; the speculative loop's tokens and the host
  path's against the plain device loop's.
"""

import numpy as np
import pytest
from gpu_buffers import gpu_logits, host_logits, kv_cache_rows
from test_gpu_speculation import assert_verify_rows_are_decode_logits

from arcpy import _lib
from arcpy.bench.speculate import repeating_prompt
from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.reference import ReferenceModel
from arcpy.loop.engine import DEVICE_LOOP, Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.loop.speculate import StepCost
from arcpy.model import synthetic_model
from arcpy.model.bf16 import bf16_to_f32

pytestmark = pytest.mark.gpu
MAX_SEQ = 512
CHECK = (0, 1, 2, 9, 10, 57, 300)
SHAPES = ["qwen3.5-tiny", "qwen3.5moe-tiny", "qwen3.5-tiny-quant"]


# bf16 weights: the forward's float32 sums; quantized: the GEMVs' int8 input as well
# (tests/test_gpu_quant_model.py's bound).
def tolerance(model, bf16: float) -> float:
    return 8e-2 if model.quantized else bf16


@pytest.fixture(scope="module", params=SHAPES)
def pair(request):
    model = synthetic_model(request.param, seed=5, max_seq=MAX_SEQ)
    dev = open_cuda_device(model, max_seq=MAX_SEQ, speculate=0)
    yield model, dev
    dev.close()


def rel_error(got, want):
    assert np.all(np.isfinite(got)), "non-finite logits"
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(1.0, float(np.max(np.abs(want)))))


def tokens_for(model, n, seed=11):
    return np.random.default_rng(seed).integers(0, model.config.vocab, size=n).tolist()


def test_decode_matches_the_reference(pair):
    model, dev = pair
    ref = ReferenceModel(model, max_seq=MAX_SEQ)
    errors = {}
    for pos, tok in enumerate(tokens_for(model, max(CHECK) + 1)):
        want = ref.forward(int(tok), pos, logits=pos in CHECK)
        if pos in CHECK:
            errors[pos] = rel_error(gpu_logits(dev, int(tok), pos), want)
        else:
            dev.set_input(int(tok), pos)
            dev.enqueue_forward()
    print(f"{model.name}: max relative logit error by position {errors}")
    assert all(e <= tolerance(model, 2e-2) for e in errors.values()), errors


def test_a_step_run_again_at_its_position_changes_nothing(pair):
    model, dev = pair
    toks = tokens_for(model, 24, seed=3)
    once = [gpu_logits(dev, t, p) for p, t in enumerate(toks)]
    again = []
    for p, t in enumerate(toks):
        again.append(gpu_logits(dev, t, p))
        if p in (0, 5, 17):  # a burst's steps after its sequence ended run the last position again
            dev.set_input(t, p)
            dev.enqueue_forward()
            dev.set_input(t, p)
            dev.enqueue_forward()
    for p, (a, b) in enumerate(zip(once, again)):
        assert np.array_equal(a, b), f"position {p}: a repeated step changed the state"


def prefill_logits(dev, tokens, chunk):
    _lib.check(dev.lib.arc_model_prefill_reserve(dev.forward.ptr, chunk))
    dev.enqueue_prefill(tokens, 0)
    return host_logits(dev)


def test_prefill_matches_the_reference_and_its_chunks_give_the_same_bits(pair):
    model, dev = pair
    toks = tokens_for(model, 40, seed=8)
    ref = ReferenceModel(model, max_seq=MAX_SEQ)
    want = ref.prefill(toks)
    whole = prefill_logits(dev, toks, 64)
    after_whole = [gpu_logits(dev, t, 40 + i) for i, t in enumerate((5, 6, 7))]
    err = rel_error(whole, want)
    print(f"{model.name}: prefill of 40 against the reference: {err:.3g}")
    assert err <= tolerance(model, 3e-2)
    chunked = prefill_logits(dev, toks, 7)
    after_chunked = [gpu_logits(dev, t, 40 + i) for i, t in enumerate((5, 6, 7))]
    assert np.array_equal(whole, chunked), "the prefill's logits depend on its chunks"
    for i, (a, b) in enumerate(zip(after_whole, after_chunked)):
        assert np.array_equal(a, b), f"decode step {i} after the prefill depends on the prefill's chunks"
    for i, t in enumerate((5, 6, 7)):  # the state the prefill left is the reference's
        step = ref.forward(t, 40 + i)
        assert rel_error(after_whole[i], step) <= tolerance(model, 3e-2)


def engine(dev, *, loop=True, speculate=False, always=False, burst=8):
    cost = StepCost(measure=False, prior=0.0) if always else None
    return Engine(dev, "cuda", EngineSettings(device_loop=loop, burst=burst, speculate=speculate), environ={},
                  latch=FallbackLatch(), step_cost=cost)


def test_the_device_loop_gives_the_host_paths_tokens(pair):
    model, dev = pair
    prompt = tokens_for(model, 20, seed=4)
    want = list(engine(dev, loop=False).generate(prompt, 48))
    eng = engine(dev)
    got = list(eng.generate(prompt, 48))
    assert got == want and eng.stats.path == DEVICE_LOOP
    again = engine(dev)
    assert list(again.generate(prompt, 48)) == want  # a second request starts its state afresh


@pytest.fixture(scope="module", params=["qwen3.5-tiny", "qwen3.5-tiny-quant"])
def spec_device(request):
    dev = open_cuda_device(synthetic_model(request.param, seed=3, max_seq=MAX_SEQ), max_seq=MAX_SEQ, speculate=7)
    yield dev
    dev.close()


def test_verify_rows_are_the_decode_forwards_logits(spec_device):
    assert_verify_rows_are_decode_logits(spec_device, repeating_prompt(spec_device.vocab))


@pytest.mark.parametrize("burst", [1, 8])
def test_the_speculative_loop_gives_the_plain_loops_tokens(spec_device, burst):
    prompt = repeating_prompt(spec_device.vocab)
    want = list(engine(spec_device, burst=burst).generate(prompt, 160))
    spec = engine(spec_device, speculate=True, always=True, burst=burst)
    assert list(spec.generate(prompt, 160)) == want
    assert spec.stats.spec_steps > 0


def test_only_the_attention_layers_keep_kv_rows(pair):
    model, dev = pair
    cfg = model.config
    _, kv, _ = dev.forward.memory()
    assert kv == 2 * cfg.kv_layers * cfg.n_kv_heads * MAX_SEQ * cfg.head_dim * 2 and cfg.kv_layers < cfg.n_layers
    # The prefill writes the attention layers' rows where arc_model_kv_cache says they lie: each
    # layer's k rows within a bf16 prefill's error of the reference's (another layer's rows would
    # be off by their whole size).
    toks = tokens_for(model, 9, seed=2)
    prefill_logits(dev, toks, 64)
    ref = ReferenceModel(model, max_seq=MAX_SEQ)
    ref.prefill(toks, bf16_products=True)
    k_rows = bf16_to_f32(kv_cache_rows(dev, 9)[0]).astype(np.float64)  # (attention layers, kv heads, 9, head_dim)
    want = np.stack([ref.k_cache[layer, :, :9] for layer in range(cfg.n_layers) if not cfg.is_linear_layer(layer)])
    errors = [float(np.linalg.norm(g - w) / np.linalg.norm(w)) for g, w in zip(k_rows, want)]
    print(f"{model.name}: k rows of the attention layers, relative error {errors}")
    assert max(errors) <= tolerance(model, 1e-2)
