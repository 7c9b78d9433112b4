"""GPU tier: the verify forward's products (libarc/model/skinny.cu) against NumPy float64 on the
same bf16 weights and the same hi + lo inputs: arc_op_split_rows, arc_op_skinny (store, bias,
accumulate) and arc_op_skinny_swiglu, for 1, 3 and 8 activation rows.

Outputs are poisoned with NaN bytes first; the rows of an output past `rows` hold a sentinel that
must survive (and the input rows past `rows` hold NaN, which must not leak into any output). The
stream is waited on by polling arc_stream_query. Refused arguments must leave every buffer as it
was.

Tolerance of a product (float32 sums on tensor cores): every term W[n, k] * X[r, k] of the 2 k
terms (hi and lo) is exact in float32 (a product of two 8-bit significands), so the only error is
the float32 accumulation, whose order (MMA k16 steps, 8 warps' interleaved chunks, their sum) is
not NumPy's; as in the GEMM's tests, we allow a few ulps of sqrt(terms) times the sum of |terms|:
8 eps32 sqrt(2 k) sum_k |W| (|hi| + |lo|). That is far below what dropping lo would cost on the
shapes with short k, and test_skinny_reads_lo_as_well_as_hi checks lo on its own.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from bf16_words import from_bf16, random_bf16, to_bf16
from gpu_buffers import f32p, u16p

import arcpy
from arcpy import _lib

pytestmark = pytest.mark.gpu

F32 = np.float32
F64 = np.float64
EPS32 = float(np.finfo(np.float32).eps)
MAX_ROWS = 8
SENTINEL = F32(-12345.5)       # y rows past `rows`
SENTINEL_WORD = np.uint16(0x3F9D)  # h_hi, h_lo, hi, lo rows past `rows` (a finite bf16)
NAN_WORD = np.uint16(0xFFFF)
# hi + lo represents a float32 value v within 2^-18 |v| (hi within half a bf16 step, lo rounds the
# remainder likewise); 2^-16 leaves room for the float32 arithmetic that made v.
SPLIT_RTOL = 2.0 ** -16


def assert_close(what, got, want, atol, rtol) -> None:
    """|got - want| <= atol + rtol * |want| everywhere (atol a scalar or shaped as want), got
    finite; else the first mismatches."""
    want = np.asarray(want, dtype=F64)
    got = np.asarray(got, dtype=F64).reshape(want.shape)
    tol = (np.broadcast_to(np.asarray(atol, dtype=F64), want.shape) + rtol * np.abs(want)).ravel()
    got, want = got.ravel(), want.ravel()
    assert np.isfinite(want).all(), f"{what}: the NumPy reference itself is not finite"
    diff = np.abs(got - want)
    bad = ~np.isfinite(got) | (diff > tol)
    if bad.any():
        idx = np.flatnonzero(bad)
        lines = [f"  [{i}] got {got[i]!r} want {want[i]!r} diff {diff[i]:.3g} tol {tol[i]:.3g}" for i in idx[:10]]
        pytest.fail(f"{what}: {idx.size} of {got.size} out of tolerance; first:\n" + "\n".join(lines))


def split(x):
    """float32 -> (hi, lo) bf16 words: hi = bf16(x), lo = bf16(x - hi) (the difference is exact)."""
    x = np.asarray(x, dtype=F32)
    hi = to_bf16(x)
    return hi, to_bf16(x - from_bf16(hi))


def product_bound(hi, lo, w64, k):
    """The accumulation's tolerance (module docstring), shaped (rows, n)."""
    terms = np.abs(from_bf16(hi).astype(F64)) + np.abs(from_bf16(lo).astype(F64))
    return 8 * EPS32 * math.sqrt(2 * k) * (terms @ np.abs(w64).T) + 1e-30


def silu64(g):
    return g / (1.0 + np.exp(-g))


def upload_rows(gpu, words, k):
    """A MAX_ROWS-row bf16 buffer holding `words` (rows, k) and NaN in the rows after them."""
    buf = np.full((MAX_ROWS, k), NAN_WORD, dtype=np.uint16)
    buf[: words.shape[0]] = words
    return gpu.upload(buf)


def y_buffer(gpu, rows, n, first=None):
    """A (MAX_ROWS, n) float32 buffer: `first` (or NaN bytes) in its first rows, SENTINEL after."""
    d = gpu.alloc(MAX_ROWS * n * 4)
    init = np.full((MAX_ROWS, n), SENTINEL, dtype=F32)
    init[:rows] = first if first is not None else np.full((rows, n), np.nan, dtype=F32)
    gpu.put(d, init)
    return d


def words_buffer(gpu, rows, n):
    """A (MAX_ROWS, n) bf16 output buffer: NaN words in its first rows, SENTINEL_WORD after."""
    init = np.full((MAX_ROWS, n), SENTINEL_WORD, dtype=np.uint16)
    init[:rows] = NAN_WORD
    return gpu.upload(init)


def check_untouched(what, got, rows, sentinel):
    """The rows of `got` past `rows` still hold `sentinel`, bit for bit."""
    assert got[rows:].tobytes() == np.full_like(got[rows:], sentinel).tobytes(), f"{what}: rows past {rows} were written"


def run_skinny(gpu, hi, lo, w, bias=None, y0=None):
    """arc_op_skinny of (hi + lo) (rows, k) @ w (n, k)^T: the whole (MAX_ROWS, n) y buffer after it."""
    rows, k = hi.shape
    n = w.shape[0]
    d_hi, d_lo, d_w = upload_rows(gpu, hi, k), upload_rows(gpu, lo, k), gpu.upload(w)
    d_y = y_buffer(gpu, rows, n, y0)
    d_b = u16p(gpu, gpu.upload(bias)) if bias is not None else gpu.ffi.NULL
    _lib.check(gpu.lib.arc_op_skinny(gpu.ctx, u16p(gpu, d_hi), u16p(gpu, d_lo), u16p(gpu, d_w), rows, n, k, d_b,
                                     int(y0 is not None), f32p(gpu, d_y)))
    return gpu.read(d_y, F32, MAX_ROWS * n).reshape(MAX_ROWS, n)


# --- arc_op_split_rows ------------------------------------------------------------------------------

@pytest.mark.parametrize("cols", [8, 576, 4096, 14336])
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("use_norm", [False, True])
def test_split_rows_matches_numpy(gpu, rows, cols, use_norm):
    rng = np.random.default_rng(rows * 100_003 + cols * 7 + use_norm)
    x = rng.standard_normal((rows, cols), dtype=F32) * F32(3.0)
    norm = to_bf16(F32(1.0) + F32(0.2) * rng.standard_normal(cols, dtype=F32)) if use_norm else None
    eps = 1e-5
    d_x = gpu.upload(x)
    d_hi, d_lo = words_buffer(gpu, rows, cols), words_buffer(gpu, rows, cols)
    d_n = u16p(gpu, gpu.upload(norm)) if use_norm else gpu.ffi.NULL
    _lib.check(gpu.lib.arc_op_split_rows(gpu.ctx, f32p(gpu, d_x), rows, cols, d_n, eps, u16p(gpu, d_hi),
                                         u16p(gpu, d_lo)))
    hi = gpu.read(d_hi, np.uint16, MAX_ROWS * cols).reshape(MAX_ROWS, cols)
    lo = gpu.read(d_lo, np.uint16, MAX_ROWS * cols).reshape(MAX_ROWS, cols)
    check_untouched("hi", hi, rows, SENTINEL_WORD)
    check_untouched("lo", lo, rows, SENTINEL_WORD)
    hi, lo = hi[:rows], lo[:rows]
    if not use_norm:
        # No arithmetic but the split itself: bit for bit.
        want_hi, want_lo = split(x)
        assert np.array_equal(hi, want_hi), "hi is not x rounded to nearest even"
        assert np.array_equal(lo, want_lo), "lo is not x - hi rounded to nearest even"
        return
    x64 = x.astype(F64)
    v = x64 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + eps) * from_bf16(norm).astype(F64)
    got = from_bf16(hi).astype(F64) + from_bf16(lo).astype(F64)
    # The norm in float32 (a sum of squares in another order, rsqrtf within 2 ulps, two products)
    # moves v by well under 64 eps32 of itself; the split adds at most 2^-18.
    assert_close(f"split_rows {rows}x{cols} norm", got, v, 1e-30, SPLIT_RTOL + 64 * EPS32)
    hi32, lo32 = from_bf16(hi), from_bf16(lo)
    assert (np.abs(lo32) <= np.abs(hi32) * F32(2.0 ** -8)).all(), "lo exceeds half a bf16 step of hi"


# --- arc_op_skinny ----------------------------------------------------------------------------------

# (n, k): the short model's shapes (k = 576), n off the 16-row tile (100) and off the 32-row one
# (40008: two 16-row tiles a block on an H200), a single k chunk (k = 32), long k (14336), and a
# square 4096.
SKINNY_SHAPES = [(100, 576), (576, 576), (1536, 576), (48, 32), (40008, 64), (64, 14336), (4096, 4096)]


@pytest.mark.parametrize("n,k", SKINNY_SHAPES)
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("variant", ["store", "bias", "accumulate"])
def test_skinny_matches_numpy(gpu, n, k, rows, variant):
    rng = np.random.default_rng(n * 31 + k * 7 + rows + len(variant))
    hi, lo = split(rng.standard_normal((rows, k), dtype=F32) * F32(2.0))
    w = random_bf16(rng, (n, k), 1.0 / math.sqrt(k))
    w64 = from_bf16(w).astype(F64)
    x64 = from_bf16(hi).astype(F64) + from_bf16(lo).astype(F64)
    want = x64 @ w64.T
    tol = product_bound(hi, lo, w64, k)
    bias = y0 = None
    if variant == "bias":
        bias = random_bf16(rng, n, 0.5)
        want = want + from_bf16(bias).astype(F64)
        tol = tol + 2 * EPS32 * np.abs(from_bf16(bias))
    if variant == "accumulate":
        y0 = rng.standard_normal((rows, n), dtype=F32)
        want = want + y0
        tol = tol + 2 * EPS32 * np.abs(y0)
    got = run_skinny(gpu, hi, lo, w, bias, y0)
    check_untouched(f"skinny {n}x{k} rows={rows}", got, rows, SENTINEL)
    assert_close(f"skinny {n}x{k} rows={rows} {variant}", got[:rows], want, tol, 2 * EPS32)


@pytest.mark.parametrize("n,k", [(100, 576), (4096, 4096)])
def test_skinny_reads_lo_as_well_as_hi(gpu, n, k):
    """hi all zero: the whole product comes from lo."""
    rng = np.random.default_rng(n + k)
    lo = random_bf16(rng, (MAX_ROWS, k))
    hi = np.zeros_like(lo)
    w = random_bf16(rng, (n, k), 1.0 / math.sqrt(k))
    w64 = from_bf16(w).astype(F64)
    got = run_skinny(gpu, hi, lo, w)
    assert_close(f"skinny {n}x{k} lo only", got, from_bf16(lo).astype(F64) @ w64.T, product_bound(hi, lo, w64, k),
                 2 * EPS32)


@pytest.mark.parametrize("n,k", [(100, 576), (40008, 64), (4096, 4096)])
def test_skinny_rows_are_independent_and_runs_repeat_bit_for_bit(gpu, n, k):
    """Each output is its own fixed-order sum: the same bits run after run, and a row's results do
    not depend on which other rows ride along (the MMA's columns do not mix)."""
    rng = np.random.default_rng(3 * n + k)
    hi, lo = split(rng.standard_normal((MAX_ROWS, k), dtype=F32))
    w = random_bf16(rng, (n, k), 1.0 / math.sqrt(k))
    first = run_skinny(gpu, hi, lo, w)
    again = run_skinny(gpu, hi, lo, w)
    assert np.array_equal(first.view(np.uint32), again.view(np.uint32)), "two runs differ"
    alone = run_skinny(gpu, hi[5:6], lo[5:6], w)
    assert np.array_equal(alone[0].view(np.uint32), first[5].view(np.uint32)), "row 5 depends on the others"


# --- arc_op_skinny_swiglu ---------------------------------------------------------------------------

@pytest.mark.parametrize("n,k", [(8, 32), (40, 576), (1536, 576), (2048, 4096), (64, 14336)])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_skinny_swiglu_matches_numpy(gpu, n, k, rows):
    rng = np.random.default_rng(n * 13 + k + rows)
    hi, lo = split(rng.standard_normal((rows, k), dtype=F32) * F32(2.0))
    w = random_bf16(rng, (2 * n, k), 1.0 / math.sqrt(k))
    w64 = from_bf16(w).astype(F64)
    x64 = from_bf16(hi).astype(F64) + from_bf16(lo).astype(F64)
    g, u = x64 @ w64[:n].T, x64 @ w64[n:].T
    want = silu64(g) * u
    # The products' error through silu (slope below 1.1) and the product; then silu and the
    # product in float32 and the split of h (SPLIT_RTOL).
    eg, eu = product_bound(hi, lo, w64[:n], k), product_bound(hi, lo, w64[n:], k)
    tol = 1.1 * eg * np.abs(u) + eu * np.abs(silu64(g)) + eg * eu

    d_hi, d_lo, d_w = upload_rows(gpu, hi, k), upload_rows(gpu, lo, k), gpu.upload(w)
    d_hh, d_hl = words_buffer(gpu, rows, n), words_buffer(gpu, rows, n)
    _lib.check(gpu.lib.arc_op_skinny_swiglu(gpu.ctx, u16p(gpu, d_hi), u16p(gpu, d_lo), u16p(gpu, d_w), rows, n, k,
                                            u16p(gpu, d_hh), u16p(gpu, d_hl)))
    h_hi = gpu.read(d_hh, np.uint16, MAX_ROWS * n).reshape(MAX_ROWS, n)
    h_lo = gpu.read(d_hl, np.uint16, MAX_ROWS * n).reshape(MAX_ROWS, n)
    check_untouched("h_hi", h_hi, rows, SENTINEL_WORD)
    check_untouched("h_lo", h_lo, rows, SENTINEL_WORD)
    hh, hl = from_bf16(h_hi[:rows]), from_bf16(h_lo[:rows])
    assert_close(f"skinny_swiglu {n}x{k} rows={rows}", hh.astype(F64) + hl.astype(F64), want, tol, SPLIT_RTOL)
    assert (np.abs(hl) <= np.abs(hh) * F32(2.0 ** -8)).all(), "h_lo exceeds half a bf16 step of h_hi"


# --- refused arguments ------------------------------------------------------------------------------

def test_refused_arguments_change_nothing(gpu):
    ffi, lib, ctx = gpu.ffi, gpu.lib, gpu.ctx
    n, k = 64, 64
    rng = np.random.default_rng(11)
    hi, lo = split(rng.standard_normal((MAX_ROWS, k), dtype=F32))
    d_hi, d_lo, d_w = gpu.upload(hi), gpu.upload(lo), gpu.upload(random_bf16(rng, (2 * n, k), 0.1))
    d_b = gpu.upload(random_bf16(rng, n, 0.5))
    y_init = np.full((MAX_ROWS, n), SENTINEL, dtype=F32)
    words_init = np.full((MAX_ROWS, n), SENTINEL_WORD, dtype=np.uint16)
    d_y, d_h1, d_h2 = gpu.upload(y_init), gpu.upload(words_init), gpu.upload(words_init)
    d_x = gpu.upload(rng.standard_normal((MAX_ROWS, k), dtype=F32))
    H, L, W, B, Y = u16p(gpu, d_hi), u16p(gpu, d_lo), u16p(gpu, d_w), u16p(gpu, d_b), f32p(gpu, d_y)
    H1, H2, X, NULL = u16p(gpu, d_h1), u16p(gpu, d_h2), f32p(gpu, d_x), ffi.NULL
    cases = [
        ("rows must be in 1..8", lambda: lib.arc_op_skinny(ctx, H, L, W, 0, n, k, NULL, 0, Y)),
        ("rows must be in 1..8", lambda: lib.arc_op_skinny(ctx, H, L, W, 9, n, k, NULL, 0, Y)),
        ("k must be a positive multiple of 32", lambda: lib.arc_op_skinny(ctx, H, L, W, 8, n, 48, NULL, 0, Y)),
        ("k must be a positive multiple of 32", lambda: lib.arc_op_skinny(ctx, H, L, W, 8, n, 0, NULL, 0, Y)),
        ("n must be positive", lambda: lib.arc_op_skinny(ctx, H, L, W, 8, 0, k, NULL, 0, Y)),
        ("bias and accumulate", lambda: lib.arc_op_skinny(ctx, H, L, W, 8, n, k, B, 1, Y)),
        ("null pointer", lambda: lib.arc_op_skinny(ctx, H, NULL, W, 8, n, k, NULL, 0, Y)),
        ("16-byte aligned", lambda: lib.arc_op_skinny(ctx, H + 1, L, W, 8, n, k, NULL, 0, Y)),
        ("8-byte aligned", lambda: lib.arc_op_skinny(ctx, H, L, W, 8, n, k, NULL, 0, Y + 1)),
        ("ctx is null", lambda: lib.arc_op_skinny(NULL, H, L, W, 8, n, k, NULL, 0, Y)),
        ("rows must be in 1..8", lambda: lib.arc_op_skinny_swiglu(ctx, H, L, W, 0, n, k, H1, H2)),
        ("rows must be in 1..8", lambda: lib.arc_op_skinny_swiglu(ctx, H, L, W, 9, n, k, H1, H2)),
        ("k must be a positive multiple of 32", lambda: lib.arc_op_skinny_swiglu(ctx, H, L, W, 8, n, 48, H1, H2)),
        ("n must be a multiple of 8", lambda: lib.arc_op_skinny_swiglu(ctx, H, L, W, 8, 60, k, H1, H2)),
        ("must be distinct", lambda: lib.arc_op_skinny_swiglu(ctx, H, L, W, 8, n, k, H1, H1)),
        ("rows must be in 1..8", lambda: lib.arc_op_split_rows(ctx, X, 0, k, NULL, 1e-5, H1, H2)),
        ("rows must be in 1..8", lambda: lib.arc_op_split_rows(ctx, X, 9, k, NULL, 1e-5, H1, H2)),
        ("cols must be a positive multiple of 8", lambda: lib.arc_op_split_rows(ctx, X, 8, 60, NULL, 1e-5, H1, H2)),
        ("eps must be positive", lambda: lib.arc_op_split_rows(ctx, X, 8, k, B, 0.0, H1, H2)),
    ]
    for message, call in cases:
        assert call() == lib.ARC_INVALID_ARGUMENT, message
        with pytest.raises(arcpy.InvalidArgumentError, match=message) as info:
            _lib.check(call())
        assert info.value.status == lib.ARC_INVALID_ARGUMENT
    gpu.wait()  # nothing was launched, and nothing failed on the device
    assert np.array_equal(gpu.read(d_y, F32, y_init.size).view(np.uint32), y_init.ravel().view(np.uint32))
    for d in (d_h1, d_h2):
        assert np.array_equal(gpu.read(d, np.uint16, words_init.size), words_init.ravel())
