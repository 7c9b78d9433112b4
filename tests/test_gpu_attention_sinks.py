"""GPU tier: gpt-oss's attention sinks (marker `gpu`), through arc_op_attention_sinks and
arc_op_prefill_attention_sinks, which launch the forwards' launchers with each query head's sink:

- the decode's attention at positions where one block writes the output (1, 63) and where the last
  block merges the blocks' partials (64, 700, 5000), and the prefill's, in one segment of keys and
  in segments merged by combine_kernel, against arcpy's NumPy reference causal_attention(...,
  sinks=...) in float64, with the sinks far below the scores (-20), near them (0..2) and far above
  (+15), query groups of 1 and 8, head_dim 64 and 128;
- the verify's rows with sinks (and without): each row has, as bits, the one-row launch's output
  at its position, and the cache the one-row launches leave.

A sink far above the scores leaves the positions a small share of each head's softmax, and the
output is that small: the kernels' error is relative to the share, so each head's absolute
tolerance is the plain tests' (tests/test_gpu_kernels.py, tests/test_gpu_prefill.py) times it.
Inputs are drawn as those tests draw them; outputs are poisoned with NaN bytes first.
"""

from __future__ import annotations

import numpy as np
import pytest
from bf16_words import from_bf16, random_bf16, to_bf16
from gpu_buffers import assert_close, f32p, u16p

import arcpy
from arcpy import _lib
from arcpy.devices.reference_ops import causal_attention

pytestmark = pytest.mark.gpu

F32 = np.float32
BF16_STEP = 2.0 ** -8  # a bf16 rounding moves a value by at most this much of itself
MAX_SEQ = 8192
# (head_dim, n_heads, n_kv_heads): query groups of 1 and 8; heads of 512 (attention_wide.cu's SIMT
# kernel) in a group of 8.
SHAPES = [(64, 4, 4), (64, 16, 2), (128, 4, 4), (128, 16, 2), (512, 16, 2)]
# Each head's sink logit, in the units of the scaled scores (about N(0, 4) here: q is doubled).
SINKS = {"below": lambda rng, h: np.full(h, -20.0), "near": lambda rng, h: rng.uniform(0.0, 2.0, h),
         "above": lambda rng, h: np.full(h, 15.0)}


def sink_words(rng, kind, n_heads) -> np.ndarray:
    """n_heads sink logits of `kind` as bf16 words."""
    return to_bf16(SINKS[kind](rng, n_heads).astype(F32))


def inv_freq_table(hd, theta=10000.0):
    return (theta ** (-2.0 * np.arange(hd // 2, dtype=np.float64) / hd)).astype(F32)


def np_rope(x, positions, inv_freq):
    """x (T, heads, hd) f32 rotated at positions (T,): rotate-half, angle float32(pos) * inv_freq."""
    half = x.shape[-1] // 2
    ang = np.asarray(positions).astype(F32)[:, None, None] * inv_freq
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1).astype(F32)


def reference(q, k, v, start, n_kv, sinks):
    """causal_attention with sinks in float64 of q (T, n_heads, hd) at positions start.. over k, v
    (n_kv, start + T, hd), and the share of each query's softmax its positions hold (T, n_heads, 1):
    the same attention over v of ones."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    out = causal_attention(q, k, v, start, n_kv, sinks=sinks)
    share = causal_attention(q, k, np.ones_like(v), start, n_kv, sinks=sinks)[..., :1]
    return out, share


def sinks_pointer(gpu, words):
    """The sinks on the device, or NULL for none."""
    return gpu.ffi.NULL if words is None else u16p(gpu, gpu.upload(words))


def attention_sinks(gpu, d_qkv, rows, positions, d_f, d_k, d_v, n_heads, n_kv, hd, d_sinks, d_s, done, d_o):
    """arc_op_attention_sinks over device buffers (done: a device pointer or NULL)."""
    _lib.check(gpu.lib.arc_op_attention_sinks(gpu.ctx, f32p(gpu, d_qkv), rows, positions, f32p(gpu, d_f),
                                              u16p(gpu, d_k), u16p(gpu, d_v), n_heads, n_kv, hd, MAX_SEQ, d_sinks,
                                              f32p(gpu, d_s), done, f32p(gpu, d_o)))


def scratch_bytes(gpu, n_heads, hd) -> int:
    sb = gpu.ffi.new("uint64_t *")
    _lib.check(gpu.lib.arc_op_attention_scratch_bytes(n_heads, hd, MAX_SEQ, sb))
    return int(sb[0])


# --- the decode ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(SINKS))
@pytest.mark.parametrize("pos", [1, 63, 64, 700, 5000])
@pytest.mark.parametrize("hd,n_heads,n_kv", SHAPES)
def test_decode_attention_with_sinks_matches_numpy(gpu, hd, n_heads, n_kv, pos, kind):
    rng = np.random.default_rng(hd * 100_000 + n_heads * 10_000 + pos * 10 + list(SINKS).index(kind))
    inv_freq = inv_freq_table(hd)
    q_dim, kv_dim = n_heads * hd, n_kv * hd
    qkv = rng.standard_normal(q_dim + 2 * kv_dim, dtype=F32) * F32(2.0)
    k = random_bf16(rng, (n_kv, MAX_SEQ, hd))
    v = random_bf16(rng, (n_kv, MAX_SEQ, hd))
    k[:, pos:] = 0xFFFF  # NaN: the new row comes from qkv, and nothing past it is read
    v[:, pos:] = 0xFFFF
    sinks = sink_words(rng, kind, n_heads)
    sb = scratch_bytes(gpu, n_heads, hd)
    d_qkv, d_f, d_k, d_v = gpu.upload(qkv), gpu.upload(inv_freq), gpu.upload(k), gpu.upload(v)
    d_s, d_o = gpu.alloc(sb), gpu.alloc(q_dim * 4)
    gpu.poison(d_s, sb)
    gpu.poison(d_o, q_dim * 4)
    attention_sinks(gpu, d_qkv, 1, gpu.position(pos), d_f, d_k, d_v, n_heads, n_kv, hd, sinks_pointer(gpu, sinks),
                    d_s, gpu.ffi.NULL, d_o)
    got = gpu.read(d_o, F32, q_dim).reshape(1, n_heads, hd)
    k_cache = gpu.read(d_k, np.uint16, k.size).reshape(k.shape)
    v_cache = gpu.read(d_v, np.uint16, v.size).reshape(v.shape)

    # The scores use the new row as the cache now holds it (tests/test_gpu_kernels.py checks the store).
    q_rot = np_rope(qkv[:q_dim].reshape(1, n_heads, hd), [pos], inv_freq)
    want, share = reference(q_rot, from_bf16(k_cache[:, : pos + 1]), from_bf16(v_cache[:, : pos + 1]), pos, n_kv,
                            from_bf16(sinks))
    if kind == "above":
        assert share.max() < 0.1, "the sink was meant to hold most of every head's softmax"
    assert_close(f"decode attention, sinks {kind}, hd {hd} heads {n_heads}/{n_kv} pos {pos}", got, want,
                 2e-5 * share, 1e-4)


# --- the prefill --------------------------------------------------------------------------------

# (n, start): positions 0..129 (1, 63, 64 among them) and 650..749 (700) in the first segment of
# 1,024 keys, where a block writes its output; 1000..1059 across the segment's end and 4990..5009
# (5000) in five segments, merged by combine_kernel.
CHUNKS = [(130, 0), (100, 650), (60, 1000), (20, 4990)]


@pytest.mark.parametrize("kind", list(SINKS))
@pytest.mark.parametrize("n,start", CHUNKS)
@pytest.mark.parametrize("hd,n_heads,n_kv", SHAPES)
def test_prefill_attention_with_sinks_matches_numpy(gpu, hd, n_heads, n_kv, n, start, kind):
    rng = np.random.default_rng(hd * 100_000 + n_heads * 10_000 + start * 10 + list(SINKS).index(kind))
    max_seq = start + n + 8
    qkv = rng.standard_normal((n, (n_heads + 2 * n_kv) * hd), dtype=F32)
    qkv[:, : n_heads * hd] *= F32(2.0)  # peaky attention, as tests/test_gpu_prefill.py draws it
    inv_freq = inv_freq_table(hd)
    cache_shape = (n_kv, max_seq, hd)
    k0 = np.full(cache_shape, 0xFFFF, dtype=np.uint16)  # this chunk's rows and those after it: NaN
    v0 = np.full(cache_shape, 0xFFFF, dtype=np.uint16)
    k0[:, :start] = random_bf16(rng, (n_kv, start, hd))
    v0[:, :start] = random_bf16(rng, (n_kv, start, hd))
    sinks = sink_words(rng, kind, n_heads)

    d_qkv, d_inv, d_k, d_v = gpu.upload(qkv), gpu.upload(inv_freq), gpu.upload(k0), gpu.upload(v0)
    d_q, d_out = gpu.alloc(n * n_heads * hd * 2), gpu.alloc(n * n_heads * hd * 2)
    gpu.poison(d_q, n * n_heads * hd * 2)
    gpu.poison(d_out, n * n_heads * hd * 2)
    need = gpu.ffi.new("uint64_t *")
    _lib.check(gpu.lib.arc_op_prefill_attention_scratch_bytes(n_heads, hd, n, start, need))
    assert (need[0] > 0) == (start + n > 1024 and hd <= 256)  # heads past 256: each query alone, no partials
    scratch = f32p(gpu, gpu.alloc(need[0])) if need[0] else gpu.ffi.NULL
    _lib.check(gpu.lib.arc_op_prefill_attention_sinks(gpu.ctx, f32p(gpu, d_qkv), f32p(gpu, d_inv), u16p(gpu, d_k),
                                                      u16p(gpu, d_v), n_heads, n_kv, hd, max_seq, n, start,
                                                      sinks_pointer(gpu, sinks), u16p(gpu, d_q), scratch,
                                                      u16p(gpu, d_out)))
    kc = from_bf16(gpu.read(d_k, np.uint16, k0.size).reshape(cache_shape))[:, : start + n]
    vc = from_bf16(gpu.read(d_v, np.uint16, v0.size).reshape(cache_shape))[:, : start + n]
    qb = from_bf16(gpu.read(d_q, np.uint16, n * n_heads * hd)).reshape(n, n_heads, hd)
    got = from_bf16(gpu.read(d_out, np.uint16, n * n_heads * hd)).reshape(n, n_heads, hd)

    # Attention over what the kernel stored (q as it rounded it). The probabilities and the output
    # are rounded to bf16: a step of each, on the scale of v, times the positions' share.
    want, share = reference(qb, kc, vc, start, n_kv, from_bf16(sinks))
    if kind == "above":
        assert share.max() < 0.1, "the sink was meant to hold most of every head's softmax"
    vmax = float(np.abs(vc).max())
    assert_close(f"prefill attention, sinks {kind}, hd {hd} heads {n_heads}/{n_kv} n {n} start {start}", got, want,
                 2 * BF16_STEP * vmax * share, BF16_STEP)


# --- the verify's rows --------------------------------------------------------------------------

ROWS = 8  # the current token and 7 drafts, as the speculative step verifies them


@pytest.mark.parametrize("kind", ["near", "above", None])
@pytest.mark.parametrize("p", [60, 4990])
@pytest.mark.parametrize("hd,n_heads,n_kv", SHAPES)
def test_verify_rows_with_sinks_are_the_one_row_launches_bits(gpu, hd, n_heads, n_kv, p, kind):
    # Rows p..p + 7: at 60 they cross a tile of 64 (one block writes the output, then the last
    # block merges two), at 4990 the last block merges the partials of 78 or 79 tiles.
    rng = np.random.default_rng(hd * 100_000 + n_heads * 10_000 + p * 10 + (kind is None))
    inv_freq = inv_freq_table(hd)
    q_dim, width = n_heads * hd, (n_heads + 2 * n_kv) * hd
    qkv = rng.standard_normal((ROWS, width), dtype=F32) * F32(2.0)
    k0 = random_bf16(rng, (n_kv, MAX_SEQ, hd))
    v0 = random_bf16(rng, (n_kv, MAX_SEQ, hd))
    k0[:, p:] = 0xFFFF
    v0[:, p:] = 0xFFFF
    d_sinks = sinks_pointer(gpu, None if kind is None else sink_words(rng, kind, n_heads))
    d_f = gpu.upload(inv_freq)
    sb = scratch_bytes(gpu, n_heads, hd)

    # The decode: one launch a row, each reading the rows the launches before it stored.
    d_k, d_v, d_s, d_o = gpu.upload(k0), gpu.upload(v0), gpu.alloc(sb), gpu.alloc(q_dim * 4)
    one = []
    for i in range(ROWS):
        gpu.poison(d_o, q_dim * 4)
        attention_sinks(gpu, gpu.upload(qkv[i]), 1, gpu.position(p + i), d_f, d_k, d_v, n_heads, n_kv, hd, d_sinks,
                        d_s, gpu.ffi.NULL, d_o)
        one.append(gpu.read(d_o, F32, q_dim))
    one = np.stack(one)
    assert np.isfinite(one).all(), "the one-row launches' outputs are not finite"

    # The verify: every row's k and v stored, then the rows attended in one launch.
    d_k2, d_v2, d_s2 = gpu.upload(k0), gpu.upload(v0), gpu.alloc(ROWS * sb)
    d_pos = gpu.upload(np.arange(p, p + ROWS, dtype=np.int32))
    d_done = gpu.upload(np.zeros(ROWS * n_heads, dtype=np.uint32))
    d_o2 = gpu.alloc(ROWS * q_dim * 4)
    gpu.poison(d_s2, ROWS * sb)
    gpu.poison(d_o2, ROWS * q_dim * 4)
    attention_sinks(gpu, gpu.upload(qkv), ROWS, gpu.ffi.cast("int32_t *", d_pos), d_f, d_k2, d_v2, n_heads, n_kv, hd,
                    d_sinks, d_s2, gpu.ffi.cast("uint32_t *", d_done), d_o2)
    rows = gpu.read(d_o2, F32, ROWS * q_dim).reshape(ROWS, q_dim)

    for i in range(ROWS):
        diff = np.flatnonzero(rows[i].view(np.uint32) != one[i].view(np.uint32))
        assert diff.size == 0, (f"row {i} (sinks {kind}): {diff.size} outputs differ from the one-row launch's as "
                                f"bits, first {diff[:3].tolist()}: {rows[i][diff[:3]].tolist()} vs "
                                f"{one[i][diff[:3]].tolist()}")
    assert np.array_equal(gpu.read(d_k2, np.uint16, k0.size), gpu.read(d_k, np.uint16, k0.size)), "k cache"
    assert np.array_equal(gpu.read(d_v2, np.uint16, v0.size), gpu.read(d_v, np.uint16, v0.size)), "v cache"
    assert not gpu.read(d_done, np.uint32, ROWS * n_heads).any(), "the tickets were not left zeroed"


def test_attention_sinks_refuses_rows_it_cannot_take(gpu):
    ffi, lib, ctx = gpu.ffi, gpu.lib, gpu.ctx
    buf = gpu.alloc(1 << 20)
    w, x, pos = u16p(gpu, buf), f32p(gpu, buf), ffi.cast("int32_t *", buf)
    done = ffi.cast("uint32_t *", buf)
    cases = [
        ("rows must be in 1..8", lambda: lib.arc_op_attention_sinks(ctx, x, 0, pos, x, w, w, 4, 4, 64, 16, w, x,
                                                                      done, x)),
        ("rows must be in 1..8", lambda: lib.arc_op_attention_sinks(ctx, x, 9, pos, x, w, w, 4, 4, 64, 16, w, x,
                                                                      done, x)),
        ("null pointer", lambda: lib.arc_op_attention_sinks(ctx, x, 2, pos, x, w, w, 4, 4, 64, 16, w, x,
                                                              ffi.NULL, x)),
        ("multiple of n_kv_heads", lambda: lib.arc_op_attention_sinks(ctx, x, 2, pos, x, w, w, 6, 4, 64, 16, w, x,
                                                                        done, x)),
        ("head_dim must be even", lambda: lib.arc_op_attention_sinks(ctx, x, 1, pos, x, w, w, 4, 4, 63, 16, w, x,
                                                                       ffi.NULL, x)),
        ("head_dim must be even", lambda: lib.arc_op_attention_sinks(ctx, x, 2, pos, x, w, w, 4, 4, 63, 16, w, x,
                                                                       done, x)),
    ]
    for message, call in cases:
        with pytest.raises(arcpy.InvalidArgumentError, match=message):
            _lib.check(call())
    gpu.wait()  # nothing was launched, and nothing failed on the device
