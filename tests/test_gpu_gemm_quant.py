"""GPU tier: the prefill's products over packed weights (arc_op_gemm_q, arc_op_gemm_swiglu_q) give the
bits of the bf16 products over arc_op_dequantize's matrix (marker `gpu`).

The prefix cache's granule of 1 rests on this: a chunk of up to 128 tokens reads quantized matrices
packed, a longer one reads them dequantized, and a KV row must not depend on which chunk wrote it.
Each product at several row counts and offsets is compared with the same rows of a 2,048-row bf16
product (CUTLASS's wgmma kernel or gemm.cu's largest tiles), word for word."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_buffers import f32p, u16p

from arcpy import _lib, codes
from arcpy.model.quant import SUPER_FORMATS
from arcpy.model.quant_pack import random_quant

pytestmark = pytest.mark.gpu

FORMATS = {name: f for f, name in codes.FORMAT_NAMES.items() if f != codes.FORMAT_BF16}
M_FULL = 2048
# (first row, rows): one token, partial tiles, a tile, two, the most the prefill sends here, beyond it.
PIECES = [(0, 1), (5, 7), (64, 64), (100, 72), (0, 128), (300, 129), (1000, 300)]


def bf16(rng, shape, scale=1.0):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def shapes(fmt):
    """(n, k): a model's square, a partial last tile of rows, and for the 32-unit formats a k whose last
    stage holds one unit."""
    return [(2048, 2048), (1000, 1536)] + ([] if fmt in SUPER_FORMATS else [(576, 544)])


def cases():
    return [(name, n, k) for name, f in sorted(FORMATS.items()) for n, k in shapes(f)]


@pytest.mark.parametrize("name,n,k", cases())
@pytest.mark.parametrize("epilogue", ["store", "bias", "accumulate"])
def test_a_packed_product_gives_the_bits_of_the_dequantized_one(gpu, name, n, k, epilogue):
    fmt = FORMATS[name]
    rng = np.random.default_rng(n + k + fmt)
    qt = random_quant(fmt, (n, k), rng)
    a = bf16(rng, (M_FULL, k))
    c0 = rng.standard_normal((M_FULL, n)).astype(np.float32)
    d_q, d_a = gpu.upload(qt.data), gpu.upload(a)
    d_w, d_c = gpu.alloc(n * k * 2), gpu.alloc(M_FULL * n * 4)
    bias = gpu.upload(bf16(rng, (n,))) if epilogue == "bias" else None
    d_b = u16p(gpu, bias) if bias is not None else gpu.ffi.NULL
    acc = int(epilogue == "accumulate")
    _lib.check(gpu.lib.arc_op_dequantize(gpu.ctx, fmt, d_q, n, k, u16p(gpu, d_w)))
    gpu.put(d_c, c0)
    _lib.check(gpu.lib.arc_op_gemm_bf16(gpu.ctx, u16p(gpu, d_a), u16p(gpu, d_w), M_FULL, n, k, d_b, acc, f32p(gpu, d_c)))
    full = gpu.read(d_c, np.float32, M_FULL * n).reshape(M_FULL, n)
    differ = {}
    for r0, m in PIECES:
        gpu.put(d_c, c0[r0:r0 + m])
        _lib.check(gpu.lib.arc_op_gemm_q(gpu.ctx, fmt, u16p(gpu, d_a) + r0 * k, d_q, m, n, k, d_b, acc,
                                         f32p(gpu, d_c)))
        got = gpu.read(d_c, np.float32, m * n).reshape(m, n)
        bad = int(np.count_nonzero(got.view(np.uint32) != full[r0:r0 + m].view(np.uint32)))
        if bad:
            differ[(r0, m)] = bad
    assert not differ, f"rows differ from the dequantized product's (start, rows: words): {differ}"


@pytest.mark.parametrize("name,n,k", [(name, n // 2, k) for name, n, k in cases()])
def test_a_packed_gated_product_gives_the_bits_of_the_dequantized_one(gpu, name, n, k):
    fmt = FORMATS[name]
    rng = np.random.default_rng(7 * n + k + fmt)
    qt = random_quant(fmt, (2 * n, k), rng)
    a = bf16(rng, (M_FULL, k))
    d_q, d_a = gpu.upload(qt.data), gpu.upload(a)
    d_w, d_h = gpu.alloc(2 * n * k * 2), gpu.alloc(M_FULL * n * 2)
    _lib.check(gpu.lib.arc_op_dequantize(gpu.ctx, fmt, d_q, 2 * n, k, u16p(gpu, d_w)))
    _lib.check(gpu.lib.arc_op_gemm_swiglu_bf16(gpu.ctx, u16p(gpu, d_a), u16p(gpu, d_w), M_FULL, n, k, u16p(gpu, d_h)))
    full = gpu.read(d_h, np.uint16, M_FULL * n).reshape(M_FULL, n)
    differ = {}
    for r0, m in PIECES:
        gpu.poison(d_h, m * n * 2)
        _lib.check(gpu.lib.arc_op_gemm_swiglu_q(gpu.ctx, fmt, u16p(gpu, d_a) + r0 * k, d_q, m, n, k, u16p(gpu, d_h)))
        got = gpu.read(d_h, np.uint16, m * n).reshape(m, n)
        bad = int(np.count_nonzero(got != full[r0:r0 + m]))
        if bad:
            differ[(r0, m)] = bad
    assert not differ, f"rows differ from the dequantized product's (start, rows: words): {differ}"


@pytest.mark.parametrize("format,k,message", [
    (14, 256, "is not a quantized format"),
    (codes.FORMAT_Q4_K, 384, "multiple of 256"),
    (codes.FORMAT_IQ4_XS, 384, "multiple of 256"),
    (codes.FORMAT_Q8_0, 48, "multiple of 32"),
    (codes.FORMAT_Q8_0, 44, "multiple of 8"),
])
def test_bad_packed_products_are_refused_in_one_line(gpu, format, k, message):
    d_a, d_w, d_c = gpu.alloc(4 * k * 2), gpu.alloc(1 << 16), gpu.alloc(64 * 4 * 4)
    st = gpu.lib.arc_op_gemm_q(gpu.ctx, format, u16p(gpu, d_a), d_w, 4, 64, k, gpu.ffi.NULL, 0, f32p(gpu, d_c))
    assert st == 2  # ARC_INVALID_ARGUMENT
    assert message in gpu.ffi.string(gpu.lib.arc_last_error()).decode()
