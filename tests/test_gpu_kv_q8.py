"""GPU tier: the KV cache in q8_0 form (arc_model.h's arc_kv_form; `--kv-cache q8_0`), marker `gpu`.

Against the NumPy reference holding its cache in the same form (arcpy/devices/kv_formats.py): the
decode's logits at positions 0 to 2,000 (many tiles of 64 positions, several blocks a kv head,
windows shorter than the context, head_dim 32 to 256, gpt-oss's sinks), the rows the cache holds
(each within a step and a half of its block's scale of the reference's), and the prefill's logits
(its rows widened to bf16). On the device alone: the graph's replay equals the eager forward bit for bit, the verify's
rows equal the decode's as bits (so speculation stays exact), and the speculative and the host
loops give the plain device loop's tokens. (tests/test_gpu_prefix_cache.py runs its reuse and its
store with a q8_0 cache too.)
"""

import numpy as np
import pytest
from gpu_buffers import gpu_logits, host_logits, kv_planes
from test_gpu_speculation import K, assert_verify_rows_are_decode_logits

from arcpy.bench.speculate import repeating_prompt
from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.kv_formats import round_q8_0
from arcpy.devices.reference import ReferenceModel
from arcpy.devices.reference_ops import round_bf16
from arcpy.loop import gate
from arcpy.loop.engine import DEVICE_LOOP, Engine
from arcpy.loop.settings import EngineSettings
from arcpy.model import synthetic_model
from arcpy.sampling import Sampling

pytestmark = pytest.mark.gpu

SHAPES_Q8 = ["gqa", "qwen3-tiny", "gemma3-tiny", "gpt-oss-test"]  # head_dim 64, 64, 256 (windows of 32), 32 (sinks)
CHECK_POSITIONS = (0, 1, 100, 2000)
MAX_SEQ = 2048


@pytest.fixture(scope="module", params=SHAPES_Q8)
def pair(request):
    model = synthetic_model(request.param, seed=7, max_seq=4096)
    dev = open_cuda_device(model, max_seq=MAX_SEQ, kv_cache="q8_0")
    yield model, dev
    dev.close()


def rel_error(got, want):
    assert np.all(np.isfinite(got)), "non-finite logits"
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(1.0, float(np.max(np.abs(want)))))


def q8_rows(dev, n):
    """The device's k and v rows 0..n-1 as they read back: (attention layers, kv heads, n, head_dim)
    float32 each, from the planes of arc_model_kv_planes (codes of k, of v, scales of k, of v)."""
    planes = kv_planes(dev, n)
    assert len(planes) == 4, "a q8_0 cache has four planes"
    blocks, heads, _, hd = dev.forward.kv_shape
    out = []
    for codes, scales in ((planes[0], planes[2]), (planes[1], planes[3])):
        c = codes.view(np.int8).reshape(blocks // 2, heads, n, hd).astype(np.float32)
        d = scales.view(np.float16).reshape(blocks // 2, heads, n, hd // 32).astype(np.float32)
        out.append(c * np.repeat(d, 32, axis=-1))
    return out


def test_q8_0_decode_matches_the_q8_0_reference_and_holds_its_rows(pair):
    model, dev = pair
    ref = ReferenceModel(model, max_seq=MAX_SEQ, kv_cache="q8_0")
    tokens = np.random.default_rng(11).integers(0, model.config.vocab, size=max(CHECK_POSITIONS) + 1)
    errors = {}
    for pos, tok in enumerate(tokens):
        want = ref.forward(int(tok), pos, logits=pos in CHECK_POSITIONS)
        if pos in CHECK_POSITIONS:
            errors[pos] = rel_error(gpu_logits(dev, int(tok), pos), want)
        else:
            dev.set_input(int(tok), pos)
            dev.enqueue_forward()
    print(f"{model.name} q8_0: max relative logit error by position {errors}")
    assert all(e <= 1e-2 for e in errors.values()), errors
    # Each row the cache holds: within a step and a half of its block's scale of the reference's (a
    # code apart where the float32 rows before them straddle a rounding boundary). A mixture's rows
    # may move further where a routing choice is a near-tie (a thousandth of them at most).
    n = len(tokens)
    for name, got, want in zip("kv", q8_rows(dev, n), (ref.k_cache[:, :, :n], ref.v_cache[:, :, :n])):
        step = np.repeat(np.abs(want).reshape(*want.shape[:-1], -1, 32).max(axis=-1) / 127, 32, axis=-1)
        off = np.abs(got - want) / np.maximum(step, 1e-30)
        far = float(np.mean(off > 1.5))
        print(f"{model.name} q8_0 {name}: rows within {off.max():.3f} of a step, "
              f"{np.mean(off > 0.5):.2%} a code apart, {far:.3%} further")
        assert far <= (1e-3 if model.config.n_experts else 0.0), f"{name}: {far:.3%} of the values differ by more"


def test_q8_0_graph_replay_equals_the_eager_forward_bit_for_bit(pair):
    model, dev = pair
    for pos in (0, 1, 37, 511, 1500):
        tok = (pos * 7919 + 13) % model.config.vocab
        replayed = gpu_logits(dev, tok, pos)
        eager = gpu_logits(dev, tok, pos, eager=True)
        assert np.array_equal(replayed, eager), f"position {pos}: graph and eager differ"


def test_q8_0_prefill_matches_the_reference(pair):
    """The prefill attends over the q8_0 rows widened to bf16: it may differ from the reference by
    twice what that widening moves the reference itself, and the bf16 level."""
    model, dev = pair
    ref = ReferenceModel(model, max_seq=MAX_SEQ, kv_cache="q8_0")
    prompt = np.random.default_rng(5).integers(0, model.config.vocab, size=2047).tolist()
    want = ref.prefill(prompt)
    wide = ReferenceModel(model, max_seq=MAX_SEQ, kv_cache="q8_0")
    wide.kv_round = lambda x: round_bf16(round_q8_0(x))
    drift = rel_error(wide.prefill(prompt), want)
    dev.enqueue_prefill(prompt, 0)
    err = rel_error(host_logits(dev), want)
    print(f"{model.name} q8_0: prefill of {len(prompt)} tokens, max relative logit error {err:.3g} "
          f"(the widening moves the reference {drift:.3g})")
    assert err <= 2 * drift + 1e-2
    # The decode after the prefill reads the rows the prefill wrote.
    nxt = int(np.argmax(want))
    err = rel_error(gpu_logits(dev, nxt, len(prompt)), ref.forward(nxt, len(prompt)))
    assert err <= 2 * drift + 1e-2, f"the decode after the prefill: {err:.3g}"


@pytest.fixture(scope="module")
def spec_device():
    dev = open_cuda_device(synthetic_model("qwen3-tiny", seed=3), max_seq=512, speculate=K, kv_cache="q8_0")
    yield dev
    dev.close()


def test_q8_0_verify_rows_are_the_decode_forwards_logits(spec_device):
    assert_verify_rows_are_decode_logits(spec_device, repeating_prompt(spec_device.vocab))


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.7, seed=2)], ids=["greedy", "t0.7"])
def test_q8_0_speculative_and_host_loops_give_the_plain_loops_tokens(spec_device, sampling):
    prompt = repeating_prompt(spec_device.vocab)

    def run(**settings):
        eng = Engine(spec_device, "cuda", EngineSettings(**settings), environ={}, latch=gate.FallbackLatch())
        return list(eng.generate(prompt, 120, sampling=sampling)), eng.stats

    want, _ = run(device_loop=True, burst=8, speculate=False)
    spec, st = run(device_loop=True, burst=8, speculate=True)
    host, _ = run(device_loop=False, speculate=False)
    assert spec == want and host == want
    assert st.path == DEVICE_LOOP and st.speculation == "on"
