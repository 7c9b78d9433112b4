"""GPU tier: the verify forward's products over quantized weights (libarc/model/qgemv/qgemv_rows.cuh)
against the decode's quantized GEMV, bit for bit: each of the m rows of arc_op_qgemv_rows (plain,
with a fused norm, a bias, a residual add) and of arc_op_qgemv_rows_swiglu must equal, as float32
bits, what arc_op_qgemv or arc_op_qgemv_swiglu gives for that row alone, in every format. That
equality is what makes a quantized model's speculative tokens the plain loop's (arc.h).

The shapes reach every plan of the one-row GEMV (qgemv_rows.cuh: qgemv_plan): 4 and 2 rows a
task, one row with 1, 2 and 4 warps a task (split k), a partial last task, and inputs too wide for
all 8 rows to share one block's shared memory (more launches). Outputs are poisoned with NaN bytes
first, and y lies in an 8-row buffer whose rows past m hold a sentinel that must survive. Refused
arguments must leave every buffer as it was.
"""

from __future__ import annotations

import numpy as np
import pytest
from bf16_words import random_bf16
from gpu_buffers import assert_refused_changing_nothing, f32p, u16p

from arcpy import _lib, codes
from arcpy.model.quant import SUPER_FORMATS
from arcpy.model.quant_pack import random_quant

pytestmark = pytest.mark.gpu

F32 = np.float32
MAX_ROWS = 8
SENTINEL = F32(-12345.5)
EPS = 1e-5
FORMATS = {name: f for f, name in codes.FORMAT_NAMES.items() if f != codes.FORMAT_BF16}

# (rows, cols): 4 rows a task (many rows), 2, 1 with split k over 2 and 4 warps (few long rows), a
# partial last task, and 8 rows too wide for one block (28,672 and 49,152 columns: 2 and 3 launches);
# inputs of 2,048 columns and less are staged in the product's blocks (QROWS_FUSE_COLS), wider ones
# by their own launch.
SHAPES = [(4096, 4096), (2048, 4096), (300, 2048), (64, 4096), (96, 14336), (1003, 2048), (64, 28672),
          (32, 49152), (100, 512), (1536, 256)]


def rows_buffer(gpu, n, first=None):
    """A (MAX_ROWS, n) float32 buffer: `first` in its first rows, SENTINEL after."""
    init = np.full((MAX_ROWS, n), SENTINEL, dtype=F32)
    if first is not None:
        init[:first.shape[0]] = first
    d = gpu.alloc(init.nbytes)
    gpu.put(d, init)
    return d


def one_row(gpu, qt, d_w, x_row, n, bias, norm, y0_row, swiglu):
    """The decode's quantized GEMV of one row: arc_op_qgemv or arc_op_qgemv_swiglu."""
    k = qt.shape[1]
    d_x = gpu.upload(np.ascontiguousarray(x_row))
    d_y = gpu.upload(y0_row.copy()) if y0_row is not None else gpu.upload(np.full(n, np.nan, dtype=F32))
    lib, NULL = gpu.lib, gpu.ffi.NULL
    if swiglu:
        _lib.check(lib.arc_op_qgemv_swiglu(gpu.ctx, qt.format, d_w, f32p(gpu, d_x), n, k, norm or NULL, EPS,
                                           f32p(gpu, d_y)))
    else:
        _lib.check(lib.arc_op_qgemv(gpu.ctx, qt.format, d_w, f32p(gpu, d_x), n, k, bias or NULL, norm or NULL, EPS,
                                    int(y0_row is not None), f32p(gpu, d_y)))
    return gpu.read(d_y, F32, n)


def run_rows(gpu, qt, d_w, x, n, bias, norm, y0, swiglu):
    """arc_op_qgemv_rows(_swiglu) over x (m, k): the whole (MAX_ROWS, n) y buffer after it."""
    m, k = x.shape
    d_x = gpu.upload(x)
    d_s = gpu.alloc(m * k * 4)
    gpu.poison(d_s, m * k * 4)
    d_y = rows_buffer(gpu, n, y0)
    if y0 is None:
        gpu.poison(d_y, m * n * 4)
    lib, NULL = gpu.lib, gpu.ffi.NULL
    if swiglu:
        _lib.check(lib.arc_op_qgemv_rows_swiglu(gpu.ctx, qt.format, d_w, f32p(gpu, d_x), m, n, k, norm or NULL, EPS,
                                                f32p(gpu, d_s), f32p(gpu, d_y)))
    else:
        _lib.check(lib.arc_op_qgemv_rows(gpu.ctx, qt.format, d_w, f32p(gpu, d_x), m, n, k, bias or NULL,
                                         norm or NULL, EPS, int(y0 is not None), f32p(gpu, d_s), f32p(gpu, d_y)))
    return gpu.read(d_y, F32, MAX_ROWS * n).reshape(MAX_ROWS, n)


def check_rows(gpu, name, n, k, m, *, swiglu=False, use_bias=False, use_norm=False, accumulate=False, seed=0):
    rng = np.random.default_rng(seed)
    qt = random_quant(FORMATS[name], (2 * n if swiglu else n, k), rng)
    x = rng.standard_normal((m, k), dtype=F32) * F32(2.0)
    x[0, : min(k, 64)] = 0.0  # a zero unit: amax 0, the staging's scale 0
    bias = u16p(gpu, gpu.upload(random_bf16(rng, n, 0.5))) if use_bias else None
    norm = u16p(gpu, gpu.upload(random_bf16(rng, k, 1.0))) if use_norm else None
    y0 = rng.standard_normal((m, n), dtype=F32) if accumulate else None
    d_w = gpu.upload(qt.data)
    got = run_rows(gpu, qt, d_w, x, n, bias, norm, y0, swiglu)
    what = f"{name} {'swiglu ' if swiglu else ''}{n}x{k} m={m}"
    assert got[m:].tobytes() == np.full_like(got[m:], SENTINEL).tobytes(), f"{what}: rows past {m} were written"
    for i in range(m):
        want = one_row(gpu, qt, d_w, x[i], n, bias, norm, None if y0 is None else y0[i], swiglu)
        assert np.isfinite(want).all(), f"{what}: the one-row GEMV gave non-finite values"
        diff = np.flatnonzero(got[i].view(np.uint32) != want.view(np.uint32))
        assert diff.size == 0, (f"{what}: row {i} differs from the one-row GEMV at {diff.size} outputs, first "
                                f"{diff[:3].tolist()}: {got[i][diff[:3]].tolist()} vs {want[diff[:3]].tolist()}")


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("m", [1, 8])
def test_rows_are_the_one_row_qgemv_bit_for_bit(gpu, name, n, k, m):
    check_rows(gpu, name, n, k, m, seed=n * 31 + k + m + FORMATS[name])


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("variant", ["norm", "bias", "accumulate", "all"])
@pytest.mark.parametrize("k", [4096, 1536])
def test_rows_with_norm_bias_and_residual_are_the_one_row_qgemv(gpu, name, variant, k):
    check_rows(gpu, name, 1003, k, 5, use_norm=variant in ("norm", "all"), use_bias=variant in ("bias", "all"),
               accumulate=variant in ("accumulate", "all"), seed=len(variant) + FORMATS[name] + k)


@pytest.mark.parametrize("n,k", [(14336, 4096), (300, 2048), (64, 14336), (1536, 576)])
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_swiglu_rows_are_the_one_row_qgemv_bit_for_bit(gpu, name, n, k):
    if k % 256 and FORMATS[name] in SUPER_FORMATS:
        k = 512  # the demo model's 576 columns take the formats of 32-weight blocks only
    check_rows(gpu, name, n, k, 8, swiglu=True, use_norm=True, seed=n * 13 + k + FORMATS[name])


def test_swiglu_rows_without_a_norm_and_of_three_rows(gpu):
    check_rows(gpu, "Q4_K", 1024, 2048, 3, swiglu=True, seed=5)


def test_refused_arguments_change_nothing(gpu):
    ffi, lib, ctx = gpu.ffi, gpu.lib, gpu.ctx
    n, k = 64, 256
    rng = np.random.default_rng(11)
    qt = random_quant(codes.FORMAT_Q4_K, (2 * n, k), rng)
    inits = {
        "w": qt.data,
        "norm": random_bf16(rng, k, 1.0),
        "x": rng.standard_normal((MAX_ROWS, k), dtype=F32),
        "scratch": np.full((MAX_ROWS, k), SENTINEL, dtype=F32),
        "y": np.full((MAX_ROWS, n), SENTINEL, dtype=F32),
    }
    d = {name: gpu.upload(a) for name, a in inits.items()}
    W, N = d["w"], u16p(gpu, d["norm"])
    X, S, Y, NULL = f32p(gpu, d["x"]), f32p(gpu, d["scratch"]), f32p(gpu, d["y"]), ffi.NULL
    Q4K = codes.FORMAT_Q4_K

    def rows(f=Q4K, w=W, x=X, m=8, n=n, k=k, norm=NULL, eps=EPS, accumulate=0, s=S, y=Y, c=ctx):
        return lambda: lib.arc_op_qgemv_rows(c, f, w, x, m, n, k, NULL, norm, eps, accumulate, s, y)

    def swiglu(f=Q4K, w=W, x=X, m=8, n=n, k=k, norm=NULL, s=S, y=Y, c=ctx):
        return lambda: lib.arc_op_qgemv_rows_swiglu(c, f, w, x, m, n, k, norm, EPS, s, y)

    cases = [
        ("m must be in 1..8", rows(m=0)),
        ("m must be in 1..8", rows(m=9)),
        ("not a quantized format", rows(f=codes.FORMAT_BF16)),
        ("not a quantized format", rows(f=14)),
        ("cols must be a positive multiple of 256", rows(k=224)),
        ("cols must be a positive multiple of 256", rows(f=codes.FORMAT_IQ4_XS, k=224)),
        ("rows must be positive", rows(n=0)),
        ("accumulate must be 0 or 1", rows(accumulate=2)),
        ("eps must be positive", rows(norm=N, eps=0.0)),
        ("need scratch", rows(s=NULL)),
        ("need scratch", rows(s=Y)),
        ("need scratch", rows(s=X)),
        ("need scratch", rows(s=S + 1)),
        ("null pointer", rows(w=NULL)),
        ("null pointer", rows(x=NULL)),
        ("null pointer", rows(y=NULL)),
        ("16-byte aligned", rows(x=X + 1)),
        ("y must not alias x", rows(y=X)),
        ("ctx is null", rows(c=NULL)),
        ("m must be in 1..8", swiglu(m=9)),
        ("cols must be a positive multiple of 32", swiglu(f=codes.FORMAT_Q8_0, k=48)),
        ("need scratch", swiglu(s=NULL)),
        ("null pointer", swiglu(y=NULL)),
        ("ctx is null", swiglu(c=NULL)),
    ]
    assert_refused_changing_nothing(gpu, cases, d, inits)
