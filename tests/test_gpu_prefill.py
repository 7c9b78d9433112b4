"""GPU tier: the prefill (marker `gpu`). Its tensor-core kernels against NumPy, and the whole
arc_model_prefill against the decode forward fed one token at a time on the same GPU.

Kernel tests draw random inputs, poison every output with NaN bytes first, and compare with a
tolerance that has an absolute and a relative part; NaN never passes.

The prefill rounds each product's inputs to bf16 where the decode keeps float32. On the synthetic
models (peaky attention) that moves the last logits by up to several percent of their scale, the
deeper layers' cache by a few percent: the NumPy reference shows the same drift between its
float32 prefill and its prefill with bf16 products. So the model tests check twice: against the
GPU decode within twice the drift the reference shows for that model and prompt (plus a little),
with the argmax equal wherever the top-two margin is clear of the error; and against the
reference's prefill with bf16 products, within that drift once. Caches are compared per layer by
the relative norm of the difference; rows past the prompt must stay untouched.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from bf16_words import from_bf16, random_bf16, to_bf16
from gpu_buffers import assert_close, f32p, host_logits, kv_cache_pointers, kv_cache_rows, kv_cache_shape, u16p

import arcpy
from arcpy import _lib
from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.reference import ReferenceModel
from arcpy.model import SHAPES, ModelConfig, random_model, synthetic_model

pytestmark = pytest.mark.gpu

F32 = np.float32
EPS32 = float(np.finfo(np.float32).eps)
BF16_STEP = 2.0 ** -8  # a bf16 rounding moves a value by at most this much of itself


# --- the GEMM ----------------------------------------------------------------------------------

def gemm_error_bound(a64, w64, k):
    """float32 sums in another order: a few ulps of sqrt(k) times the sum of |terms|."""
    return 8 * EPS32 * math.sqrt(k) * (np.abs(a64) @ np.abs(w64).T) + 1e-30


# (m, n, k): sizes on and off every tile edge, the prefill's own shapes among them. On an sm_90
# GPU those with half a wave of 128 x 256 tiles or more (gemm.cu) run on gemm_sm90.cu: (520,
# 4096, 512) in its store and accumulate variants, and the larger ones from (1000, 3072, 2048).
GEMM_SHAPES = [(1, 8, 8), (5, 24, 40), (37, 100, 72), (64, 64, 64), (129, 257, 136), (300, 960, 576),
               (520, 4096, 512), (1000, 3072, 2048), (2048, 2048, 2048), (517, 8192, 2048), (77, 2048, 8192)]


@pytest.mark.parametrize("m,n,k", GEMM_SHAPES)
@pytest.mark.parametrize("variant", ["store", "bias", "accumulate", "bias+accumulate"])
def test_gemm_matches_numpy(gpu, m, n, k, variant):
    if m * n * k > 2e9 and variant != "store":
        pytest.skip("the largest shapes run in one variant")
    rng = np.random.default_rng(m * 7 + n * 13 + k + len(variant))
    a = random_bf16(rng, (m, k))
    w = random_bf16(rng, (n, k), 1.0 / math.sqrt(k))
    a64, w64 = from_bf16(a).astype(np.float64), from_bf16(w).astype(np.float64)
    want = a64 @ w64.T
    tol = gemm_error_bound(a64, w64, k)
    d_a, d_w, d_c = gpu.upload(a), gpu.upload(w), gpu.alloc(m * n * 4)
    bias, acc = gpu.ffi.NULL, 0
    if "bias" in variant:
        b = random_bf16(rng, n, 0.5)
        want = want + from_bf16(b)
        bias = u16p(gpu, gpu.upload(b))
    if "accumulate" in variant:
        c0 = rng.standard_normal((m, n), dtype=F32)
        want = want + c0
        tol = tol + 2 * EPS32 * np.abs(c0)
        gpu.put(d_c, c0)
        acc = 1
    else:
        gpu.poison(d_c, m * n * 4)
    _lib.check(gpu.lib.arc_op_gemm_bf16(gpu.ctx, u16p(gpu, d_a), u16p(gpu, d_w), m, n, k, bias, acc,
                                        f32p(gpu, d_c)))
    assert_close(f"gemm {m}x{n}x{k} {variant}", gpu.read(d_c, F32, m * n), want, tol, 0.0)


def silu64(g):
    return g / (1.0 + np.exp(-g))


@pytest.mark.parametrize("m,n,k", [(1, 8, 8), (37, 96, 72), (130, 768, 288), (300, 1536, 576),
                                   (1024, 8192, 2048), (65, 200, 64)])
def test_gemm_swiglu_matches_numpy(gpu, m, n, k):
    rng = np.random.default_rng(m + n + k)
    a = random_bf16(rng, (m, k))
    w = random_bf16(rng, (2 * n, k), 1.0 / math.sqrt(k))
    a64, w64 = from_bf16(a).astype(np.float64), from_bf16(w).astype(np.float64)
    g, u = a64 @ w64[:n].T, a64 @ w64[n:].T
    want = silu64(g) * u
    # the products' float32 error through silu (slope below 1.1) and the product, then the bf16
    # rounding of the result
    eg, eu = gemm_error_bound(a64, w64[:n], k), gemm_error_bound(a64, w64[n:], k)
    tol = 1.1 * eg * np.abs(u) + eu * np.abs(silu64(g)) + eg * eu
    d_a, d_w, d_h = gpu.upload(a), gpu.upload(w), gpu.alloc(m * n * 2)
    gpu.poison(d_h, m * n * 2)
    _lib.check(gpu.lib.arc_op_gemm_swiglu_bf16(gpu.ctx, u16p(gpu, d_a), u16p(gpu, d_w), m, n, k, u16p(gpu, d_h)))
    got = from_bf16(gpu.read(d_h, np.uint16, m * n))
    assert_close(f"gemm_swiglu {m}x{n}x{k}", got, want, tol, BF16_STEP)


# --- the prefill attention ---------------------------------------------------------------------

def np_rope(x, positions, inv_freq):
    """x (T, heads, hd) f32 rotated at positions (T,): rotate-half, angle float32(pos) * inv_freq."""
    half = x.shape[-1] // 2
    ang = positions.astype(F32)[:, None, None] * inv_freq
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1).astype(F32)


def inv_freq_table(hd, theta=10000.0):
    return (theta ** (-2.0 * np.arange(hd // 2, dtype=np.float64) / hd)).astype(F32)


def assert_bf16_rows_agree(what, got, want) -> None:
    """bf16 values: equal, but for single rounding steps (cos and sin may differ in the last ulp)."""
    g, w = from_bf16(got).astype(np.float64), from_bf16(want).astype(np.float64)
    scale = np.abs(w).max(axis=-1, keepdims=True)
    assert np.all(np.abs(g - w) <= 2 * BF16_STEP * scale + 1e-30), f"{what}: differs beyond a rounding step"
    assert np.mean(got == want) > 0.99, f"{what}: only {np.mean(got == want):.4f} identical"


# (head_dim, n_heads, n_kv_heads, n, start, max_seq)
ATTN_CASES = [
    (48, 6, 6, 37, 0, 128),      # stories15M: multi-head, head_dim 48
    (64, 32, 8, 130, 0, 256),    # Llama 3 1B: grouped-query 32/8
    (64, 9, 3, 200, 70, 512),    # SmolLM2: 9/3, a chunk after a first one
    (128, 8, 2, 65, 300, 512),   # Llama 3 8B head_dim, a late short chunk
    (128, 4, 4, 1, 0, 16),       # one token
    (32, 4, 2, 100, 17, 256),    # qwen-tiny head_dim
    (96, 4, 2, 70, 64, 256),     # padded to 128
    (6, 2, 1, 20, 5, 64),        # head_dim not a multiple of 8: 4-byte rows
    # keys past the first segment of 1,024: partials per segment, merged
    (64, 9, 3, 72, 4024, 4200),  # a chat's next turn at a long context
    (128, 8, 2, 300, 900, 2048), # queries on both sides of a segment's end
    (256, 4, 2, 40, 2100, 2200), # Gemma's head_dim
    (128, 4, 4, 1, 3000, 3100),  # one token late
    (6, 2, 1, 20, 1500, 1600),   # 4-byte rows
    # heads past 256 (attention_wide.cu): each query alone over the cache, no partials
    (512, 32, 4, 130, 0, 256),   # Gemma 4's full layers: groups of 8
    (512, 16, 1, 70, 2950, 3100),  # a group of 16, a late chunk
    (384, 8, 2, 65, 1000, 1100),  # queries on both sides of 1,024
    (320, 20, 1, 33, 300, 400),  # a group of 20: blocks of 16 and 4 heads
    (264, 4, 4, 40, 7, 64),      # groups of 1, four queries a block
]


@pytest.mark.parametrize("hd,n_heads,n_kv,n,start,max_seq", ATTN_CASES)
def test_prefill_attention_matches_numpy(gpu, hd, n_heads, n_kv, n, start, max_seq):
    rng = np.random.default_rng(hd * 1000 + n + start)
    rows = (n_heads + 2 * n_kv) * hd
    qkv = rng.standard_normal((n, rows), dtype=F32)
    qkv[:, : n_heads * hd] *= F32(2.0)  # peaky attention, as the synthetic models have
    inv_freq = inv_freq_table(hd)
    positions = start + np.arange(n)
    cache_shape = (n_kv, max_seq, hd)
    # earlier positions hold random rows; this chunk's rows and everything after are poison (NaN)
    k0 = np.full(cache_shape, 0xFFFF, dtype=np.uint16)
    v0 = np.full(cache_shape, 0xFFFF, dtype=np.uint16)
    k0[:, :start] = random_bf16(rng, (n_kv, start, hd))
    v0[:, :start] = random_bf16(rng, (n_kv, start, hd))

    q = np_rope(qkv[:, : n_heads * hd].reshape(n, n_heads, hd), positions, inv_freq)
    k = np_rope(qkv[:, n_heads * hd: (n_heads + n_kv) * hd].reshape(n, n_kv, hd), positions, inv_freq)
    v = qkv[:, (n_heads + n_kv) * hd:].reshape(n, n_kv, hd)
    want_k, want_v = k0.copy(), v0.copy()
    want_k[:, start:start + n] = to_bf16(k).transpose(1, 0, 2)
    want_v[:, start:start + n] = to_bf16(v).transpose(1, 0, 2)
    want_q = to_bf16(q)

    d_qkv, d_inv = gpu.upload(qkv), gpu.upload(inv_freq)
    d_k, d_v = gpu.upload(k0), gpu.upload(v0)
    d_q, d_out = gpu.alloc(n * n_heads * hd * 2), gpu.alloc(n * n_heads * hd * 2)
    gpu.poison(d_q, n * n_heads * hd * 2)
    gpu.poison(d_out, n * n_heads * hd * 2)
    need = gpu.ffi.new("uint64_t *")
    _lib.check(gpu.lib.arc_op_prefill_attention_scratch_bytes(n_heads, hd, n, start, need))
    assert (need[0] > 0) == (start + n > 1024 and hd <= 256)  # heads past 256: each query alone, no partials
    scratch = f32p(gpu, gpu.alloc(need[0])) if need[0] else gpu.ffi.NULL
    _lib.check(gpu.lib.arc_op_prefill_attention(gpu.ctx, f32p(gpu, d_qkv), f32p(gpu, d_inv), u16p(gpu, d_k),
                                                u16p(gpu, d_v), n_heads, n_kv, hd, max_seq, n, start,
                                                u16p(gpu, d_q), scratch, u16p(gpu, d_out)))
    got_k = gpu.read(d_k, np.uint16, k0.size).reshape(cache_shape)
    got_v = gpu.read(d_v, np.uint16, v0.size).reshape(cache_shape)
    got_q = gpu.read(d_q, np.uint16, want_q.size).reshape(want_q.shape)
    got = from_bf16(gpu.read(d_out, np.uint16, n * n_heads * hd)).reshape(n, n_heads, hd)

    assert np.array_equal(got_k[:, :start], k0[:, :start]) and np.array_equal(got_v[:, :start], v0[:, :start]), \
        "earlier cache rows changed"
    assert np.array_equal(got_k[:, start + n:], k0[:, start + n:]) and np.array_equal(
        got_v[:, start + n:], v0[:, start + n:]), "cache rows past the chunk were written"
    assert_bf16_rows_agree("k cache rows", got_k[:, start:start + n], want_k[:, start:start + n])
    assert np.array_equal(got_v[:, start:start + n], want_v[:, start:start + n]), "v cache rows"
    assert_bf16_rows_agree("rotated q", got_q, want_q)

    # attention over what the kernel stored (q as it rounded it), in float64
    qb = from_bf16(got_q).astype(np.float64)
    kc, vc = from_bf16(got_k).astype(np.float64), from_bf16(got_v).astype(np.float64)
    want = np.empty((n, n_heads, hd))
    group = n_heads // n_kv
    for h in range(n_heads):
        kk, vv = kc[h // group, : start + n], vc[h // group, : start + n]
        s = qb[:, h] @ kk.T / math.sqrt(hd)
        s[np.arange(start + n)[None, :] > positions[:, None]] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        want[:, h] = (p / p.sum(axis=1, keepdims=True)) @ vv
    # probabilities and the output are rounded to bf16: a step of each, on the scale of v
    vmax = np.abs(vc[:, : start + n]).max()
    assert_close(f"prefill attention hd {hd} heads {n_heads}/{n_kv} n {n} start {start}", got, want,
                 2 * BF16_STEP * vmax, BF16_STEP)


# --- the whole prefill against the decode on the GPU -------------------------------------------

MODELS = {
    "stories15M": lambda: synthetic_model("stories15M", seed=7, max_seq=1024),      # MHA, head_dim 48
    "qwen-tiny": lambda: synthetic_model("qwen-tiny", seed=7, max_seq=512),        # biases, GQA, head_dim 32
    "gqa": lambda: synthetic_model("gqa", seed=7, max_seq=1024),                   # GQA 32/8, head_dim 64
    # the families' features: q/k norms and YaRN; partial rotary and LongRoPE; layers without RoPE
    "qwen3-tiny": lambda: synthetic_model("qwen3-tiny", seed=7, max_seq=1024),
    "phi3-tiny": lambda: synthetic_model("phi3-tiny", seed=7, max_seq=1024),
    "smollm3-tiny": lambda: synthetic_model("smollm3-tiny", seed=7, max_seq=1024),
    # Gemma 3's: head_dim 256, post-norms, GELU, windows of 32 positions crossing every chunk
    "gemma3-tiny": lambda: synthetic_model("gemma3-tiny", seed=7, max_seq=1024),
    # Gemma 3's layers with heads of 512 (attention_wide.cu's, the decode's and the prefill's), windows
    # of 32 and global layers
    "gemma3-wide": lambda: random_model(dataclasses.replace(SHAPES["gemma3-tiny"], head_dim=512, max_seq=1024),
                                        seed=7, name="gemma3-wide"),
    "hd128": lambda: random_model(ModelConfig(dim=512, n_layers=3, n_heads=4, n_kv_heads=4, head_dim=128,
                                              ffn_dim=1376, vocab=1000, max_seq=512, rope_theta=500000.0),
                                  seed=7, name="hd128"),                           # MHA, head_dim 128, untied
}
MAX_SEQ = 320
PROMPT = 300
CHECK_LENGTHS = (1, 77, PROMPT)  # prompt lengths whose last logits are compared
CHUNKS = (64, 100, 512)          # reserved chunk sizes, in increasing order (a reservation only grows)


class Decoded:
    """The decode forward over a prompt, one token at a time: the KV cache, the logits at each
    checked length, and the logits of one more token decoded after the whole prompt."""

    def __init__(self, dev, tokens, extra):
        self.extra = extra
        self.logits = {}
        for pos, tok in enumerate(tokens):
            dev.set_input(int(tok), pos)
            dev.enqueue_forward(eager=True)
            if pos + 1 in CHECK_LENGTHS:
                self.logits[pos + 1] = host_logits(dev)
        self.k, self.v = kv_cache_rows(dev)
        dev.set_input(extra, len(tokens))
        dev.enqueue_forward(eager=True)
        self.next_logits = host_logits(dev)


class Expected:
    """The reference prefill of each checked length, with bf16 products (logits, k and v caches
    as float32), and how far it drifts from the float32 reference prefill: the logits' error
    relative to their scale, and each layer's cache difference relative to its norm."""

    def __init__(self, model, tokens):
        ref = ReferenceModel(model, max_seq=MAX_SEQ)
        self.logits, self.k, self.v, self.logit_drift, self.cache_drift = {}, {}, {}, {}, {}
        for n in CHECK_LENGTHS:
            ref.reset()
            want32 = ref.prefill(tokens[:n])
            k32, v32 = ref.k_cache[:, :, :n].copy(), ref.v_cache[:, :, :n].copy()
            ref.reset()
            self.logits[n] = ref.prefill(tokens[:n], bf16_products=True)
            self.k[n], self.v[n] = ref.k_cache[:, :, :n].copy(), ref.v_cache[:, :, :n].copy()
            self.logit_drift[n] = relative_error(self.logits[n], want32)[0]
            self.cache_drift[n] = np.maximum(layer_errors(self.k[n], k32), layer_errors(self.v[n], v32))


def layer_errors(got, want):
    """Per layer: |got - want| / |want| (Frobenius norms) of (layers, ...) float arrays."""
    return np.array([np.linalg.norm(got[li] - want[li]) / np.linalg.norm(want[li]) for li in range(got.shape[0])])


def poison_cache(dev):
    k, v = kv_cache_pointers(dev)
    nbytes = int(np.prod(kv_cache_shape(dev))) * 2
    junk = np.full(nbytes, 0xFF, dtype=np.uint8)
    for p in (k, v):
        dev.ctx.upload_async(p, junk)
    dev.ctx.wait_idle()


def poison_logits(dev):
    dev.ctx.upload_async(dev.forward.logits, np.full(dev.forward.width * 4, 0xFF, dtype=np.uint8))
    dev.ctx.wait_idle()


def prefill(dev, tokens_ptr, n, start):
    _lib.check(dev.lib.arc_model_prefill(dev.forward.ptr, tokens_ptr, n, start))


def reserve(dev, chunk):
    _lib.check(dev.lib.arc_model_prefill_reserve(dev.forward.ptr, chunk))


@pytest.fixture(scope="module", params=list(MODELS))
def setup(request):
    model = MODELS[request.param]()
    dev = open_cuda_device(model, max_seq=MAX_SEQ, use_graph=False)
    dev.cfg = model.config
    rng = np.random.default_rng(21)
    tokens = rng.integers(0, model.config.vocab, size=PROMPT).astype(np.int32)
    extra = int(rng.integers(model.config.vocab))
    decoded = Decoded(dev, tokens, extra)
    d_tokens = dev.ctx.device_alloc(tokens.nbytes)
    dev.ctx.upload_async(d_tokens, tokens)
    dev.ctx.wait_idle()
    yield model, dev, tokens, dev.ffi.cast("int32_t *", d_tokens), decoded
    dev.ctx.device_free(d_tokens)
    dev.close()


@pytest.fixture(scope="module")
def expected(setup):
    model, _, tokens, _, _ = setup
    return Expected(model, [int(t) for t in tokens])


def relative_error(got, want):
    """(max |got - want| / scale, scale) with scale = max(1, max |want|); got must be finite."""
    assert np.all(np.isfinite(got)), f"{np.count_nonzero(~np.isfinite(got))} non-finite logits"
    scale = max(1.0, float(np.max(np.abs(want))))
    return float(np.max(np.abs(got.astype(np.float64) - want))) / scale, scale


def assert_logits_match(what, got, want, bound):
    err, scale = relative_error(got, want)
    print(f"{what}: max relative logit error {err:.3g} (bound {bound:.3g})")
    assert err <= bound, f"{what}: max relative logit error {err:.3g} exceeds {bound:.3g}"
    top2 = np.sort(want)[-2:]
    if top2[1] - top2[0] > 2 * err * scale:
        assert int(np.argmax(got)) == int(np.argmax(want)), f"{what}: the argmax differs with a clear margin"


def assert_cache_matches(what, got, want_k, want_v, n, bounds):
    """Rows < n within bounds[layer] (relative norm) of want, layer by layer; rows >= n untouched."""
    for name, g, w in (("k", got[0], want_k), ("v", got[1], want_v)):
        assert np.all(g[:, :, n:] == 0xFFFF), f"{what}: {name} cache rows past the prompt were written"
        gf = from_bf16(g[:, :, :n]).astype(np.float64)
        assert np.all(np.isfinite(gf)), f"{what}: {name} cache rows of the prompt not written (NaN)"
        rel = layer_errors(gf, np.asarray(w[:, :, :n], dtype=np.float64))
        print(f"{what}: {name} cache error by layer {np.round(rel, 4).tolist()} (bounds {np.round(bounds, 4).tolist()})")
        assert np.all(rel <= bounds), f"{what}: {name} cache differs by {rel.tolist()}, bounds {bounds.tolist()}"


def decode_bounds(expected, n):
    """What the GPU prefill may differ from the GPU decode by: twice the reference's own drift."""
    return 2 * expected.logit_drift[n] + 1e-2, 2 * expected.cache_drift[n] + 2e-3


def check_against_decode(what, dev, decoded, expected, n):
    logit_bound, cache_bounds = decode_bounds(expected, n)
    assert_logits_match(f"{what} vs decode", host_logits(dev), decoded.logits[n], logit_bound)
    k, v = (from_bf16(c) for c in (decoded.k, decoded.v))
    assert_cache_matches(f"{what} vs decode", kv_cache_rows(dev), k, v, n, cache_bounds)


def test_prefill_matches_decode_for_every_chunk_size_and_length(setup, expected):
    model, dev, tokens, d_tokens, decoded = setup
    for chunk in CHUNKS:
        reserve(dev, chunk)
        for n in CHECK_LENGTHS:
            poison_cache(dev)
            poison_logits(dev)
            prefill(dev, d_tokens, n, 0)
            check_against_decode(f"{model.name} chunk {chunk} n {n}", dev, decoded, expected, n)


def test_prefill_matches_the_reference_with_bf16_products(setup, expected):
    """Closer to the reference computing its numerics than the reference's own float32 prefill is
    (summation order still differs, and moves a value across a bf16 rounding boundary now and
    then: measured, a quarter to a half of that drift)."""
    model, dev, tokens, d_tokens, decoded = setup
    reserve(dev, 100)
    for n in CHECK_LENGTHS:
        what = f"{model.name} n {n} vs reference (bf16 products)"
        poison_cache(dev)
        poison_logits(dev)
        prefill(dev, d_tokens, n, 0)
        assert_logits_match(what, host_logits(dev), expected.logits[n], expected.logit_drift[n] + 1e-2)
        assert_cache_matches(what, kv_cache_rows(dev), expected.k[n], expected.v[n], n, expected.cache_drift[n] + 3e-3)


def test_prefill_in_two_calls_continues_the_cache_and_decoding_follows(setup, expected):
    model, dev, tokens, d_tokens, decoded = setup
    reserve(dev, 64)
    poison_cache(dev)
    split = 77  # the second call starts mid-tile and spans several chunks
    prefill(dev, d_tokens, split, 0)
    prefill(dev, d_tokens + split, PROMPT - split, split)
    check_against_decode(f"{model.name} two calls", dev, decoded, expected, PROMPT)
    # the decode reads the cache the prefill wrote
    dev.set_input(decoded.extra, PROMPT)
    dev.enqueue_forward(eager=True)
    bound, _ = decode_bounds(expected, PROMPT)
    assert_logits_match(f"{model.name} decode after prefill", host_logits(dev), decoded.next_logits, bound)


def test_prefill_reads_tokens_from_mapped_host_memory(setup, expected):
    model, dev, tokens, d_tokens, decoded = setup
    reserve(dev, 512)
    host, mapped = dev.ctx.pinned((PROMPT,), np.int32)
    host[:] = tokens
    poison_logits(dev)
    n = CHECK_LENGTHS[1]
    prefill(dev, dev.ffi.cast("int32_t *", mapped), n, 0)
    bound, _ = decode_bounds(expected, n)
    assert_logits_match(f"{model.name} mapped tokens", host_logits(dev), decoded.logits[n], bound)


def test_a_token_outside_the_vocabulary_gives_nan_logits_not_a_stray_read(setup):
    model, dev, tokens, d_tokens, decoded = setup
    reserve(dev, 64)
    host, mapped = dev.ctx.pinned((3,), np.int32)
    host[:] = [1, 2, model.config.vocab]
    prefill(dev, dev.ffi.cast("int32_t *", mapped), 3, 0)
    assert np.isnan(host_logits(dev)).all()


# --- bad arguments: one clear error, nothing changed --------------------------------------------

@pytest.fixture(scope="module")
def small():
    model = synthetic_model("qwen-tiny", seed=3, max_seq=512)
    dev = open_cuda_device(model, max_seq=MAX_SEQ, use_graph=False)
    dev.cfg = model.config
    yield model, dev
    dev.close()


def test_prefill_needs_a_reservation_and_every_tensor_uploaded(small):
    model, dev = small
    ffi, lib, c = dev.ffi, dev.lib, model.config
    cfg = ffi.new("arc_model_config *")
    cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads = c.dim, c.n_layers, c.n_heads, c.n_kv_heads
    cfg.head_dim, cfg.ffn_dim, cfg.vocab, cfg.max_seq = c.head_dim, c.ffn_dim, c.vocab, MAX_SEQ
    cfg.rms_eps, cfg.tied_embeddings, cfg.qkv_bias = c.rms_eps, int(c.tied_embeddings), int(c.qkv_bias)
    pp = ffi.new("arc_model **")
    _lib.check(lib.arc_model_create(dev.ctx.ptr, cfg, pp))  # a bare model: nothing reserved or uploaded
    try:
        host, mapped = dev.ctx.pinned((4,), np.int32)
        host[:] = [1, 2, 3, 4]
        tokens = ffi.cast("int32_t *", mapped)
        with pytest.raises(arcpy.InvalidArgumentError, match="arc_model_prefill_reserve first"):
            _lib.check(lib.arc_model_prefill(pp[0], tokens, 4, 0))
        _lib.check(lib.arc_model_prefill_reserve(pp[0], 16))
        with pytest.raises(arcpy.InvalidArgumentError, match="ARC_TENSOR_EMBED was never uploaded"):
            _lib.check(lib.arc_model_prefill(pp[0], tokens, 4, 0))
    finally:
        dev.ctx.wait_idle()
        lib.arc_model_destroy(pp[0])


@pytest.mark.parametrize("n,start,match", [
    (0, 0, "n must be at least 1"),
    (-3, 0, "n must be at least 1"),
    (4, -1, "do not fit in max_seq"),
    (MAX_SEQ, 1, "do not fit in max_seq"),
    (MAX_SEQ + 1, 0, "do not fit in max_seq"),
    (2, 2**31 - 2, "do not fit in max_seq"),
])
def test_bad_prefill_ranges_raise_and_change_nothing(small, n, start, match):
    model, dev = small
    reserve(dev, 64)
    host, mapped = dev.ctx.pinned((8,), np.int32)
    host[:] = 1
    poison_cache(dev)
    poison_logits(dev)
    with pytest.raises(arcpy.InvalidArgumentError, match=match):
        prefill(dev, dev.ffi.cast("int32_t *", mapped), n, start)
    dev.ctx.wait_idle()
    k, v = kv_cache_rows(dev)
    assert np.all(k == 0xFFFF) and np.all(v == 0xFFFF), "a refused prefill wrote the cache"
    assert np.isnan(host_logits(dev)).all(), "a refused prefill wrote the logits"


def test_null_arguments_and_a_bad_reservation_raise(small):
    model, dev = small
    ffi, lib = dev.ffi, dev.lib
    with pytest.raises(arcpy.InvalidArgumentError, match="arc_model_prefill: null argument"):
        _lib.check(lib.arc_model_prefill(ffi.NULL, ffi.NULL, 1, 0))
    with pytest.raises(arcpy.InvalidArgumentError, match="null argument"):
        _lib.check(lib.arc_model_prefill(dev.forward.ptr, ffi.NULL, 1, 0))
    for bad in (0, -1):
        with pytest.raises(arcpy.InvalidArgumentError, match="max_chunk must be positive"):
            reserve(dev, bad)
    with pytest.raises(arcpy.InvalidArgumentError, match="model is null"):
        _lib.check(lib.arc_model_prefill_reserve(ffi.NULL, 16))
    with pytest.raises(arcpy.InvalidArgumentError, match="null argument"):
        _lib.check(lib.arc_model_kv_cache(dev.forward.ptr, ffi.NULL, ffi.new("uint16_t **")))


def test_bad_gemm_arguments_raise(gpu):
    lib, ffi, ctx = gpu.lib, gpu.ffi, gpu.ctx
    a, w, c = (u16p(gpu, gpu.alloc(4096)), u16p(gpu, gpu.alloc(4096)), f32p(gpu, gpu.alloc(4096)))
    cases = [
        (lambda: lib.arc_op_gemm_bf16(ctx, a, w, 4, 4, 12, ffi.NULL, 0, c), "k must be a positive multiple of 8"),
        (lambda: lib.arc_op_gemm_bf16(ctx, a, w, 0, 4, 8, ffi.NULL, 0, c), "m and n must be positive"),
        (lambda: lib.arc_op_gemm_bf16(ctx, a, w, 4, -1, 8, ffi.NULL, 0, c), "m and n must be positive"),
        (lambda: lib.arc_op_gemm_bf16(ctx, ffi.NULL, w, 4, 4, 8, ffi.NULL, 0, c), "null pointer"),
        (lambda: lib.arc_op_gemm_bf16(ctx, a + 1, w, 4, 4, 8, ffi.NULL, 0, c), "16-byte aligned"),
        (lambda: lib.arc_op_gemm_bf16(ctx, a, w, 4, 4, 8, ffi.NULL, 0, ffi.cast("float *", a)), "must not alias"),
        (lambda: lib.arc_op_gemm_bf16(ffi.NULL, a, w, 4, 4, 8, ffi.NULL, 0, c), "ctx is null"),
        (lambda: lib.arc_op_gemm_swiglu_bf16(ctx, a, w, 4, 5, 8, u16p(gpu, c)), "n must be even"),
        (lambda: lib.arc_op_gemm_swiglu_bf16(ctx, a, w, 4, 4, 8, ffi.NULL), "null pointer"),
    ]
    for call, match in cases:
        with pytest.raises(arcpy.InvalidArgumentError, match=match):
            _lib.check(call())


def test_bad_prefill_attention_arguments_raise(gpu):
    lib, ctx = gpu.lib, gpu.ctx
    f, u = f32p(gpu, gpu.alloc(1 << 16)), u16p(gpu, gpu.alloc(1 << 16))

    def call(hd=64, heads=4, kv=2, max_seq=16, n=4, start=0, cache=u):
        return lib.arc_op_prefill_attention(ctx, f, f, cache, u, heads, kv, hd, max_seq, n, start, u, f, u)

    for kwargs, match in [
        (dict(hd=258), "head_dim must be even"),
        (dict(hd=7), "head_dim must be even"),
        (dict(heads=6, kv=4), "multiple of n_kv_heads"),
        (dict(n=0), "must be non-empty and end within max_seq"),
        (dict(start=13), "must be non-empty and end within max_seq"),
        (dict(start=-1), "must be non-empty and end within max_seq"),
        (dict(cache=u + 1), "16-byte aligned"),
    ]:
        with pytest.raises(arcpy.InvalidArgumentError, match=match):
            _lib.check(call(**kwargs))
