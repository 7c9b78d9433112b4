"""GPU tier: the verify forward's products (libarc/model/skinny.cu) against NumPy float64 on the
same bf16 weights and the same inputs, each split in PARTS = 3 bf16 parts held in one array
(PARTS, rows, cols), part q at q * rows * cols: arc_op_split_rows, arc_op_skinny (store, bias,
accumulate) and arc_op_skinny_swiglu, for 1, 3 and 8 activation rows.

Outputs are poisoned with NaN bytes first. A parts output (split_rows' parts, swiglu's h) is
followed by a tail of sentinel words that must survive, and y, (rows, n) float32, lies in an
8-row buffer whose rows past `rows` hold a sentinel that must survive; a parts input is followed
by a tail of NaN words, which must not leak into any output. The stream is waited on by polling
arc_stream_query. Refused arguments must leave every buffer as it was.

The split: p0 = bf16(v), p1 = bf16(v - p0), p2 = bf16(v - p0 - p1), round to nearest even, each
difference exact in float32; a float32 significand is three bf16 ones long, so p0 + p1 + p2 == v
exactly (for v finite and at least 2^-110 in size, where no part falls below bf16's subnormal
step 2^-133), and each part is within half a bf16 step, 2^-8, of the one before.

Tolerance of a product (float32 sums on tensor cores): every term W[n, k] * X_q[r, k] of the 3 k
terms is exact in float32 (a product of two 8-bit significands), so the only error is the float32
accumulation, whose order (MMA k16 steps, 8 warps' interleaved chunks, their sum) is not NumPy's;
as in the GEMM's tests, we allow a few ulps of sqrt(terms) times the sum of |terms|:
8 eps32 sqrt(2 k) sum_k |W| sum_q |X_q|. sqrt(2 k), not sqrt(3 k): parts 1 and 2 are 2^-8 and
2^-16 of part 0 and are summed in accumulators apart from part 0's, so their rounding adds a
negligible share to that of part 0's k terms, and 2 k (as when the input had two parts) leaves
room. On the shapes with short k that is far below what dropping part 1 would cost, but not on
long k, and never below what dropping part 2 would (2^-16 of part 0): so
test_skinny_reads_every_part checks parts 1 and 2 each on its own.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from bf16_words import from_bf16, random_bf16, to_bf16
from gpu_buffers import f32p, u16p
from test_gpu_prefill import assert_close

import arcpy
from arcpy import _lib

pytestmark = pytest.mark.gpu

F32 = np.float32
F64 = np.float64
EPS32 = float(np.finfo(np.float32).eps)
PARTS = 3                      # ARC_SPLIT_PARTS (test_split_parts_constant)
MAX_ROWS = 8
SENTINEL = F32(-12345.5)       # y rows past `rows`
SENTINEL_WORD = np.uint16(0x3F9D)  # the tail after a parts output (a finite bf16)
NAN_WORD = np.uint16(0xFFFF)
EXACT_MIN = 2.0 ** -110        # below this a split need not be exact (module docstring)
# silu and the product in float32 (expf within 2 ulps, then a sum, a quotient, a product, each
# rounded once) move h by a few ulps of itself; the split of h is exact.
SWIGLU_RTOL = 16 * EPS32


def split(v):
    """float32 (rows, cols) -> (PARTS, rows, cols) bf16 words: p0 = bf16(v), r1 = v - p0,
    p1 = bf16(r1), p2 = bf16(r1 - p1) (both differences exact in float32)."""
    v = np.asarray(v, dtype=F32)
    p0 = to_bf16(v)
    r1 = v - from_bf16(p0)
    p1 = to_bf16(r1)
    return np.stack([p0, p1, to_bf16(r1 - from_bf16(p1))])


def parts_sum(parts):
    """The float64 sum of the parts (exact: their bits lie within one float32 significand's span)."""
    p = from_bf16(parts).astype(F64)
    return p[0] + p[1] + p[2]


def check_split(what, parts, v) -> None:
    """parts (PARTS, rows, cols) sum to v (float32) exactly where v is finite and not tiny, and
    each part is within 2^-8 of the one before."""
    v64 = np.asarray(v, dtype=F32).astype(F64)
    exact = np.isfinite(v64) & ((np.abs(v64) >= EXACT_MIN) | (v64 == 0))
    bad = exact & (parts_sum(parts) != v64)
    assert not bad.any(), f"{what}: p0 + p1 + p2 != v at {np.argwhere(bad)[:5].tolist()}"
    p = np.abs(from_bf16(parts).astype(F64))
    assert (p[1] <= p[0] * 2.0 ** -8).all(), f"{what}: part 1 exceeds half a bf16 step of part 0"
    assert (p[2] <= p[1] * 2.0 ** -8).all(), f"{what}: part 2 exceeds half a bf16 step of part 1"


def check_split_of_own_sum(what, parts):
    """parts are the exact split of a float32 value (the kernel's): their sum is a float32, and
    splitting it in NumPy gives the same bits. Returns that value."""
    total = parts_sum(parts)
    assert np.isfinite(total).all(), f"{what}: parts not finite (left unwritten?)"
    v = np.where(total == 0, from_bf16(parts[0]), total.astype(F32))  # -0 keeps its sign in p0 alone
    check_split(what, parts, v)
    assert np.array_equal(parts, split(v)), f"{what}: the parts are not the split of their sum"
    return v


def product_bound(parts, w64, k):
    """The accumulation's tolerance (module docstring), shaped (rows, n)."""
    terms = np.abs(from_bf16(parts).astype(F64)).sum(axis=0)
    return 8 * EPS32 * math.sqrt(2 * k) * (terms @ np.abs(w64).T) + 1e-30


def silu64(g):
    return g / (1.0 + np.exp(-g))


def tail_words(cols):
    """The words after a parts array of `cols` columns: a whole 8-row parts array's worth."""
    return PARTS * MAX_ROWS * cols


def upload_parts(gpu, parts):
    """A device copy of parts (PARTS, rows, k), NaN words in a tail after it."""
    k = parts.shape[2]
    return gpu.upload(np.concatenate([parts.ravel(), np.full(tail_words(k), NAN_WORD, dtype=np.uint16)]))


def parts_buffer(gpu, rows, cols):
    """An output buffer for (PARTS, rows, cols) bf16 parts: NaN words, then a SENTINEL_WORD tail."""
    init = np.full(PARTS * rows * cols + tail_words(cols), SENTINEL_WORD, dtype=np.uint16)
    init[: PARTS * rows * cols] = NAN_WORD
    return gpu.upload(init)


def read_parts(gpu, d, what, rows, cols):
    """The parts parts_buffer's array holds, after checking that its tail is untouched."""
    size = PARTS * rows * cols
    got = gpu.read(d, np.uint16, size + tail_words(cols))
    assert (got[size:] == SENTINEL_WORD).all(), f"{what}: words past {PARTS} x {rows} x {cols} were written"
    return got[:size].reshape(PARTS, rows, cols)


def y_buffer(gpu, rows, n, first=None):
    """A (MAX_ROWS, n) float32 buffer: `first` (or NaN bytes) in its first rows, SENTINEL after."""
    d = gpu.alloc(MAX_ROWS * n * 4)
    init = np.full((MAX_ROWS, n), SENTINEL, dtype=F32)
    init[:rows] = first if first is not None else np.full((rows, n), np.nan, dtype=F32)
    gpu.put(d, init)
    return d


def check_untouched(what, got, rows, sentinel):
    """The rows of `got` past `rows` still hold `sentinel`, bit for bit."""
    assert got[rows:].tobytes() == np.full_like(got[rows:], sentinel).tobytes(), f"{what}: rows past {rows} were written"


def run_skinny(gpu, parts, w, bias=None, y0=None):
    """arc_op_skinny of x (rows, k, in parts) @ w (n, k)^T: the whole (MAX_ROWS, n) y buffer after it."""
    _, rows, k = parts.shape
    n = w.shape[0]
    d_x, d_w = upload_parts(gpu, parts), gpu.upload(w)
    d_y = y_buffer(gpu, rows, n, y0)
    d_b = u16p(gpu, gpu.upload(bias)) if bias is not None else gpu.ffi.NULL
    _lib.check(gpu.lib.arc_op_skinny(gpu.ctx, u16p(gpu, d_x), u16p(gpu, d_w), rows, n, k, d_b, int(y0 is not None),
                                     f32p(gpu, d_y)))
    return gpu.read(d_y, F32, MAX_ROWS * n).reshape(MAX_ROWS, n)


def test_split_parts_constant(gpu):
    assert gpu.lib.ARC_SPLIT_PARTS == PARTS


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
    d_p = parts_buffer(gpu, rows, cols)
    d_n = u16p(gpu, gpu.upload(norm)) if use_norm else gpu.ffi.NULL
    _lib.check(gpu.lib.arc_op_split_rows(gpu.ctx, f32p(gpu, d_x), rows, cols, d_n, eps, u16p(gpu, d_p)))
    parts = read_parts(gpu, d_p, "split_rows parts", rows, cols)
    if not use_norm:
        # No arithmetic but the split itself: bit for bit, and the parts sum to x exactly.
        want = split(x)
        for q in range(PARTS):
            assert np.array_equal(parts[q], want[q]), f"part {q} is not NumPy's (round to nearest even)"
        check_split("split_rows", parts, x)
        return
    # The kernel's v is its own float32 norm: the parts must be its exact split ...
    check_split_of_own_sum(f"split_rows {rows}x{cols} norm", parts)
    # ... and v near the float64 norm: the norm in float32 (a sum of squares in another order,
    # rsqrtf within 2 ulps, two products) moves v by well under 64 eps32 of itself.
    x64 = x.astype(F64)
    v = x64 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + eps) * from_bf16(norm).astype(F64)
    assert_close(f"split_rows {rows}x{cols} norm", parts_sum(parts), v, 1e-30, 64 * EPS32)


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
    parts = split(rng.standard_normal((rows, k), dtype=F32) * F32(2.0))
    w = random_bf16(rng, (n, k), 1.0 / math.sqrt(k))
    w64 = from_bf16(w).astype(F64)
    want = parts_sum(parts) @ w64.T
    tol = product_bound(parts, w64, k)
    bias = y0 = None
    if variant == "bias":
        bias = random_bf16(rng, n, 0.5)
        want = want + from_bf16(bias).astype(F64)
        tol = tol + 2 * EPS32 * np.abs(from_bf16(bias))
    if variant == "accumulate":
        y0 = rng.standard_normal((rows, n), dtype=F32)
        want = want + y0
        tol = tol + 2 * EPS32 * np.abs(y0)
    got = run_skinny(gpu, parts, w, bias, y0)
    check_untouched(f"skinny {n}x{k} rows={rows}", got, rows, SENTINEL)
    assert_close(f"skinny {n}x{k} rows={rows} {variant}", got[:rows], want, tol, 2 * EPS32)


@pytest.mark.parametrize("n,k", [(100, 576), (4096, 4096)])
@pytest.mark.parametrize("part", [1, 2])
def test_skinny_reads_every_part(gpu, n, k, part):
    """Every part but one all zero: the whole product comes from that one."""
    rng = np.random.default_rng(n + k + part)
    parts = np.zeros((PARTS, MAX_ROWS, k), dtype=np.uint16)
    parts[part] = random_bf16(rng, (MAX_ROWS, k))
    w = random_bf16(rng, (n, k), 1.0 / math.sqrt(k))
    w64 = from_bf16(w).astype(F64)
    got = run_skinny(gpu, parts, w)
    assert_close(f"skinny {n}x{k} part {part} only", got, from_bf16(parts[part]).astype(F64) @ w64.T,
                 product_bound(parts, w64, k), 2 * EPS32)


@pytest.mark.parametrize("n,k", [(100, 576), (40008, 64), (4096, 4096)])
def test_skinny_rows_are_independent_and_runs_repeat_bit_for_bit(gpu, n, k):
    """Each output is its own fixed-order sum: the same bits run after run, and a row's results do
    not depend on which other rows ride along (the MMA's columns do not mix)."""
    rng = np.random.default_rng(3 * n + k)
    parts = split(rng.standard_normal((MAX_ROWS, k), dtype=F32))
    w = random_bf16(rng, (n, k), 1.0 / math.sqrt(k))
    first = run_skinny(gpu, parts, w)
    again = run_skinny(gpu, parts, w)
    assert np.array_equal(first.view(np.uint32), again.view(np.uint32)), "two runs differ"
    alone = run_skinny(gpu, np.ascontiguousarray(parts[:, 5:6]), w)  # a 1-row parts array: row 5's parts
    assert np.array_equal(alone[0].view(np.uint32), first[5].view(np.uint32)), "row 5 depends on the others"


# --- arc_op_skinny_swiglu ---------------------------------------------------------------------------

@pytest.mark.parametrize("n,k", [(8, 32), (40, 576), (1536, 576), (2048, 4096), (64, 14336)])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_skinny_swiglu_matches_numpy(gpu, n, k, rows):
    rng = np.random.default_rng(n * 13 + k + rows)
    parts = split(rng.standard_normal((rows, k), dtype=F32) * F32(2.0))
    w = random_bf16(rng, (2 * n, k), 1.0 / math.sqrt(k))
    w64 = from_bf16(w).astype(F64)
    x64 = parts_sum(parts)
    g, u = x64 @ w64[:n].T, x64 @ w64[n:].T
    want = silu64(g) * u
    # The products' error through silu (slope below 1.1) and the product; then silu and the
    # product in float32 (SWIGLU_RTOL); the split of h adds nothing.
    eg, eu = product_bound(parts, w64[:n], k), product_bound(parts, w64[n:], k)
    tol = 1.1 * eg * np.abs(u) + eu * np.abs(silu64(g)) + eg * eu

    d_x, d_w = upload_parts(gpu, parts), gpu.upload(w)
    d_h = parts_buffer(gpu, rows, n)
    _lib.check(gpu.lib.arc_op_skinny_swiglu(gpu.ctx, u16p(gpu, d_x), u16p(gpu, d_w), rows, n, k, u16p(gpu, d_h)))
    h = read_parts(gpu, d_h, "h", rows, n)
    check_split_of_own_sum(f"skinny_swiglu {n}x{k} rows={rows} h", h)
    assert_close(f"skinny_swiglu {n}x{k} rows={rows}", parts_sum(h), want, tol, SWIGLU_RTOL)


# --- refused arguments ------------------------------------------------------------------------------

def test_refused_arguments_change_nothing(gpu):
    ffi, lib, ctx = gpu.ffi, gpu.lib, gpu.ctx
    n, k = 64, 64
    rng = np.random.default_rng(11)
    inits = {
        "x parts": split(rng.standard_normal((MAX_ROWS, k), dtype=F32)),
        "w": random_bf16(rng, (2 * n, k), 0.1),
        "bias": random_bf16(rng, n, 0.5),
        "norm": random_bf16(rng, k, 1.0),
        "x": rng.standard_normal((MAX_ROWS, k), dtype=F32),
        "y": np.full((MAX_ROWS, n), SENTINEL, dtype=F32),
        "h": np.full((PARTS, MAX_ROWS, n), SENTINEL_WORD, dtype=np.uint16),
        "parts": np.full((PARTS, MAX_ROWS, k), SENTINEL_WORD, dtype=np.uint16),
    }
    d = {name: gpu.upload(a) for name, a in inits.items()}
    P, W, B, N = (u16p(gpu, d[name]) for name in ("x parts", "w", "bias", "norm"))
    X, Y, H, S, NULL = f32p(gpu, d["x"]), f32p(gpu, d["y"]), u16p(gpu, d["h"]), u16p(gpu, d["parts"]), ffi.NULL

    def odd(p):  # p one byte on: aligned to nothing
        return ffi.cast(ffi.typeof(p), ffi.cast("char *", p) + 1)

    def skinny(x=P, w=W, rows=8, n=n, k=k, bias=NULL, accumulate=0, y=Y, c=ctx):
        return lambda: lib.arc_op_skinny(c, x, w, rows, n, k, bias, accumulate, y)

    def swiglu(x=P, w=W, rows=8, n=n, k=k, h=H, c=ctx):
        return lambda: lib.arc_op_skinny_swiglu(c, x, w, rows, n, k, h)

    def split_rows(x=X, rows=8, cols=k, norm=NULL, eps=1e-5, parts=S, c=ctx):
        return lambda: lib.arc_op_split_rows(c, x, rows, cols, norm, eps, parts)

    cases = [
        ("rows must be in 1..8", skinny(rows=0)),
        ("rows must be in 1..8", skinny(rows=9)),
        ("k must be a positive multiple of 32", skinny(k=48)),
        ("k must be a positive multiple of 32", skinny(k=0)),
        ("n must be positive", skinny(n=0)),
        ("n must be positive", skinny(n=-1)),
        ("bias and accumulate", skinny(bias=B, accumulate=1)),
        ("null pointer", skinny(x=NULL)),
        ("null pointer", skinny(w=NULL)),
        ("null pointer", skinny(y=NULL)),
        ("16-byte aligned", skinny(x=P + 1)),
        ("16-byte aligned", skinny(w=W + 1)),
        ("8-byte aligned", skinny(y=Y + 1)),
        ("y must not alias x", skinny(y=ffi.cast("float *", P))),
        ("y must not alias x or w", skinny(y=ffi.cast("float *", W))),
        ("ctx is null", skinny(c=NULL)),
        ("rows must be in 1..8", swiglu(rows=0)),
        ("rows must be in 1..8", swiglu(rows=9)),
        ("k must be a positive multiple of 32", swiglu(k=48)),
        ("n must be positive", swiglu(n=0)),
        ("n must be a multiple of 8", swiglu(n=60)),
        ("null pointer", swiglu(x=NULL)),
        ("null pointer", swiglu(w=NULL)),
        ("null pointer", swiglu(h=NULL)),
        ("16-byte aligned", swiglu(x=P + 1)),
        ("2-byte aligned", swiglu(h=odd(H))),
        ("h must not alias x", swiglu(h=P)),
        ("ctx is null", swiglu(c=NULL)),
        ("rows must be in 1..8", split_rows(rows=0)),
        ("rows must be in 1..8", split_rows(rows=9)),
        ("cols must be a positive multiple of 8", split_rows(cols=60)),
        ("cols must be a positive multiple of 8", split_rows(cols=0)),
        ("eps must be positive", split_rows(norm=N, eps=0.0)),
        ("null pointer", split_rows(x=NULL)),
        ("null pointer", split_rows(parts=NULL)),
        ("16-byte aligned", split_rows(x=X + 1)),
        ("16-byte aligned", split_rows(norm=N + 1)),
        ("16-byte aligned", split_rows(parts=S + 1)),
        ("parts and x must be distinct", split_rows(parts=ffi.cast("uint16_t *", X))),
        ("ctx is null", split_rows(c=NULL)),
    ]
    for message, call in cases:
        assert call() == lib.ARC_INVALID_ARGUMENT, message
        with pytest.raises(arcpy.InvalidArgumentError, match=message) as info:
            _lib.check(call())
        assert info.value.status == lib.ARC_INVALID_ARGUMENT
    gpu.wait()  # nothing was launched, and nothing failed on the device
    for name, a in inits.items():
        got = gpu.read(d[name], np.uint8, a.nbytes)
        assert got.tobytes() == a.tobytes(), f"{name} was changed"
