"""GPU tier: the verify forward's products (libarc/model/gemv/gemv_rows.cu) against the decode's GEMV,
bit for bit: each of the m rows of arc_op_gemv_rows (plain, with a fused norm, a bias, a residual
add) and of arc_op_gemv_rows_swiglu must equal, as float32 bits, what arc_op_gemv or
arc_op_gemv_swiglu gives for that row alone. That equality is what makes a speculative step's
tokens the plain loop's (arc.h). The shapes reach every plan of the one-row GEMV (gemv_common.cuh:
gemv_plan): warp-local inputs (short rows), 1, 2, 4 and 8 warps a row task (split k), and inputs
staged whole or in double-buffered chunks (m x cols past 200 KB of float32).

Outputs are poisoned with NaN bytes first, and y lies in an 8-row buffer whose rows past m hold a
sentinel that must survive. Refused arguments must leave every buffer as it was.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from bf16_words import random_bf16
from gpu_buffers import assert_refused_changing_nothing, f32p, u16p

from arcpy import _lib

pytestmark = pytest.mark.gpu

F32 = np.float32
MAX_ROWS = 8
SENTINEL = F32(-12345.5)
EPS = 1e-5

# (rows, cols): warp-local input (cols <= 512 at 4 rows a task, 1,024 at one), the staged input,
# split k over 2, 4 and 8 warps (few rows, long ones), a chunked input (cols 8,192 and 14,336 at
# 8 rows), a partial last task (rows off the task size), and a tiny one (cols 8).
SHAPES = [(64, 8), (100, 576), (576, 1024), (2048, 512), (4096, 4096), (64, 8192), (64, 16384), (64, 32768),
          (4096, 14336), (1003, 2048)]


def rows_buffer(gpu, n, first=None):
    """A (MAX_ROWS, n) float32 buffer: `first` (or NaN) in its first rows, SENTINEL after."""
    init = np.full((MAX_ROWS, n), SENTINEL, dtype=F32)
    m = 0 if first is None else first.shape[0]
    if first is not None:
        init[:m] = first
    d = gpu.alloc(init.nbytes)
    gpu.put(d, init)
    return d


def poisoned(gpu, m, n):
    d = rows_buffer(gpu, n)
    gpu.poison(d, m * n * 4)
    return d


def one_row(gpu, w, x_row, n, k, bias, norm, y0_row, swiglu):
    """The decode's GEMV of one row: arc_op_gemv or arc_op_gemv_swiglu."""
    d_x = gpu.upload(np.ascontiguousarray(x_row))
    d_y = gpu.upload(y0_row.copy()) if y0_row is not None else gpu.upload(np.full(n, np.nan, dtype=F32))
    lib, NULL = gpu.lib, gpu.ffi.NULL
    if swiglu:
        _lib.check(lib.arc_op_gemv_swiglu(gpu.ctx, w, f32p(gpu, d_x), n, k, norm or NULL, EPS, f32p(gpu, d_y)))
    else:
        _lib.check(lib.arc_op_gemv(gpu.ctx, w, f32p(gpu, d_x), n, k, bias or NULL, norm or NULL, EPS,
                                   int(y0_row is not None), f32p(gpu, d_y)))
    return gpu.read(d_y, F32, n)


def run_rows(gpu, w, x, n, k, bias, norm, y0, swiglu):
    """arc_op_gemv_rows(_swiglu) over x (m, k): the whole (MAX_ROWS, n) y buffer after it."""
    m = x.shape[0]
    d_x = gpu.upload(x)
    d_xn = gpu.alloc(MAX_ROWS * k * 4)
    d_y = rows_buffer(gpu, n, y0) if y0 is not None else poisoned(gpu, m, n)
    lib, NULL = gpu.lib, gpu.ffi.NULL
    if swiglu:
        _lib.check(lib.arc_op_gemv_rows_swiglu(gpu.ctx, w, f32p(gpu, d_x), m, n, k, norm or NULL, EPS,
                                               f32p(gpu, d_xn), f32p(gpu, d_y)))
    else:
        _lib.check(lib.arc_op_gemv_rows(gpu.ctx, w, f32p(gpu, d_x), m, n, k, bias or NULL, norm or NULL, EPS,
                                        int(y0 is not None), f32p(gpu, d_xn), f32p(gpu, d_y)))
    return gpu.read(d_y, F32, MAX_ROWS * n).reshape(MAX_ROWS, n)


def check_rows(gpu, n, k, m, *, swiglu=False, use_bias=False, use_norm=False, accumulate=False, seed=0):
    rng = np.random.default_rng(seed)
    w_rows = 2 * n if swiglu else n
    w = u16p(gpu, gpu.upload(random_bf16(rng, (w_rows, k), 1.0 / math.sqrt(k))))
    x = rng.standard_normal((m, k), dtype=F32) * F32(2.0)
    bias = u16p(gpu, gpu.upload(random_bf16(rng, n, 0.5))) if use_bias else None
    norm = u16p(gpu, gpu.upload(random_bf16(rng, k, 1.0))) if use_norm else None
    y0 = rng.standard_normal((m, n), dtype=F32) if accumulate else None
    got = run_rows(gpu, w, x, n, k, bias, norm, y0, swiglu)
    what = f"{'swiglu ' if swiglu else ''}{n}x{k} m={m}"
    assert got[m:].tobytes() == np.full_like(got[m:], SENTINEL).tobytes(), f"{what}: rows past {m} were written"
    for i in range(m):
        want = one_row(gpu, w, x[i], n, k, bias, norm, None if y0 is None else y0[i], swiglu)
        assert np.isfinite(want).all(), f"{what}: the one-row GEMV gave non-finite values"
        diff = np.flatnonzero(got[i].view(np.uint32) != want.view(np.uint32))
        assert diff.size == 0, (f"{what}: row {i} differs from the one-row GEMV at {diff.size} outputs, first "
                                f"{diff[:3].tolist()}: {got[i][diff[:3]].tolist()} vs {want[diff[:3]].tolist()}")


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_rows_are_the_one_row_gemv_bit_for_bit(gpu, n, k, m):
    check_rows(gpu, n, k, m, seed=n * 31 + k + m)


@pytest.mark.parametrize("n,k", [(100, 576), (2048, 512), (4096, 4096), (64, 16384), (1003, 2048)])
@pytest.mark.parametrize("variant", ["norm", "bias", "accumulate", "all"])
def test_rows_with_norm_bias_and_residual_are_the_one_row_gemv(gpu, n, k, variant):
    check_rows(gpu, n, k, 8, use_norm=variant in ("norm", "all"), use_bias=variant in ("bias", "all"),
               accumulate=variant in ("accumulate", "all"), seed=n + k + len(variant))


@pytest.mark.parametrize("n,k", [(8, 32), (64, 576), (1536, 576), (2048, 4096), (64, 14336), (1003, 8192)])
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("use_norm", [False, True])
def test_swiglu_rows_are_the_one_row_gemv_bit_for_bit(gpu, n, k, m, use_norm):
    check_rows(gpu, n, k, m, swiglu=True, use_norm=use_norm, seed=n * 13 + k + m + use_norm)


def test_refused_arguments_change_nothing(gpu):
    ffi, lib, ctx = gpu.ffi, gpu.lib, gpu.ctx
    n, k = 64, 64
    rng = np.random.default_rng(11)
    inits = {
        "w": random_bf16(rng, (2 * n, k), 0.1),
        "norm": random_bf16(rng, k, 1.0),
        "x": rng.standard_normal((MAX_ROWS, k), dtype=F32),
        "xn": np.full((MAX_ROWS, k), SENTINEL, dtype=F32),
        "y": np.full((MAX_ROWS, n), SENTINEL, dtype=F32),
    }
    d = {name: gpu.upload(a) for name, a in inits.items()}
    W, N = (u16p(gpu, d[name]) for name in ("w", "norm"))
    X, XN, Y, NULL = f32p(gpu, d["x"]), f32p(gpu, d["xn"]), f32p(gpu, d["y"]), ffi.NULL

    def rows(w=W, x=X, m=8, n=n, k=k, norm=NULL, eps=EPS, accumulate=0, xn=XN, y=Y, c=ctx):
        return lambda: lib.arc_op_gemv_rows(c, w, x, m, n, k, NULL, norm, eps, accumulate, xn, y)

    def swiglu(w=W, x=X, m=8, n=n, k=k, norm=NULL, xn=XN, y=Y, c=ctx):
        return lambda: lib.arc_op_gemv_rows_swiglu(c, w, x, m, n, k, norm, EPS, xn, y)

    cases = [
        ("m must be in 1..8", rows(m=0)),
        ("m must be in 1..8", rows(m=9)),
        ("cols must be a positive multiple of 8", rows(k=60)),
        ("rows must be positive", rows(n=0)),
        ("accumulate must be 0 or 1", rows(accumulate=2)),
        ("eps must be positive", rows(norm=N, eps=0.0)),
        ("a fused norm needs xn", rows(norm=N, xn=NULL)),
        ("a fused norm needs xn", rows(norm=N, xn=Y)),
        ("null pointer", rows(w=NULL)),
        ("null pointer", rows(x=NULL)),
        ("null pointer", rows(y=NULL)),
        ("16-byte aligned", rows(w=W + 1)),
        ("16-byte aligned", rows(x=X + 1)),
        ("y must not alias x", rows(y=X)),
        ("ctx is null", rows(c=NULL)),
        ("m must be in 1..8", swiglu(m=9)),
        ("cols must be a positive multiple of 8", swiglu(k=12)),
        ("a fused norm needs xn", swiglu(norm=N, xn=NULL)),
        ("null pointer", swiglu(y=NULL)),
        ("ctx is null", swiglu(c=NULL)),
    ]
    assert_refused_changing_nothing(gpu, cases, d, inits)
