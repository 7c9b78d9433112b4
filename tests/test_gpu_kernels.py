"""GPU tier: every forward kernel of libarc (through its arc_op_* entry point, which calls the
launcher the forward uses) against an independent NumPy float32 computation written here, and
the arc_model_* handle: its checks, a forward that runs, and a captured forward that replays.

Each test draws fresh random, non-zero inputs from its own seed, poisons every output with NaN
bytes before the run, waits by polling arc_stream_query (there is no synchronize), and compares
with a tolerance that has an absolute and a relative part; NaN never passes. A mismatch message
lists the first offending elements.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from bf16_words import from_bf16, random_bf16, to_bf16
from gpu_buffers import begin, f32p, u16p

import arcpy
from arcpy import _lib

pytestmark = pytest.mark.gpu

F32 = np.float32
EPS32 = float(np.finfo(np.float32).eps)

# arc_tensor ids, as arc.h numbers them.
EMBED, ATTN_NORM, WQ, WK, WV, BQ, BK, BV, WO, MLP_NORM, W_GATE, W_UP, W_DOWN, FINAL_NORM, LM_HEAD, INV_FREQ = range(16)
PER_LAYER = (ATTN_NORM, WQ, WK, WV, BQ, BK, BV, WO, MLP_NORM, W_GATE, W_UP, W_DOWN, INV_FREQ)  # a RoPE table a layer


def assert_close(what: str, got, want, atol, rtol) -> None:
    """|got - want| <= atol + rtol * |want| everywhere, got finite; else list the first mismatches."""
    got = np.asarray(got, dtype=F32).ravel()
    want = np.asarray(want, dtype=F32).ravel()
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.isfinite(want).all(), f"{what}: the NumPy reference itself is not finite"
    tol = np.broadcast_to(np.asarray(atol, dtype=np.float64).ravel() if np.ndim(atol) else atol, want.shape) \
        + rtol * np.abs(want.astype(np.float64))
    diff = np.abs(got.astype(np.float64) - want)
    bad = ~np.isfinite(got) | (diff > tol)
    if bad.any():
        idx = np.flatnonzero(bad)
        lines = [f"  [{i}] got {got[i]!r} want {want[i]!r} diff {diff[i]:.3g} tol {tol[i]:.3g}" for i in idx[:10]]
        worst = np.nanmax(np.where(np.isfinite(diff), diff / np.maximum(tol, 1e-30), np.inf))
        pytest.fail(f"{what}: {idx.size} of {got.size} elements out of tolerance "
                    f"({np.count_nonzero(~np.isfinite(got))} not finite; worst diff/tol {worst:.3g}); first:\n"
                    + "\n".join(lines))


# --- NumPy float32 references (the numerics contract) ------------------------------------------

def np_rmsnorm(x, w, eps):
    inv = F32(1.0) / np.sqrt(np.mean(x * x, dtype=F32) + F32(eps))
    return (x * inv * w).astype(F32)


def np_silu(g):
    with np.errstate(over="ignore"):
        return g / (F32(1.0) + np.exp(-g))


def np_rope(x, pos, inv_freq):
    """x (heads, hd) f32, rotate-half pairs (i, i + hd/2), angle float32(pos) * inv_freq[i]."""
    half = x.shape[1] // 2
    ang = F32(pos) * inv_freq
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[:, :half], x[:, half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=1).astype(F32)


def np_attention(q, k, v, pos, n_kv):
    """q (n_heads, hd) f32; k, v (n_kv, >pos, hd) f32 -> (n_heads, hd)."""
    n_heads, hd = q.shape
    group = n_heads // n_kv
    out = np.empty_like(q)
    for h in range(n_heads):
        kk, vv = k[h // group, : pos + 1], v[h // group, : pos + 1]
        s = (kk @ q[h]) * F32(1.0 / math.sqrt(hd))
        p = np.exp(s - s.max())
        out[h] = (p @ vv) / p.sum()
    return out


def inv_freq_table(hd, theta=10000.0):
    return (theta ** (-2.0 * np.arange(hd // 2, dtype=np.float64) / hd)).astype(F32)


# --- embedding ----------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab,dim", [(32000, 288), (1000, 4096), (64, 8)])
def test_embedding_gathers_the_token_row(gpu, vocab, dim):
    rng = np.random.default_rng(1000 + dim)
    table = random_bf16(rng, (vocab, dim))
    d_table = gpu.upload(table)
    x = gpu.alloc(dim * 4)
    for tok in (0, vocab - 1, int(rng.integers(vocab))):
        gpu.poison(x, dim * 4)
        _lib.check(gpu.lib.arc_op_embedding(gpu.ctx, u16p(gpu, d_table), vocab, dim, gpu.token(tok), f32p(gpu, x)))
        got = gpu.read(x, F32, dim)
        assert_close(f"embedding row {tok}", got, from_bf16(table[tok]), 0.0, 0.0)


def test_embedding_of_a_token_out_of_range_is_nan_not_a_stray_read(gpu):
    rng = np.random.default_rng(7)
    table = random_bf16(rng, (16, 64))
    d_table, x = gpu.upload(table), gpu.alloc(64 * 4)
    _lib.check(gpu.lib.arc_op_embedding(gpu.ctx, u16p(gpu, d_table), 16, 64, gpu.token(16), f32p(gpu, x)))
    assert np.isnan(gpu.read(x, F32, 64)).all()


# --- GEMV ---------------------------------------------------------------------------------------

def gemv_tolerance(w32, xin, cols):
    """fp32 summation in another order: a few ulps of sqrt(cols) times the sum of |terms|."""
    return 8 * EPS32 * math.sqrt(cols) * (np.abs(w32) @ np.abs(xin)) + 1e-30


GEMV_SHAPES = [(288, 288), (768, 2048), (2048, 2048), (3072, 2048), (8192, 2048), (2048, 8192), (64, 12288),
               (2304, 768), (960, 1024), (576, 1032), (100, 8), (8192, 512), (4224, 520),
               (32000, 288), (128256, 2048), (1000, 14336)]


@pytest.mark.parametrize("rows,cols", GEMV_SHAPES)
@pytest.mark.parametrize("variant", ["plain", "bias", "accumulate", "norm", "norm+bias+accumulate"])
def test_gemv_matches_numpy(gpu, rows, cols, variant):
    if rows * cols > 50_000_000 and variant not in ("plain", "norm"):
        pytest.skip("the largest shape runs in its two forward variants only")
    rng = np.random.default_rng(rows * 31 + cols + len(variant))
    w = random_bf16(rng, (rows, cols), 1.0 / math.sqrt(cols))
    x = rng.standard_normal(cols, dtype=F32) * F32(3.0)
    use_bias, use_acc, use_norm = "bias" in variant, "accumulate" in variant, "norm" in variant
    bias = random_bf16(rng, rows, 0.5) if use_bias else None
    norm = random_bf16(rng, cols, 0.2) if use_norm else None
    if use_norm:
        norm = to_bf16(F32(1.0) + from_bf16(norm))
    y0 = rng.standard_normal(rows, dtype=F32)
    eps = 1e-5

    d_w, d_x = gpu.upload(w), gpu.upload(x)
    d_y = gpu.alloc(rows * 4)
    if use_acc:
        gpu.put(d_y, y0)
    else:
        gpu.poison(d_y, rows * 4)
    d_b = u16p(gpu, gpu.upload(bias)) if use_bias else gpu.ffi.NULL
    d_n = u16p(gpu, gpu.upload(norm)) if use_norm else gpu.ffi.NULL
    _lib.check(gpu.lib.arc_op_gemv(gpu.ctx, u16p(gpu, d_w), f32p(gpu, d_x), rows, cols, d_b, d_n, eps,
                                   int(use_acc), f32p(gpu, d_y)))
    got = gpu.read(d_y, F32, rows)

    w32 = from_bf16(w)
    xin = np_rmsnorm(x, from_bf16(norm), eps) if use_norm else x
    want = w32 @ xin
    if use_bias:
        want = want + from_bf16(bias)
    if use_acc:
        want = want + y0
    atol = gemv_tolerance(w32, xin, cols) + (8 * EPS32 * np.abs(y0) if use_acc else 0)
    assert_close(f"gemv {rows}x{cols} {variant}", got, want, atol, 1e-6)


# Shapes of the lm_head with its argmax: every work split (4 rows a task; 2 and 1 with the input in
# registers; split-K 2 to 8) and the vocabularies of the benchmark's shapes.
ARGMAX_SHAPES = [(32000, 288), (49152, 576), (128256, 2048), (2304, 768), (960, 1024), (100, 8),
                 (64, 4096), (300, 2048), (1000, 14336)]


def run_gemv_argmax(gpu, w, x, norm, eps=1e-5):
    """arc_op_gemv_argmax of w @ rmsnorm(x, norm): (logits, token, value)."""
    rows, cols = w.shape
    d_w, d_x, d_n = gpu.upload(w), gpu.upload(x), gpu.upload(norm)
    d_y, d_out = gpu.alloc(rows * 4), gpu.alloc(8)
    gpu.poison(d_y, rows * 4)
    gpu.poison(d_out, 8)
    out = gpu.ffi.cast("int32_t *", d_out)
    _lib.check(gpu.lib.arc_op_gemv_argmax(gpu.ctx, u16p(gpu, d_w), f32p(gpu, d_x), rows, cols, u16p(gpu, d_n), eps,
                                          f32p(gpu, d_y), out, f32p(gpu, gpu.ffi.cast("char *", d_out) + 4)))
    both = gpu.read(d_out, F32, 2)
    return gpu.read(d_y, F32, rows), int(both[:1].view(np.int32)[0]), both[1]


@pytest.mark.parametrize("rows,cols", ARGMAX_SHAPES)
def test_gemv_argmax_writes_the_logits_and_picks_numpys_argmax(gpu, rows, cols):
    rng = np.random.default_rng(rows + 3 * cols)
    w = random_bf16(rng, (rows, cols), 1.0 / math.sqrt(cols))
    x = rng.standard_normal(cols, dtype=F32)
    norm = to_bf16(F32(1.0) + F32(0.2) * rng.standard_normal(cols, dtype=F32))
    d_w, d_x, d_n, d_y = gpu.upload(w), gpu.upload(x), gpu.upload(norm), gpu.alloc(rows * 4)
    _lib.check(gpu.lib.arc_op_gemv(gpu.ctx, u16p(gpu, d_w), f32p(gpu, d_x), rows, cols, gpu.ffi.NULL,
                                   u16p(gpu, d_n), 1e-5, 0, f32p(gpu, d_y)))
    plain = gpu.read(d_y, F32, rows)
    logits, token, value = run_gemv_argmax(gpu, w, x, norm)
    # The same products as the plain GEMV, bit for bit, and the argmax of what was written.
    np.testing.assert_array_equal(logits.view(np.uint32), plain.view(np.uint32))
    assert token == int(np.argmax(logits))
    assert value == logits[token]


@pytest.mark.parametrize("rows,cols", [(32000, 288), (300, 2048), (100, 8)])
def test_gemv_argmax_breaks_ties_low_puts_nan_first_and_resets_between_launches(gpu, rows, cols):
    rng = np.random.default_rng(rows + cols)
    w = random_bf16(rng, (rows, cols), 1.0 / math.sqrt(cols))
    x = np.abs(rng.standard_normal(cols, dtype=F32)) + F32(0.5)
    norm = to_bf16(np.ones(cols, dtype=F32))
    # Equal rows, scaled up to be the largest: the lower of them wins.
    top = to_bf16(np.full(cols, 1.0, dtype=F32))
    tied = w.copy()
    a, b = rows - 7, rows // 3
    tied[a] = tied[b] = top
    logits, token, value = run_gemv_argmax(gpu, tied, x, norm)
    assert logits[a] == logits[b] == logits.max()
    assert (token, value) == (b, logits[b])
    # All rows zero: every logit +0 and row 0 wins; -0 and +0 are equal.
    _, token, value = run_gemv_argmax(gpu, np.zeros_like(w), x, norm)
    assert (token, value) == (0, 0.0)
    # NaN in two rows: the lower NaN wins over every number, its value NaN. The launch before
    # left a larger key behind if the reset failed; this one and the next must not see it.
    nan = w.copy()
    nan[rows - 2, 0] = nan[rows // 2, 3] = 0x7FC0
    logits, token, value = run_gemv_argmax(gpu, nan, x, norm)
    assert token == rows // 2 and np.isnan(value) and np.isnan(logits[token])
    # Smaller logits after a NaN: the stale NaN key must be gone.
    small = to_bf16(from_bf16(w) * F32(0.01))
    logits, token, value = run_gemv_argmax(gpu, small, x, norm)
    assert (token, value) == (int(np.argmax(logits)), logits[int(np.argmax(logits))])


@pytest.mark.parametrize("rows,cols", [(768, 288), (2048, 768), (8192, 2048), (5632, 2048), (14336, 4096)])
@pytest.mark.parametrize("use_norm", [False, True])
def test_gemv_swiglu_matches_numpy(gpu, rows, cols, use_norm):
    rng = np.random.default_rng(rows + 7 * cols + use_norm)
    w = random_bf16(rng, (2 * rows, cols), 2.0 / math.sqrt(cols))
    x = rng.standard_normal(cols, dtype=F32)
    norm = to_bf16(F32(1.0) + F32(0.2) * rng.standard_normal(cols, dtype=F32)) if use_norm else None
    eps = 1e-6
    d_w, d_x, d_y = gpu.upload(w), gpu.upload(x), gpu.alloc(rows * 4)
    gpu.poison(d_y, rows * 4)
    d_n = u16p(gpu, gpu.upload(norm)) if use_norm else gpu.ffi.NULL
    _lib.check(gpu.lib.arc_op_gemv_swiglu(gpu.ctx, u16p(gpu, d_w), f32p(gpu, d_x), rows, cols, d_n, eps,
                                          f32p(gpu, d_y)))
    got = gpu.read(d_y, F32, rows)

    w32 = from_bf16(w)
    xin = np_rmsnorm(x, from_bf16(norm), eps) if use_norm else x
    g, u = w32[:rows] @ xin, w32[rows:] @ xin
    want = np_silu(g) * u
    tg, tu = gemv_tolerance(w32[:rows], xin, cols), gemv_tolerance(w32[rows:], xin, cols)
    atol = F32(1.1) * tg * np.abs(u) + np.abs(np_silu(g)) * tu + 1e-30
    assert_close(f"gemv_swiglu {rows}x{cols} norm={use_norm}", got, want, atol, 1e-5)


# --- attention, with RoPE and the KV-cache write of the new position ------------------------------

ATTN_CASES = [(hd, n_heads, n_kv, pos, 4096)
              for hd, n_heads, n_kv in [(48, 6, 6), (48, 8, 2), (64, 8, 8), (64, 32, 8), (128, 4, 4), (128, 16, 4),
                                        (64, 9, 3)]
              for pos in (0, 1, 63, 64, 100, 127, 128, 2000)]
ATTN_CASES += [(64, 32, 8, 8191, 8192), (128, 16, 4, 8191, 8192), (48, 6, 6, 8191, 8192),
               (64, 8, 8, 16383, 16384), (64, 8, 4, 5000, 8192),  # group 2
               (32, 4, 4, 255, 512), (32, 4, 2, 256, 512),  # 256-position chunks
               (30, 4, 2, 300, 512), (30, 4, 4, 0, 512), (30, 4, 4, 31, 512), (30, 4, 4, 32, 512),  # narrow rows
               # more chunks than a head's blocks: blocks take 2, 4 and 8 chunks, some one fewer; the
               # tiled kernel's blocks 2, 4 and 8 tiles of 64, the last fewer
               (64, 32, 8, 5000, 8192), (128, 32, 8, 8000, 8192), (30, 64, 8, 4000, 4096),
               # the tiled kernel's 32 blocks a kv head: 64 tiles (2 each, 32 blocks) and 65 (3 each, 22 blocks)
               (128, 32, 8, 4095, 8192), (128, 32, 8, 4096, 8192),
               # a deep cache (512 tiles, 16 a tiled block); grouped-query groups of 8 and 16
               (128, 32, 8, 32767, 32768), (128, 32, 4, 20000, 32768), (128, 16, 1, 9000, 16384),
               # groups past the 16 heads of a tiled block: 32 heads on one kv head, and 20 (16 + 4)
               (128, 64, 2, 5000, 8192), (64, 40, 2, 3000, 4096),
               # the widest heads, and a deep position there
               (256, 8, 2, 700, 1024), (256, 16, 2, 12000, 16384)]
# Heads past 256 (attention_wide.cu): Gemma 4's 512 with groups of 8 (32/4) and 16 (32/2, 16/1), at
# positions where one block writes the output and where the last block merges many; 384 and 320
# (the second run of 8 elements of a lane only partly inside the head), 264 (33 chunks of 8: the
# halves of a key's dot uneven), a group of 20 (blocks of 16 and 4 heads), one of 1.
ATTN_CASES += [(512, 32, 4, pos, 4096) for pos in (0, 1, 63, 64, 700, 2999)]
ATTN_CASES += [(512, 32, 2, 3000, 4096), (512, 16, 1, 1023, 1024), (384, 16, 2, 1500, 2048),
               (320, 8, 1, 2100, 4096), (264, 4, 4, 200, 512), (512, 40, 2, 1000, 2048), (512, 4, 4, 12000, 16384)]


@pytest.mark.parametrize("hd,n_heads,n_kv,pos,max_seq", ATTN_CASES)
def test_attention_rotates_stores_the_new_row_and_attends(gpu, hd, n_heads, n_kv, pos, max_seq):
    rng = np.random.default_rng(hd * 100_000 + n_heads * 1000 + n_kv * 100 + pos)
    theta = 500000.0 if hd == 64 else 10000.0
    inv_freq = inv_freq_table(hd, theta)
    q_dim, kv_dim = n_heads * hd, n_kv * hd
    qkv = rng.standard_normal(q_dim + 2 * kv_dim, dtype=F32) * F32(2.0)
    k = random_bf16(rng, (n_kv, max_seq, hd))
    v = random_bf16(rng, (n_kv, max_seq, hd))
    # The new row and every row after it hold NaN: a kernel that reads them from the cache, rather
    # than taking the new row from qkv, poisons its output.
    k[:, pos:] = 0xFFFF
    v[:, pos:] = 0xFFFF
    sb = gpu.ffi.new("uint64_t *")
    _lib.check(gpu.lib.arc_op_attention_scratch_bytes(n_heads, hd, max_seq, sb))
    d_qkv, d_f, d_k, d_v = gpu.upload(qkv), gpu.upload(inv_freq), gpu.upload(k), gpu.upload(v)
    d_s, d_o = gpu.alloc(sb[0]), gpu.alloc(q_dim * 4)
    gpu.poison(d_s, sb[0])
    gpu.poison(d_o, q_dim * 4)
    _lib.check(gpu.lib.arc_op_attention(gpu.ctx, f32p(gpu, d_qkv), f32p(gpu, d_f), u16p(gpu, d_k), u16p(gpu, d_v),
                                        n_heads, n_kv, hd, max_seq, gpu.position(pos), f32p(gpu, d_s),
                                        f32p(gpu, d_o)))
    got = gpu.read(d_o, F32, q_dim)
    k_cache = gpu.read(d_k, np.uint16, k.size).reshape(k.shape)
    v_cache = gpu.read(d_v, np.uint16, v.size).reshape(v.shape)
    assert np.array_equal(gpu.read(d_qkv, F32, qkv.size), qkv), "qkv was written"

    q_rot = np_rope(qkv[:q_dim].reshape(n_heads, hd), pos, inv_freq)
    k_rot = np_rope(qkv[q_dim:q_dim + kv_dim].reshape(n_kv, hd), pos, inv_freq)
    v_new = qkv[q_dim + kv_dim:].reshape(n_kv, hd)
    # bf16 rounding of a value that differs in its last float32 bit may land one bf16 step away.
    assert_close("k cache at pos", from_bf16(k_cache[:, pos]), from_bf16(to_bf16(k_rot)), 1e-6, 2 ** -7)
    assert np.array_equal(v_cache[:, pos], to_bf16(v_new)), "v cache at pos is not v rounded to nearest even"
    others = np.ones(max_seq, dtype=bool)
    others[pos] = False
    assert np.array_equal(k_cache[:, others], k[:, others]), "k cache changed at another position"
    assert np.array_equal(v_cache[:, others], v[:, others]), "v cache changed at another position"
    # The scores use the new row as the cache now holds it.
    want = np_attention(q_rot, from_bf16(k_cache[:, : pos + 1]), from_bf16(v_cache[:, : pos + 1]), pos, n_kv)
    assert_close(f"attention hd={hd} heads={n_heads}/{n_kv} pos={pos}", got, want, 2e-5, 1e-4)


def test_attention_at_a_position_outside_the_cache_is_nan_and_stores_nothing(gpu):
    n_heads, hd, max_seq = 4, 64, 256
    sb = gpu.ffi.new("uint64_t *")
    _lib.check(gpu.lib.arc_op_attention_scratch_bytes(n_heads, hd, max_seq, sb))
    d_qkv = gpu.upload(np.ones(3 * n_heads * hd, F32))
    d_f = gpu.upload(inv_freq_table(hd))
    cache = np.full(n_heads * max_seq * hd, 0x3F80, np.uint16)
    d_k, d_v = gpu.upload(cache), gpu.upload(cache)
    d_s, d_o = gpu.alloc(sb[0]), gpu.alloc(n_heads * hd * 4)
    for pos in (max_seq, -1):
        _lib.check(gpu.lib.arc_op_attention(gpu.ctx, f32p(gpu, d_qkv), f32p(gpu, d_f), u16p(gpu, d_k),
                                            u16p(gpu, d_v), n_heads, n_heads, hd, max_seq, gpu.position(pos),
                                            f32p(gpu, d_s), f32p(gpu, d_o)))
        assert np.isnan(gpu.read(d_o, F32, n_heads * hd)).all()
        assert np.array_equal(gpu.read(d_k, np.uint16, cache.size), cache)
        assert np.array_equal(gpu.read(d_v, np.uint16, cache.size), cache)


# --- launcher limits ----------------------------------------------------------------------------

def test_launchers_refuse_shapes_they_cannot_do(gpu):
    ffi, lib, ctx = gpu.ffi, gpu.lib, gpu.ctx
    buf = gpu.alloc(1 << 20)
    w, x, y = u16p(gpu, buf), f32p(gpu, buf), f32p(gpu, ffi.cast("char *", buf) + 4096)
    NULL = ffi.NULL
    cases = [
        ("multiple of 8", lambda: lib.arc_op_gemv(ctx, w, x, 16, 12, NULL, NULL, 1e-5, 0, y)),
        ("rows must be positive", lambda: lib.arc_op_gemv(ctx, w, x, 0, 16, NULL, NULL, 1e-5, 0, y)),
        ("exceeds the limit", lambda: lib.arc_op_gemv(ctx, w, x, 1, 49160, NULL, NULL, 1e-5, 0, y)),
        ("16-byte aligned", lambda: lib.arc_op_gemv(ctx, u16p(gpu, ffi.cast("char *", buf) + 2), x, 8, 16, NULL,
                                                    NULL, 1e-5, 0, y)),
        ("alias", lambda: lib.arc_op_gemv(ctx, w, x, 8, 16, NULL, NULL, 1e-5, 0, x)),
        ("null pointer", lambda: lib.arc_op_gemv(ctx, NULL, x, 8, 16, NULL, NULL, 1e-5, 0, y)),
        ("eps must be positive", lambda: lib.arc_op_gemv(ctx, w, x, 8, 16, NULL, w, 0.0, 0, y)),
        ("multiple of 8", lambda: lib.arc_op_gemv_swiglu(ctx, w, x, 8, 20, NULL, 1e-5, y)),
        ("multiple of 8", lambda: lib.arc_op_embedding(ctx, w, 10, 12, ffi.cast("uint32_t *", buf), x)),
        ("vocab must be positive", lambda: lib.arc_op_embedding(ctx, w, 0, 16, ffi.cast("uint32_t *", buf), x)),
        ("head_dim must be even", lambda: lib.arc_op_attention(ctx, x, x, w, w, 4, 4, 63, 16,
                                                              ffi.cast("int32_t *", buf), x, y)),
        ("head_dim must be even", lambda: lib.arc_op_attention(ctx, x, x, w, w, 4, 4, 130, 16,
                                                              ffi.cast("int32_t *", buf), x, y)),
        ("head_dim must be even", lambda: lib.arc_op_attention(ctx, x, x, w, w, 4, 4, 260, 16,
                                                              ffi.cast("int32_t *", buf), x, y)),
        ("head_dim must be even", lambda: lib.arc_op_attention(ctx, x, x, w, w, 4, 4, 520, 16,
                                                              ffi.cast("int32_t *", buf), x, y)),
        ("multiple of n_kv_heads", lambda: lib.arc_op_attention(ctx, x, x, w, w, 6, 4, 64, 16,
                                                               ffi.cast("int32_t *", buf), x, y)),
        ("at most 1024 heads", lambda: lib.arc_op_attention(ctx, x, x, w, w, 1028, 4, 64, 16,
                                                           ffi.cast("int32_t *", buf), x, y)),
        ("max_seq must be in", lambda: lib.arc_op_attention(ctx, x, x, w, w, 4, 4, 64, 0,
                                                           ffi.cast("int32_t *", buf), x, y)),
        ("null pointer", lambda: lib.arc_op_attention(ctx, x, NULL, w, w, 4, 4, 64, 16,
                                                     ffi.cast("int32_t *", buf), x, y)),
        ("ctx is null", lambda: lib.arc_op_gemv(NULL, w, x, 8, 16, NULL, NULL, 1e-5, 0, y)),
        ("null out", lambda: lib.arc_op_gemv_argmax(ctx, w, x, 8, 16, w, 1e-5, y, NULL, NULL)),
        ("multiple of 8", lambda: lib.arc_op_gemv_argmax(ctx, w, x, 8, 12, w, 1e-5, y,
                                                         ffi.cast("int32_t *", buf), NULL)),
    ]
    for message, call in cases:
        with pytest.raises(arcpy.InvalidArgumentError, match=message):
            _lib.check(call())
    with pytest.raises(arcpy.InvalidArgumentError, match="out of range"):
        _lib.check(lib.arc_op_attention_scratch_bytes(4, 64, 0, ffi.new("uint64_t *")))
    gpu.wait()  # nothing was launched, and nothing failed on the device


# --- the model handle ---------------------------------------------------------------------------

def model_config(ffi, **overrides):
    c = ffi.new("arc_model_config *")
    base = dict(dim=288, n_layers=2, n_heads=6, n_kv_heads=6, head_dim=48, ffn_dim=768, vocab=512,
                max_seq=64, rms_eps=1e-5, tied_embeddings=1, qkv_bias=0)
    base.update(overrides)
    for k, v in base.items():
        setattr(c, k, v)
    return c, base


def tensor_shapes(cfg) -> dict[int, tuple[int, ...]]:
    dim, hd, ffn, vocab = cfg["dim"], cfg["head_dim"], cfg["ffn_dim"], cfg["vocab"]
    q, kv = cfg["n_heads"] * hd, cfg["n_kv_heads"] * hd
    shapes = {EMBED: (vocab, dim), ATTN_NORM: (dim,), WQ: (q, dim), WK: (kv, dim), WV: (kv, dim),
              WO: (dim, q), MLP_NORM: (dim,), W_GATE: (ffn, dim), W_UP: (ffn, dim), W_DOWN: (dim, ffn),
              FINAL_NORM: (dim,), INV_FREQ: (hd // 2,)}
    if cfg["qkv_bias"]:
        shapes.update({BQ: (q,), BK: (kv,), BV: (kv,)})
    if not cfg["tied_embeddings"]:
        shapes[LM_HEAD] = (vocab, dim)
    return shapes


def random_weights(cfg, seed):
    """{(tensor, layer): array} for every tensor the model needs, scaled to keep activations O(1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for t, shape in tensor_shapes(cfg).items():
        for layer in range(cfg["n_layers"] if t in PER_LAYER else 1):
            if t == INV_FREQ:
                a = inv_freq_table(cfg["head_dim"])
            elif t in (ATTN_NORM, MLP_NORM, FINAL_NORM):
                a = to_bf16(F32(1.0) + F32(0.05) * rng.standard_normal(shape, dtype=F32))
            elif t in (BQ, BK, BV):
                a = random_bf16(rng, shape, 0.1)
            elif t == EMBED:
                a = random_bf16(rng, shape, 0.5)
            else:
                a = random_bf16(rng, shape, 1.0 / math.sqrt(shape[1]))
            out[(t, layer)] = a
    return out


class ModelRig:
    """An arc_model and an arc_loop on the test's context."""

    def __init__(self, gpu, **overrides):
        self.gpu = gpu
        ffi, lib = gpu.ffi, gpu.lib
        c, self.cfg = model_config(ffi, **overrides)
        pp = ffi.new("arc_model **")
        _lib.check(lib.arc_model_create(gpu.ctx, c, pp))
        self.model = pp[0]
        lp = ffi.new("arc_loop **")
        _lib.check(lib.arc_loop_create(gpu.ctx, self.cfg["vocab"], self.cfg["max_seq"], 64, lp))
        self.loop = lp[0]

    def upload(self, tensor, layer, array):
        array = np.ascontiguousarray(array)
        self.gpu.keep.append(array)
        return self.gpu.lib.arc_model_upload(self.model, tensor, layer, self.gpu.ffi.from_buffer(array),
                                             array.nbytes)

    def upload_all(self, weights, skip=()):
        for (t, layer), a in weights.items():
            if (t, layer) not in skip:
                _lib.check(self.upload(t, layer, a))

    def forward(self, token, pos):
        _lib.check(begin(self.gpu.ffi, self.gpu.lib, self.loop, token_input=(token, pos)))
        _lib.check(self.gpu.lib.arc_model_forward(self.model, self.loop))

    def logits_ptr(self):
        lp, vp = self.gpu.ffi.new("const float **"), self.gpu.ffi.new("int32_t *")
        _lib.check(self.gpu.lib.arc_model_logits(self.model, lp, vp))
        assert vp[0] == self.cfg["vocab"]
        return lp[0]

    def close(self):
        self.gpu.wait()
        self.gpu.lib.arc_loop_destroy(self.loop)
        self.gpu.lib.arc_model_destroy(self.model)


@pytest.fixture
def rig_factory(gpu):
    rigs = []

    def make(**overrides):
        rigs.append(ModelRig(gpu, **overrides))
        return rigs[-1]

    yield make
    for r in rigs:
        r.close()


@pytest.mark.parametrize("field,value,message", [
    ("dim", 0, "config.dim"), ("dim", 300, "config.dim"), ("n_layers", 0, "config.n_layers"),
    ("n_heads", 0, "config.n_heads"), ("n_kv_heads", 0, "config.n_kv_heads"),
    ("n_kv_heads", 4, "multiple of n_kv_heads"), ("head_dim", 47, "config.head_dim"),
    ("head_dim", 520, "config.head_dim"), ("head_dim", 260, "config.head_dim"), ("head_dim", 130, "config.head_dim"),
    ("head_dim", 2, "n_heads \\* head_dim"),
    ("ffn_dim", 770, "config.ffn_dim"), ("vocab", 0, "config.vocab"), ("max_seq", 0, "config.max_seq"),
    ("rms_eps", 0.0, "config.rms_eps"), ("rms_eps", float("nan"), "config.rms_eps"),
    ("tied_embeddings", 2, "config.tied_embeddings"), ("qkv_bias", -1, "config.qkv_bias"),
])
def test_model_create_refuses_a_bad_config(gpu, field, value, message):
    c, _ = model_config(gpu.ffi, **{field: value})
    pp = gpu.ffi.new("arc_model **")
    with pytest.raises(arcpy.InvalidArgumentError, match=message):
        _lib.check(gpu.lib.arc_model_create(gpu.ctx, c, pp))
    assert pp[0] == gpu.ffi.NULL


def test_model_create_refuses_a_q8_0_cache_of_heads_past_256(gpu):
    # Heads of 512 are attended over a bf16 cache only (attention_wide.cu); 256 takes either form.
    pp = gpu.ffi.new("arc_model **")
    c, _ = model_config(gpu.ffi, head_dim=512, kv_cache=1)
    with pytest.raises(arcpy.InvalidArgumentError, match="q8_0 KV cache takes heads of at most 256"):
        _lib.check(gpu.lib.arc_model_create(gpu.ctx, c, pp))
    assert pp[0] == gpu.ffi.NULL


def test_model_upload_checks_tensor_layer_and_size(rig_factory):
    rig = rig_factory()
    weights = random_weights(rig.cfg, 3)
    wq = weights[(WQ, 0)]
    cases = [
        (f"unknown tensor id {rig.gpu.lib.ARC_TENSOR_COUNT}", lambda: rig.upload(rig.gpu.lib.ARC_TENSOR_COUNT, 0, wq)),
        ("unknown tensor id -1", lambda: rig.upload(-1, 0, wq)),
        ("ARC_TENSOR_WQ is a per-layer tensor", lambda: rig.upload(WQ, 2, wq)),
        ("ARC_TENSOR_WQ is a per-layer tensor", lambda: rig.upload(WQ, -1, wq)),
        ("ARC_TENSOR_EMBED is a global tensor", lambda: rig.upload(EMBED, 1, weights[(EMBED, 0)])),
        ("ARC_TENSOR_BQ: the model was created without q/k/v biases", lambda: rig.upload(BQ, 0, wq[:, 0].copy())),
        ("ARC_TENSOR_LM_HEAD: the model ties", lambda: rig.upload(LM_HEAD, 0, weights[(EMBED, 0)])),
        (f"ARC_TENSOR_WQ \\(layer 0\\) takes exactly {wq.nbytes} bytes, got {wq.nbytes - 2}",
         lambda: rig.upload(WQ, 0, wq.ravel()[:-1])),
        (f"ARC_TENSOR_WK \\(layer 1\\) takes exactly {wq.nbytes} bytes, got {wq.nbytes + 2}",
         lambda: rig.upload(WK, 1, np.concatenate([wq.ravel(), wq.ravel()[:1]]))),
        ("ARC_TENSOR_ROPE_INV_FREQ \\(layer 1\\) takes exactly 96 bytes",
         lambda: rig.upload(INV_FREQ, 1, np.zeros(25, F32))),
        ("ARC_TENSOR_Q_NORM: the model was created without q/k norms", lambda: rig.upload(16, 0, wq[0].copy())),
    ]
    for message, call in cases:
        with pytest.raises(arcpy.InvalidArgumentError, match=message):
            _lib.check(call())


def test_model_forward_is_refused_until_every_tensor_is_uploaded(rig_factory):
    rig = rig_factory(tied_embeddings=0, qkv_bias=1)
    weights = random_weights(rig.cfg, 4)
    rig.upload_all(weights, skip={(WK, 1), (LM_HEAD, 0)})
    _lib.check(begin(rig.gpu.ffi, rig.gpu.lib, rig.loop, token_input=(1, 0)))
    with pytest.raises(arcpy.InvalidArgumentError, match="ARC_TENSOR_WK of layer 1 was never uploaded"):
        _lib.check(rig.gpu.lib.arc_model_forward(rig.model, rig.loop))
    _lib.check(rig.upload(WK, 1, weights[(WK, 1)]))
    with pytest.raises(arcpy.InvalidArgumentError, match="ARC_TENSOR_LM_HEAD was never uploaded"):
        _lib.check(rig.gpu.lib.arc_model_forward(rig.model, rig.loop))
    _lib.check(rig.upload(LM_HEAD, 0, weights[(LM_HEAD, 0)]))
    _lib.check(rig.gpu.lib.arc_model_forward(rig.model, rig.loop))
    rig.gpu.wait()


def test_model_forward_refuses_a_loop_it_cannot_serve(rig_factory, gpu):
    rig = rig_factory()
    rig.upload_all(random_weights(rig.cfg, 5))
    ffi, lib = gpu.ffi, gpu.lib
    for vocab, max_seq, message in [(rig.cfg["vocab"] + 1, 8, "vocab"), (16, rig.cfg["max_seq"] + 1, "max_seq")]:
        lp = ffi.new("arc_loop **")
        _lib.check(lib.arc_loop_create(gpu.ctx, vocab, max_seq, 8, lp))
        try:
            for forward in (lib.arc_model_forward, lib.arc_model_forward_commit):
                with pytest.raises(arcpy.InvalidArgumentError, match=message):
                    _lib.check(forward(rig.model, lp[0]))
        finally:
            lib.arc_loop_destroy(lp[0])


@pytest.mark.parametrize("overrides", [
    {},  # stories15M-like: tied, head_dim 48
    dict(dim=256, n_heads=8, n_kv_heads=2, head_dim=32, ffn_dim=512, vocab=1000, tied_embeddings=0, qkv_bias=1),
    dict(dim=512, n_heads=4, n_kv_heads=1, head_dim=128, ffn_dim=1024, vocab=700, max_seq=600, tied_embeddings=0),
])
def test_model_forward_runs_and_is_finite(rig_factory, gpu, overrides):
    rig = rig_factory(**overrides)
    rig.upload_all(random_weights(rig.cfg, 6))
    logits = rig.logits_ptr()
    vocab = rig.cfg["vocab"]
    seen = []
    for pos, tok in enumerate([1, 5, vocab - 1, 0, 7]):
        rig.forward(tok, pos)
        out = gpu.read(logits, F32, vocab)
        assert np.isfinite(out).all(), f"non-finite logits at position {pos}"
        assert out.std() > 0, f"constant logits at position {pos}"
        seen.append(out)
    # The same token at the same position over the same cache gives the same logits.
    rig.forward(7, 4)
    assert np.array_equal(gpu.read(logits, F32, vocab), seen[4])
    if rig.cfg["max_seq"] > 300:
        rig.forward(3, rig.cfg["max_seq"] - 1)  # the last position: chunks past the first take part
        assert np.isfinite(gpu.read(logits, F32, vocab)).all()


@pytest.mark.parametrize("overrides", [
    dict(n_heads=6, n_kv_heads=2),
    dict(ffn_dim=14336),  # the down projection needs over 48 KiB of shared memory: set while capturing
])
def test_model_forward_captured_in_a_graph_replays_at_every_position(rig_factory, gpu, overrides):
    rig = rig_factory(**overrides)
    rig.upload_all(random_weights(rig.cfg, 8))
    ffi, lib = gpu.ffi, gpu.lib
    logits, vocab = rig.logits_ptr(), rig.cfg["vocab"]
    tokens = [3, 1, 4, 1, 5, 9]
    eager = []
    for pos, tok in enumerate(tokens):
        rig.forward(tok, pos)
        eager.append(gpu.read(logits, F32, vocab))
    _lib.check(lib.arc_graph_capture_begin(gpu.ctx))
    try:
        _lib.check(lib.arc_model_forward(rig.model, rig.loop))
    finally:
        gp = ffi.new("arc_graph **")
        _lib.check(lib.arc_graph_capture_end(gpu.ctx, gp))
    graph = gp[0]
    try:
        # One kernel node per operation: the embedding, 5 per layer, the lm_head GEMV.
        nodes = ffi.new("uint64_t *")
        _lib.check(lib.arc_graph_node_count(graph, nodes))
        assert nodes[0] == 2 + 5 * rig.cfg["n_layers"]
        for pos, tok in enumerate(tokens):
            _lib.check(begin(ffi, lib, rig.loop, token_input=(tok, pos)))
            _lib.check(lib.arc_graph_launch(graph))
            got = gpu.read(logits, F32, vocab)
            assert np.array_equal(got, eager[pos]), f"graph replay differs from the eager forward at position {pos}"
    finally:
        gpu.wait()
        lib.arc_graph_destroy(graph)

    # The greedy step: the same nodes, the argmax and its commit in the lm_head's.
    _lib.check(lib.arc_graph_capture_begin(gpu.ctx))
    try:
        _lib.check(lib.arc_model_forward_commit(rig.model, rig.loop))
    finally:
        _lib.check(lib.arc_graph_capture_end(gpu.ctx, gp))
    step = gp[0]
    try:
        _lib.check(lib.arc_graph_node_count(step, nodes))
        assert nodes[0] == 2 + 5 * rig.cfg["n_layers"]
        gpu.wait()
        _lib.check(begin(ffi, lib, rig.loop, reset=True))
        for pos, tok in enumerate(tokens):
            _lib.check(begin(ffi, lib, rig.loop, token_input=(tok, pos)))
            _lib.check(lib.arc_loop_enqueue_step(rig.loop, step, pos + 1))
            assert np.array_equal(gpu.read(logits, F32, vocab), eager[pos])
        state = ffi.new("arc_ring_state *")
        _lib.check(lib.arc_ring_poll(rig.loop, state))
        assert (state.published, state.fault) == (len(tokens), 0)
        got = ffi.new("int32_t[]", len(tokens))
        _lib.check(lib.arc_ring_read(rig.loop, 0, len(tokens), got))
        assert list(got) == [int(np.argmax(e)) for e in eager]
    finally:
        gpu.wait()
        lib.arc_graph_destroy(step)
