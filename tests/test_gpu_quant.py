"""The quantized GEMVs and the dequantization on the GPU, against NumPy (arcpy.model.quant).

The oracle of a product is `qgemv_reference`: the same input quantization and the same exact
integer sums per unit, scaled and added in float64. The device adds the units' float32 dots in
another order, so the tolerance is a few float32 ulps of the sum of the units' |dots| (times the
square root of their count), as for the bf16 GEMV. Against the float product of the dequantized
weights the input's int8 rounding adds up to amax / 254 per value: checked with that bound."""

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gpu_buffers import f32p, u16p

from arcpy import _lib, codes
from arcpy.model.quant import SUPER_FORMATS, dequantize, qgemv_reference, quantize_input, row_bytes
from arcpy.model.quant_pack import from_gguf, random_quant

pytestmark = pytest.mark.gpu

F32 = np.float32
EPS32 = float(np.finfo(np.float32).eps)
FORMATS = {name: f for f, name in codes.FORMAT_NAMES.items() if f != codes.FORMAT_BF16}

# Every work split: 4 rows a task, 2, 1 with split-K 2 and 4; long rows; the lm_head's vocabularies.
SHAPES = [(4096, 4096), (1024, 4096), (300, 2048), (64, 4096), (96, 14336), (2048, 256), (49152, 512),
          (7, 8192), (14336, 4096)]


def to_bf16(x):
    u = np.asarray(x, F32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(w):
    return (np.asarray(w, np.uint16).astype(np.uint32) << 16).view(F32)


def rmsnorm(x, g, eps):
    inv = F32(1.0) / np.sqrt(np.mean(x.astype(np.float64) ** 2) + eps)
    return (x * F32(inv) * g).astype(F32)


def unit_tolerance(qt, xin):
    """A few float32 ulps of the sum of |unit dots| per row, times sqrt(units)."""
    w = np.abs(dequantize(qt)).astype(np.float64)
    units = qt.shape[1] // 32
    return 16 * EPS32 * math.sqrt(units) * (w @ np.abs(xin.astype(np.float64))) + 1e-30


def run_qgemv(gpu, qt, x, bias=None, norm=None, y0=None, eps=1e-5):
    rows, cols = qt.shape
    d_w, d_x, d_y = gpu.upload(qt.data), gpu.upload(x), gpu.alloc(rows * 4)
    if y0 is not None:
        gpu.put(d_y, y0)
    else:
        gpu.poison(d_y, rows * 4)
    d_b = u16p(gpu, gpu.upload(bias)) if bias is not None else gpu.ffi.NULL
    d_n = u16p(gpu, gpu.upload(norm)) if norm is not None else gpu.ffi.NULL
    _lib.check(gpu.lib.arc_op_qgemv(gpu.ctx, qt.format, d_w, f32p(gpu, d_x), rows, cols, d_b, d_n, eps,
                                    int(y0 is not None), f32p(gpu, d_y)))
    return gpu.read(d_y, F32, rows)


@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_qgemv_matches_the_integer_reference(gpu, name, rows, cols):
    if rows * cols > 20_000_000 and name not in ("Q4_K", "Q6_K", "Q8_0"):
        pytest.skip("the largest shapes run in the Q4_K_M and Q8_0 formats")
    rng = np.random.default_rng(rows * 7 + cols + FORMATS[name])
    qt = random_quant(FORMATS[name], (rows, cols), rng)
    x = rng.standard_normal(cols, dtype=F32) * F32(2.0)
    got = run_qgemv(gpu, qt, x)
    want = qgemv_reference(qt, x)
    tol = unit_tolerance(qt, x)
    bad = np.abs(got.astype(np.float64) - want) > tol
    assert not bad.any(), f"{name} {rows}x{cols}: rows {np.flatnonzero(bad)[:5]} differ: " \
                          f"{got[bad][:3]} vs {want[bad][:3]} (tol {tol[bad][:3]})"
    # The input's int8 rounding: at most amax / 254 a value, against the float product.
    xq, dx = quantize_input(x)
    err = np.repeat(dx.astype(np.float64) / 2, 32)
    bound = np.abs(dequantize(qt)).astype(np.float64) @ err + tol
    assert np.all(np.abs(got - dequantize(qt).astype(np.float64) @ x) <= bound)


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("variant", ["bias", "accumulate", "norm", "norm+bias+accumulate"])
def test_qgemv_epilogues(gpu, name, variant):
    rows, cols = 1000, 2048
    rng = np.random.default_rng(FORMATS[name] * 13 + len(variant))
    qt = random_quant(FORMATS[name], (rows, cols), rng)
    x = rng.standard_normal(cols, dtype=F32)
    bias = to_bf16(rng.standard_normal(rows, dtype=F32) * F32(0.5)) if "bias" in variant else None
    norm = to_bf16(F32(1.0) + F32(0.2) * rng.standard_normal(cols, dtype=F32)) if "norm" in variant else None
    y0 = rng.standard_normal(rows, dtype=F32) if "accumulate" in variant else None
    got = run_qgemv(gpu, qt, x, bias, norm, y0)
    xin = rmsnorm(x, from_bf16(norm), 1e-5) if norm is not None else x
    want = qgemv_reference(qt, xin)
    if bias is not None:
        want = want + from_bf16(bias)
    if y0 is not None:
        want = want + y0
    tol = unit_tolerance(qt, xin) * 4 + (8 * EPS32 * np.abs(y0) if y0 is not None else 0)
    assert np.all(np.abs(got - want) <= tol + 1e-6 * np.abs(want))


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("rows,cols", [(4096, 4096), (300, 2048), (14336, 4096)])
def test_qgemv_swiglu(gpu, name, rows, cols):
    rng = np.random.default_rng(FORMATS[name] + rows)
    qt = random_quant(FORMATS[name], (2 * rows, cols), rng)
    x = rng.standard_normal(cols, dtype=F32)
    norm = to_bf16(F32(1.0) + F32(0.2) * rng.standard_normal(cols, dtype=F32))
    d_w, d_x, d_n, d_y = gpu.upload(qt.data), gpu.upload(x), gpu.upload(norm), gpu.alloc(rows * 4)
    gpu.poison(d_y, rows * 4)
    _lib.check(gpu.lib.arc_op_qgemv_swiglu(gpu.ctx, qt.format, d_w, f32p(gpu, d_x), rows, cols, u16p(gpu, d_n),
                                           1e-5, f32p(gpu, d_y)))
    got = gpu.read(d_y, F32, rows)
    both = qgemv_reference(qt, rmsnorm(x, from_bf16(norm), 1e-5))
    gate, up = both[:rows], both[rows:]
    want = gate / (1.0 + np.exp(-gate)) * up
    tol = 1e-4 * (np.abs(gate) + 1) * (np.abs(up) + 1)
    assert np.all(np.abs(got - want) <= tol)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q4_1", "MXFP4", "IQ4_NL", "IQ4_XS", "Q5_0", "Q5_1", "Q3_K",
                                  "Q2_K"])
@pytest.mark.parametrize("rows,cols", [(128256, 4096), (49152, 512), (300, 2048), (100, 256)])
def test_qgemv_argmax_writes_the_logits_and_picks_their_argmax(gpu, name, rows, cols):
    rng = np.random.default_rng(rows + FORMATS[name])
    qt = random_quant(FORMATS[name], (rows, cols), rng)
    x = rng.standard_normal(cols, dtype=F32)
    norm = to_bf16(F32(1.0) + F32(0.2) * rng.standard_normal(cols, dtype=F32))
    plain = run_qgemv(gpu, qt, x, norm=norm)
    d_w, d_x, d_n = gpu.upload(qt.data), gpu.upload(x), gpu.upload(norm)
    d_y, d_out = gpu.alloc(rows * 4), gpu.alloc(8)
    gpu.poison(d_y, rows * 4)
    _lib.check(gpu.lib.arc_op_qgemv_argmax(gpu.ctx, qt.format, d_w, f32p(gpu, d_x), rows, cols, u16p(gpu, d_n),
                                           1e-5, f32p(gpu, d_y), gpu.ffi.cast("int32_t *", d_out),
                                           f32p(gpu, gpu.ffi.cast("char *", d_out) + 4)))
    logits = gpu.read(d_y, F32, rows)
    out = gpu.read(d_out, np.int32, 2)
    np.testing.assert_array_equal(logits.view(np.uint32), plain.view(np.uint32))
    assert out[0] == int(np.argmax(logits)) and out[1:].view(F32)[0] == logits[out[0]]


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("rows,cols", [(300, 2048), (17, 4096), (1024, 256)])
def test_dequantize_gives_the_weights_rounded_to_bf16(gpu, name, rows, cols):
    rng = np.random.default_rng(rows + cols + FORMATS[name])
    qt = random_quant(FORMATS[name], (rows, cols), rng)
    d_w, d_out = gpu.upload(qt.data), gpu.alloc(rows * cols * 2)
    gpu.poison(d_out, rows * cols * 2)
    _lib.check(gpu.lib.arc_op_dequantize(gpu.ctx, qt.format, d_w, rows, cols, u16p(gpu, d_out)))
    got = from_bf16(gpu.read(d_out, np.uint16, rows * cols).reshape(rows, cols))
    want = dequantize(qt)
    # Rounded from float32 values that may differ in the last bit by the order of the formula.
    assert np.all(np.abs(got - want) <= np.abs(want) * 2.0**-8 + 1e-30)


def test_every_finite_mxfp4_exponent_decodes_exactly(gpu):
    """MXFP4's weights are a power of two times a small integer: exact in bf16 from the subnormal
    scales of exponents 0 and 1 (no flush to zero) to the largest finite ones (252)."""
    rows, cols = 4, 32 * 253
    rng = np.random.default_rng(39)
    raw = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)
    raw[..., 0] = np.arange(253, dtype=np.uint8)  # unit u: exponent u
    qt = from_gguf(GGMLQuantizationType.MXFP4, (rows, cols), raw.reshape(rows, -1))
    want = dequantize(qt)
    assert np.isfinite(want).all() and np.count_nonzero(want[:, :64]) > 0
    d_w, d_out = gpu.upload(qt.data), gpu.alloc(rows * cols * 2)
    gpu.poison(d_out, rows * cols * 2)
    _lib.check(gpu.lib.arc_op_dequantize(gpu.ctx, qt.format, d_w, rows, cols, u16p(gpu, d_out)))
    got = gpu.read(d_out, np.uint16, rows * cols).reshape(rows, cols)
    np.testing.assert_array_equal(got, to_bf16(want))


@pytest.mark.parametrize("format,cols,message", [
    (0, 256, "is not a quantized format"), (14, 256, "is not a quantized format"),
    (codes.FORMAT_Q4_K, 384, "multiple of 256"), (codes.FORMAT_Q8_0, 48, "multiple of 32"),
    (codes.FORMAT_IQ4_XS, 384, "multiple of 256"), (codes.FORMAT_MXFP4, 48, "multiple of 32"),
])
def test_bad_formats_and_shapes_are_refused_in_one_line(gpu, format, cols, message):
    d_w, d_x, d_y = gpu.alloc(1 << 16), gpu.alloc(cols * 4), gpu.alloc(64)
    st = gpu.lib.arc_op_qgemv(gpu.ctx, format, d_w, f32p(gpu, d_x), 4, cols, gpu.ffi.NULL, gpu.ffi.NULL, 1e-5, 0,
                              f32p(gpu, d_y))
    assert st == 2  # ARC_INVALID_ARGUMENT
    assert message in gpu.ffi.string(gpu.lib.arc_last_error()).decode()


def test_row_bytes_agree_with_the_library(gpu):
    out = gpu.ffi.new("uint64_t *")
    for name, f in FORMATS.items():
        for cols in (256, 2048, 4096, 14336):
            _lib.check(gpu.lib.arc_format_row_bytes(f, cols, out))
            assert out[0] == row_bytes(f, cols), (name, cols)


# The FFN as the decode runs it: the SwiGLU GEMV hands h to the down GEMV already quantized where
# ffn % 128 == 0 and ffn >= 12288 (14336, with 4096 and 256 columns;
# 512 and 288, an odd number of units: staged). Its h and y must be the bits
# of the two products called one after the other, launch after launch (the tickets reset).
@pytest.mark.parametrize("gate_up,down", [("Q4_K", "Q6_K"), ("Q8_0", "Q8_0"), ("Q4_0", "Q4_1"), ("Q5_K", "Q4_K"),
                                          ("MXFP4", "MXFP4"), ("IQ4_XS", "IQ4_NL"), ("Q5_0", "Q5_1"), ("Q2_K", "Q3_K")])
@pytest.mark.parametrize("dim,ffn", [(4096, 14336), (256, 14336), (256, 512), (512, 288)])
def test_qgemv_ffn_hands_h_over_with_the_bits_of_the_two_products(gpu, gate_up, down, dim, ffn):
    if FORMATS[down] in SUPER_FORMATS and ffn % 256:
        pytest.skip("a down matrix of 256-weight blocks needs ffn % 256 == 0")
    rng = np.random.default_rng(ffn + FORMATS[gate_up] * 7 + FORMATS[down])
    gu = random_quant(FORMATS[gate_up], (2 * ffn, dim), rng)
    dn = random_quant(FORMATS[down], (dim, ffn), rng)
    x = rng.standard_normal(dim, dtype=F32)
    norm = to_bf16(F32(1.0) + F32(0.2) * rng.standard_normal(dim, dtype=F32))
    y0 = rng.standard_normal(dim, dtype=F32)
    d_gu, d_dn, d_x, d_n = gpu.upload(gu.data), gpu.upload(dn.data), gpu.upload(x), gpu.upload(norm)
    d_h, d_y = gpu.alloc(ffn * 4), gpu.upload(y0)
    _lib.check(gpu.lib.arc_op_qgemv_swiglu(gpu.ctx, gu.format, d_gu, f32p(gpu, d_x), ffn, dim, u16p(gpu, d_n),
                                           1e-5, f32p(gpu, d_h)))
    _lib.check(gpu.lib.arc_op_qgemv(gpu.ctx, dn.format, d_dn, f32p(gpu, d_h), dim, ffn, gpu.ffi.NULL,
                                    gpu.ffi.NULL, 1e-5, 1, f32p(gpu, d_y)))
    want_h, want_y = gpu.read(d_h, F32, ffn), gpu.read(d_y, F32, dim)
    assert not np.array_equal(want_y, y0)
    for _ in range(3):
        d_h, d_y = gpu.alloc(ffn * 4), gpu.upload(y0)
        gpu.poison(d_h, ffn * 4)
        _lib.check(gpu.lib.arc_op_qgemv_ffn(gpu.ctx, gu.format, d_gu, dn.format, d_dn, f32p(gpu, d_x), dim, ffn,
                                            u16p(gpu, d_n), 1e-5, f32p(gpu, d_h), f32p(gpu, d_y)))
        assert gpu.read(d_h, F32, ffn).tobytes() == want_h.tobytes()
        got = gpu.read(d_y, F32, dim)
        assert got.tobytes() == want_y.tobytes(), f"{np.count_nonzero(got != want_y)} of {dim} rows differ"
