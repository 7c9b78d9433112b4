"""Quantized weights (arcpy.model.quant, quant_pack): arc.h's row layout, the repacking of GGUF
blocks into it, the dequantization and the quantized GEMV's arithmetic, random tensors.

GGUF blocks come from gguf.quants.quantize (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4) or are random
bytes with small finite f16 scales (the K formats and the IQ4 ones, which the gguf package does
not quantize to), and random MXFP4 blocks take every exponent, the extremes included; the gguf
package's dequantization of the same blocks is the oracle. A literal reader of arc.h's text, one
weight at a time, checks that the layout is the header's and not merely self-consistent.
"""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from arcpy import codes
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.model.quant import (
    QuantTensor,
    dequantize,
    layout,
    nonfinite_weight,
    qgemv_reference,
    quantize_input,
    row_bytes,
)
from arcpy.model.quant_pack import GGUF_FORMATS, from_gguf, random_quant

FORMATS = {Q.Q8_0: codes.FORMAT_Q8_0, Q.Q4_0: codes.FORMAT_Q4_0, Q.Q4_1: codes.FORMAT_Q4_1,
           Q.Q4_K: codes.FORMAT_Q4_K, Q.Q5_K: codes.FORMAT_Q5_K, Q.Q6_K: codes.FORMAT_Q6_K,
           Q.MXFP4: codes.FORMAT_MXFP4, Q.IQ4_NL: codes.FORMAT_IQ4_NL, Q.IQ4_XS: codes.FORMAT_IQ4_XS,
           Q.Q5_0: codes.FORMAT_Q5_0, Q.Q5_1: codes.FORMAT_Q5_1, Q.Q3_K: codes.FORMAT_Q3_K,
           Q.Q2_K: codes.FORMAT_Q2_K}
K_TYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q3_K, Q.Q2_K)
SUPER_TYPES = K_TYPES + (Q.IQ4_XS,)  # blocks of 256 weights
RANDOM_TYPES = SUPER_TYPES + (Q.IQ4_NL,)  # not quantized to by the gguf package: random blocks
# Where a block's f16 scales sit (offset, count), for the random blocks below.
SCALES_AT = {Q.Q8_0: (0, 1), Q.Q4_0: (0, 1), Q.Q4_1: (0, 2), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208, 1),
             Q.IQ4_NL: (0, 1), Q.IQ4_XS: (0, 1), Q.Q5_0: (0, 1), Q.Q5_1: (0, 2), Q.Q3_K: (108, 1),
             Q.Q2_K: (80, 2)}
F16_NAN, F16_INF = 0x7E00, 0x7C00


def gguf_blocks(qtype: Q, rows: int, cols: int, rng, scale: float = 0.01) -> np.ndarray:
    """GGUF blocks (rows, row bytes) of a random (rows, cols) matrix: quantized by the gguf package
    where it can, else random bytes whose f16 scales are random normals times `scale`."""
    if qtype not in RANDOM_TYPES:
        return gguf_quantize(rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.1), qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    at, count = SCALES_AT[qtype]
    f16 = (rng.standard_normal((rows, cols // block, count)) * scale).astype(np.float16)
    raw[..., at:at + 2 * count] = f16.view(np.uint8)
    return raw.reshape(rows, -1)


# --- the layout, literally as arc.h words it ---------------------------------------------------

def pad16(n: int) -> int:
    return -(-n // 16) * 16


def arc_h_arrays(fmt: int, cols: int) -> tuple[int, int, int, int]:
    """Bytes of A, B, C, D of one row, unpadded, read off arc.h's comment."""
    units, supers = cols // 32, cols // 256
    F = codes
    a = {F.FORMAT_Q8_0: 32 * units, F.FORMAT_Q3_K: 8 * units, F.FORMAT_Q2_K: 8 * units}.get(fmt, 16 * units)
    b = {F.FORMAT_Q5_K: 4 * units, F.FORMAT_Q6_K: 8 * units, F.FORMAT_Q5_0: 4 * units, F.FORMAT_Q5_1: 4 * units,
         F.FORMAT_Q3_K: 4 * units}.get(fmt, 0)
    c = {F.FORMAT_Q8_0: 2 * units, F.FORMAT_Q4_0: 2 * units, F.FORMAT_Q4_1: 4 * units, F.FORMAT_MXFP4: units,
         F.FORMAT_IQ4_NL: 2 * units, F.FORMAT_IQ4_XS: units, F.FORMAT_Q5_0: 2 * units,
         F.FORMAT_Q5_1: 4 * units}.get(fmt, 16 * supers)
    d = {F.FORMAT_Q6_K: 2 * supers, F.FORMAT_IQ4_XS: 2 * supers, F.FORMAT_Q3_K: 2 * supers,
         F.FORMAT_Q2_K: 4 * supers}.get(fmt, 0)
    return a, b, c, d


E2M1_DOUBLED = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
IQ4_GRID = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def scale_min_k4(j: int, q: bytes) -> tuple[int, int]:
    """GGUF's get_scale_min_k4: the 6-bit scale and min of unit j of a K superblock."""
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def literal_weight(fmt: int, row: bytes, cols: int, k: int) -> np.float32:
    """Weight k of one row, read byte by byte as arc.h's "Weight formats" describes it."""
    f32, f16 = np.float32, lambda at: np.float32(np.frombuffer(row, "<f2", 1, at)[0])
    sizes = arc_h_arrays(fmt, cols)
    A, B, C, D = (sum(pad16(s) for s in sizes[:i]) for i in range(4))
    u, j = divmod(k, 32)
    s = u // 8
    if fmt == codes.FORMAT_Q8_0:
        return f16(C + 2 * u) * f32(struct.unpack_from("b", row, A + 32 * u + j)[0])
    if fmt in (codes.FORMAT_MXFP4, codes.FORMAT_IQ4_NL, codes.FORMAT_IQ4_XS):
        i, t = (j // 4, j % 4) if j < 16 else ((j - 16) // 4, 4 + (j - 16) % 4)  # word i, nibble t
        word = struct.unpack_from("<I", row, A + 16 * u + 4 * i)[0]
        q = (word >> (4 * t)) & 15
        if fmt == codes.FORMAT_MXFP4:
            return f32(2.0 ** (row[C + u] - 128)) * f32(E2M1_DOUBLED[q])
        if fmt == codes.FORMAT_IQ4_NL:
            return f16(C + 2 * u) * f32(IQ4_GRID[q])
        return (f16(D + 2 * s) * f32(struct.unpack_from("b", row, C + u)[0])) * f32(IQ4_GRID[q])
    if fmt in (codes.FORMAT_Q3_K, codes.FORMAT_Q2_K):
        i, b = divmod(j % 16, 4)  # weight (j mod 16) = 4i + b, in word j // 16
        q = (row[A + 8 * u + 4 * (j // 16) + b] >> (2 * i)) & 3
        if fmt == codes.FORMAT_Q2_K:
            sc = row[C + 16 * s + (k % 256) // 16]
            return (f16(D + 4 * s) * f32(sc & 15)) * f32(q) - f16(D + 4 * s + 2) * f32(sc >> 4)
        H = struct.unpack_from("<I", row, B + 4 * u)[0]
        q |= ((H >> (8 * b + (4 if j >= 16 else 0) + i)) & 1) << 2
        scale = struct.unpack_from("b", row, C + 16 * s + (k % 256) // 16)[0]
        return (f16(D + 2 * s) * f32(scale)) * f32(q - 4)
    byte = row[A + 16 * u + j % 16]
    q = byte & 0x0F if j < 16 else byte >> 4
    if fmt == codes.FORMAT_Q4_0:
        return f16(C + 2 * u) * f32(q - 8)
    if fmt == codes.FORMAT_Q4_1:
        return f16(C + 4 * u) * f32(q) + f16(C + 4 * u + 2)
    if fmt in (codes.FORMAT_Q5_0, codes.FORMAT_Q5_1):
        H = struct.unpack_from("<I", row, B + 4 * u)[0]
        i, b = divmod(j % 16, 4)
        q |= ((H >> (8 * b + (4 if j >= 16 else 0) + i)) & 1) << 4
        if fmt == codes.FORMAT_Q5_0:
            return f16(C + 2 * u) * f32(q - 16)
        return f16(C + 4 * u) * f32(q) + f16(C + 4 * u + 2)
    if fmt == codes.FORMAT_Q6_K:
        word = struct.unpack_from("<I", row, B + 8 * u + (4 if j >= 16 else 0))[0]
        i, b = divmod(j % 16, 4)  # weight (j mod 16) = 4i + b
        q |= ((word >> (8 * b + 2 * i)) & 3) << 4
        scale = struct.unpack_from("b", row, C + 16 * s + (k % 256) // 16)[0]
        return (f16(D + 2 * s) * f32(scale)) * f32(q - 32)
    sc, m = scale_min_k4(u % 8, row[C + 16 * s + 4:C + 16 * s + 16])
    if fmt == codes.FORMAT_Q5_K:
        H = struct.unpack_from("<I", row, B + 4 * u)[0]
        i, b = divmod(j % 16, 4)
        q |= ((H >> (8 * b + (4 if j >= 16 else 0) + i)) & 1) << 4
    return (f16(C + 16 * s) * f32(sc)) * f32(q) - f16(C + 16 * s + 2) * f32(m)


@pytest.mark.parametrize("qtype", list(FORMATS), ids=lambda q: q.name)
def test_the_repacked_rows_are_arc_h_layout_read_weight_by_weight(qtype):
    rows, cols = 3, 512
    raw = gguf_blocks(qtype, rows, cols, np.random.default_rng(1))
    qt = from_gguf(qtype, (rows, cols), raw)
    want = gguf_dequantize(raw, qtype)
    for r in range(rows):
        row = qt.data[r].tobytes()
        got = np.array([literal_weight(qt.format, row, cols, k) for k in range(cols)], np.float32)
        assert np.array_equal(got, want[r]), (r, np.flatnonzero(got != want[r])[:5])


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: codes.FORMAT_NAMES[f])
@pytest.mark.parametrize("cols", [256, 512, 768, 2048, 4096, 14336])
def test_row_bytes_is_four_arrays_each_padded_to_16_bytes(fmt, cols):
    assert row_bytes(fmt, cols) == sum(pad16(n) for n in arc_h_arrays(fmt, cols))
    L = layout(fmt, cols)
    assert (L.a_len, L.b_len, L.c_len, L.d_len) == arc_h_arrays(fmt, cols)
    assert L.a == 0 and all(off % 16 == 0 for off in (L.b, L.c, L.d, L.row_bytes))


@pytest.mark.parametrize("qtype, cols, padding", [
    (Q.Q4_K, 4096, 0), (Q.Q5_K, 4096, 0), (Q.Q6_K, 4096, 0), (Q.Q6_K, 14336, 0), (Q.Q8_0, 4096, 0),
    (Q.Q4_0, 4096, 0), (Q.Q4_1, 4096, 0),
    (Q.Q6_K, 256, 14),   # D: one f16 padded to 16
    (Q.Q6_K, 2048, 0),   # D: 8 f16, exactly 16
    (Q.Q6_K, 768, 10),   # D: 3 f16
    (Q.Q8_0, 32, 14), (Q.Q4_0, 96, 10), (Q.Q4_1, 96, 4),
], ids=str)
def test_row_bytes_against_the_gguf_block_sizes(qtype, cols, padding):
    block, size = GGML_QUANT_SIZES[qtype]
    assert row_bytes(FORMATS[qtype], cols) == cols // block * size + padding


def test_row_bytes_of_bf16_is_two_bytes_a_weight():
    assert row_bytes(codes.FORMAT_BF16, 4096) == 8192 and row_bytes(codes.FORMAT_BF16, 24) == 48


@pytest.mark.parametrize("fmt, cols, expected", [
    (codes.FORMAT_Q4_K, 4096 + 32, "Q4_K rows must hold a multiple of 256 weights, got 4128"),
    (codes.FORMAT_Q8_0, 48, "Q8_0 rows must hold a multiple of 32 weights, got 48"),
    (codes.FORMAT_Q4_0, 0, "cols must be a positive int, got 0"),
    (codes.FORMAT_Q4_0, 64.0, "cols must be a positive int, got 64.0"),
    (14, 256, "unknown weight format 14"),
    (codes.FORMAT_IQ4_XS, 288, "IQ4_XS rows must hold a multiple of 256 weights, got 288"),
    (True, 256, "unknown weight format True"),
])
def test_row_bytes_refuses_what_arc_h_does_not_describe_in_one_line(fmt, cols, expected):
    with pytest.raises(InvalidArgumentError) as ei:
        row_bytes(fmt, cols)
    assert expected in str(ei.value) and "\n" not in str(ei.value)


# --- from GGUF blocks ---------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", list(FORMATS), ids=lambda q: q.name)
@pytest.mark.parametrize("rows, cols", [(1, 256), (5, 768), (300, 2048), (64, 14336)])
def test_from_gguf_then_dequantize_is_the_gguf_packages_dequantization_bit_for_bit(qtype, rows, cols):
    raw = gguf_blocks(qtype, rows, cols, np.random.default_rng(rows + cols))
    qt = from_gguf(qtype, (rows, cols), raw)
    assert qt.format == FORMATS[qtype] and qt.shape == (rows, cols)
    assert qt.data.shape == (rows, row_bytes(qt.format, cols)) and qt.nbytes == qt.data.nbytes
    # Every product of the formulas is exact in float32, so the two agree to the bit.
    assert np.array_equal(dequantize(qt).view(np.uint32), gguf_dequantize(raw, qtype).view(np.uint32))


@pytest.mark.parametrize("qtype", list(FORMATS), ids=lambda q: q.name)
def test_the_padding_of_every_array_is_zero(qtype):
    cols = 768  # Q6_K's D, Q8_0's, Q4_0's and Q4_1's C are not whole multiples of 16 here
    qt = from_gguf(qtype, (4, cols), gguf_blocks(qtype, 4, cols, np.random.default_rng(2)))
    L = layout(qt.format, cols)
    for start, length, stop in ((L.a, L.a_len, L.b), (L.b, L.b_len, L.c), (L.c, L.c_len, L.d),
                                (L.d, L.d_len, L.row_bytes)):
        assert not qt.data[:, start + length:stop].any()


def test_from_gguf_reads_a_memory_mapped_file_slice(tmp_path):
    raw = gguf_blocks(Q.Q4_K, 40, 1024, np.random.default_rng(3))
    path = tmp_path / "blocks.bin"
    raw.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    qt = from_gguf(Q.Q4_K, (40, 1024), mapped)
    assert np.array_equal(dequantize(qt), gguf_dequantize(raw, Q.Q4_K))


@pytest.mark.parametrize("qtype, shape, nbytes, expected", [
    (Q.Q4_K, (2, 512), 2 * 2 * 144 - 1, "2 rows of 512 Q4_K weights take 576 bytes, got 575 uint8"),
    (Q.Q8_0, (2, 48), 2 * 34, "needs (rows, cols) with cols a multiple of 32, got [2, 48]"),
    (Q.Q6_K, (2, 300), 600, "multiple of 256"),
    (Q.TQ2_0, (2, 256), 2 * 66, "type TQ2_0 has no arc format"),
    (Q.IQ4_XS, (2, 288), 2 * 136, "multiple of 256"),
    (Q.MXFP4, (2, 64), 2 * 2 * 17 + 1, "2 rows of 64 MXFP4 weights take 68 bytes, got 69 uint8"),
    (Q.Q5_1, (2, 64), 2 * 2 * 22, "2 rows of 64 Q5_1 weights take 96 bytes, got 88 uint8"),
    (Q.F16, (2, 64), 256, "type F16 has no arc format"),
    (1000, (2, 64), 256, "unknown GGUF type 1000"),
    (Q.Q4_0, (2, 32, 32), 2 * 32 * 18, "needs (rows, cols)"),
], ids=str)
def test_from_gguf_refuses_bad_blocks_in_one_line(qtype, shape, nbytes, expected):
    with pytest.raises(ModelFileError) as ei:
        from_gguf(qtype, shape, np.zeros(nbytes, np.uint8), where="f.gguf: tensor 'w'")
    msg = str(ei.value)
    assert msg.startswith("f.gguf: tensor 'w'") and expected in msg and "\n" not in msg, msg


@pytest.mark.parametrize("qtype, block, at, word, expected", [
    (Q.Q8_0, 5, 0, F16_NAN, "a NaN weight at [0, 160]"),
    (Q.Q4_0, 9, 0, F16_INF, "weight at [1, 32]"),          # row 1's second unit: inf, or NaN where q = 8
    (Q.Q4_1, 2, 2, F16_NAN, "a NaN weight at [0, 64]"),    # a NaN minimum
    (Q.Q4_K, 3, 2, F16_INF, "weight at [1, 256]"),         # dmin: inf times the units' mins
    (Q.Q5_K, 2, 0, F16_NAN, "a NaN weight at [1, 0]"),
    (Q.Q6_K, 1, 208, F16_NAN, "a NaN weight at [0, 256]"),
    (Q.IQ4_NL, 3, 0, F16_INF, "an infinite weight at [0, 96]"),  # the grid has no zero
    (Q.IQ4_XS, 2, 0, F16_NAN, "a NaN weight at [1, 0]"),
    (Q.Q5_0, 4, 0, F16_NAN, "a NaN weight at [0, 128]"),
    (Q.Q5_1, 6, 2, F16_INF, "an infinite weight at [0, 192]"),  # an infinite minimum
    (Q.Q3_K, 2, 108, F16_NAN, "a NaN weight at [1, 0]"),
    (Q.Q2_K, 1, 82, F16_INF, "weight at [0, 256]"),  # dmin: inf times the units' mins
], ids=lambda v: str(v))
def test_a_nan_or_infinite_scale_is_refused_naming_the_first_weight_it_spoils(qtype, block, at, word, expected):
    rows, cols = 2, 512 if qtype in SUPER_TYPES else 256
    raw = gguf_blocks(qtype, rows, cols, np.random.default_rng(4))
    from_gguf(qtype, (rows, cols), raw)
    size = GGML_QUANT_SIZES[qtype][1]
    flat = raw.reshape(-1)
    flat[block * size + at:block * size + at + 2] = np.array([word], "<u2").view(np.uint8)
    with pytest.raises(ModelFileError) as ei:
        from_gguf(qtype, (rows, cols), raw, where="m.gguf: tensor 'w'")
    msg = str(ei.value)
    assert msg.startswith("m.gguf: tensor 'w' holds ") and expected in msg and "\n" not in msg, msg
    assert f"a {qtype.name} scale that is NaN or infinite" in msg


# f16 scales at the ends of the range: the largest finite, the smallest normal and subnormal, zero,
# negative zero, and ordinary values of either sign.
EXTREME_F16 = np.array([65504.0, -65504.0, 6.1035156e-05, 5.9604645e-08, -5.9604645e-08, 0.0, -0.0, 1.0, -0.5,
                        1000.0], np.float16)


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.IQ4_XS, Q.Q5_0, Q.Q5_1], ids=lambda q: q.name)
def test_extreme_f16_scales_decode_as_the_gguf_package_decodes_them(qtype):
    rng = np.random.default_rng(21)
    rows, cols = 4, 1024
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    at, count = SCALES_AT[qtype]
    raw[..., at:at + 2 * count] = rng.choice(EXTREME_F16, (rows, cols // block, count)).view(np.uint8)
    raw = raw.reshape(rows, -1)
    qt = from_gguf(qtype, (rows, cols), raw)
    with np.errstate(over="ignore", invalid="ignore"):
        want = gguf_dequantize(raw, qtype)
    assert np.isfinite(want).all()
    assert np.array_equal(dequantize(qt).view(np.uint32), want.view(np.uint32))


def mxfp4_blocks(rows: int, cols: int, exponents, rng) -> np.ndarray:
    raw = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)
    raw[..., 0] = rng.choice(np.asarray(exponents, np.uint8), (rows, cols // 32))
    return raw.reshape(rows, -1)


def test_every_finite_mxfp4_exponent_decodes_as_the_gguf_package_decodes_it():
    raw = mxfp4_blocks(8, 32 * 253, np.arange(253), np.random.default_rng(22))
    raw.reshape(8, 253, 17)[0, :, 0] = np.arange(253)  # each exponent once at least, subnormal scales included
    qt = from_gguf(Q.MXFP4, (8, 32 * 253), raw)
    want = gguf_dequantize(raw, Q.MXFP4)
    assert np.isfinite(want).all() and (want[0, :64] != 0).any()
    assert np.array_equal(dequantize(qt).view(np.uint32), want.view(np.uint32))


def test_an_mxfp4_exponent_too_large_is_refused_only_where_a_weight_overflows():
    raw = mxfp4_blocks(3, 256, [120, 127], np.random.default_rng(23))
    blocks = raw.reshape(3, 8, 17)
    blocks[1, 5, 0] = 255
    blocks[1, 5, 1:] = 0x11  # every code 1: 2^127, finite
    blocks[2, 2, 0] = 253
    blocks[2, 2, 1:] = 0x55  # code 5: 6 * 2^125, finite
    qt = from_gguf(Q.MXFP4, (3, 256), raw)
    with np.errstate(over="ignore"):
        want = gguf_dequantize(raw, Q.MXFP4)
    assert np.array_equal(dequantize(qt), want) and nonfinite_weight(qt) is None
    blocks[2, 2, 1 + 7] = 0x56  # weights 71 and 87 of row 2: code 6 (8 * 2^125 = 2^128), then code 5
    with pytest.raises(ModelFileError) as ei:
        from_gguf(Q.MXFP4, (3, 256), raw, where="m.gguf: tensor 'w'")
    assert str(ei.value) == ("m.gguf: tensor 'w' holds an infinite weight at [2, 71] (a MXFP4 exponent too large "
                             "for its values)")


def test_nonfinite_weight_is_none_for_finite_tensors_and_finds_the_first_bad_row():
    qt = random_quant(codes.FORMAT_Q8_0, (50, 256), np.random.default_rng(5))
    assert nonfinite_weight(qt) is None
    data = qt.data.copy()
    L = layout(codes.FORMAT_Q8_0, 256)
    data[47, L.c + 2 * 3:L.c + 2 * 3 + 2] = np.array([F16_INF], "<u2").view(np.uint8)  # row 47, unit 3
    data[48, L.c:L.c + 2] = np.array([F16_NAN], "<u2").view(np.uint8)
    row, col, _ = nonfinite_weight(qt.with_data(data))
    assert row == 47 and 96 <= col < 128


# --- QuantTensor -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, expected", [
    ({"format": codes.FORMAT_BF16}, "format must be a quantized arc_format"),
    ({"shape": (4, 100)}, "multiple of 32"),
    ({"shape": (4,)}, "shape must be (rows, cols)"),
    ({"data": np.zeros((4, 10), np.uint8)}, "data must be C-contiguous uint8 of shape (4, 288)"),
    ({"data": np.zeros((4, 288), np.int8)}, "got int8 (4, 288)"),
    ({"data": np.zeros((4, 576), np.uint8)[:, ::2]}, "C-contiguous"),
], ids=str)
def test_quant_tensor_checks_its_format_shape_and_bytes(kwargs, expected):
    args = {"format": codes.FORMAT_Q4_0, "shape": (4, 512), "data": np.zeros((4, 288), np.uint8), **kwargs}
    with pytest.raises(InvalidArgumentError) as ei:
        QuantTensor(**args)
    assert expected in str(ei.value) and "\n" not in str(ei.value)


# --- the quantized GEMV's input and arithmetic -------------------------------------------------

def test_quantize_input_follows_arc_h_per_unit():
    rng = np.random.default_rng(6)
    x = rng.standard_normal(4096, dtype=np.float32) * np.float32(3.0)
    x_q, dx = quantize_input(x)
    assert x_q.dtype == np.int8 and dx.dtype == np.float32 and x_q.shape == (4096,) and dx.shape == (128,)
    u = x.reshape(-1, 32)
    amax = np.abs(u).max(axis=1)
    inv = np.float32(127) / amax                   # float32 division
    assert np.array_equal(x_q, np.rint(u * inv[:, None]).astype(np.int8).reshape(-1))
    assert np.array_equal(dx, amax / np.float32(127))
    assert np.abs(x_q).max() == 127 and (np.abs(x_q.reshape(-1, 32)).max(axis=1) == 127).all()


def test_quantize_input_edge_cases():
    x = np.zeros(96, np.float32)
    x[32] = 1e30            # one huge value: the rest of its unit rounds to 0
    x[33] = 1.0
    x[64:96] = -np.arange(1, 33, dtype=np.float32)  # negative: the largest magnitude maps to -127
    x_q, dx = quantize_input(x)
    assert not x_q[:32].any() and dx[0] == 0          # a unit of zeros: 0 and 0
    assert x_q[32] == 127 and not x_q[33:64].any() and dx[1] == np.float32(1e30) / np.float32(127)
    assert x_q[95] == -127 and x_q[64] == np.rint(np.float32(-1) * (np.float32(127) / np.float32(32)))
    assert dx[2] == np.float32(32) / np.float32(127)
    # Ties round to even: 0.5 * 127 / 127 ... a unit whose values land on x.5 exactly.
    half = np.zeros(32, np.float32)
    half[0], half[1], half[2] = 127.0, 0.5, 1.5
    assert list(quantize_input(half)[0][:3]) == [127, 0, 2]
    # 127 / amax overflows float32 below about 3.7e-37: the unit quantizes to the formula's limit.
    tiny = np.zeros(32, np.float32)
    tiny[0], tiny[1] = np.float32(1e-38), np.float32(-5e-39)
    x_q, dx = quantize_input(tiny)
    assert list(x_q[:3]) == [127, -127, 0] and dx[0] == np.float32(1e-38) / np.float32(127)


@pytest.mark.parametrize("x, expected", [
    (np.zeros(33, np.float32), "a multiple of 32"),
    (np.zeros(32, np.float64), "float32"),
    (np.zeros((2, 32), np.float32), "1-D"),
    (np.array([np.nan] + [0.0] * 31, np.float32), "NaN or infinite"),
    (np.array([np.inf] + [0.0] * 31, np.float32), "NaN or infinite"),
], ids=["length", "dtype", "2-D", "nan", "inf"])
def test_quantize_input_refuses_bad_input_in_one_line(x, expected):
    with pytest.raises(InvalidArgumentError) as ei:
        quantize_input(x)
    assert expected in str(ei.value) and "\n" not in str(ei.value)


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: codes.FORMAT_NAMES[f])
def test_qgemv_reference_is_the_weights_times_the_quantized_input(fmt):
    rng = np.random.default_rng(7)
    qt = random_quant(fmt, (96, 2048), rng, std=0.05)
    x = rng.standard_normal(2048, dtype=np.float32)
    y = qgemv_reference(qt, x)
    assert y.dtype == np.float32 and y.shape == (96,)
    w = dequantize(qt).astype(np.float64)
    x_q, dx = quantize_input(x)
    x_deq = (x_q.reshape(-1, 32) * dx.astype(np.float64)[:, None]).reshape(-1)
    # The integer sums are exact, so only float64 rounding and the last float32 rounding remain.
    exact = w @ x_deq
    assert np.allclose(y, exact, rtol=1e-7, atol=1e-9 * (np.abs(w) @ np.abs(x_deq)).max())
    # Against the unquantized input: each input is off by at most dx / 2, so the row is off by at
    # most sum |w| * dx / 2 over its units (plus float32 rounding).
    bound = (np.abs(w).reshape(96, -1, 32).sum(axis=2) * dx.astype(np.float64) / 2).sum(axis=1)
    err = np.abs(y - w @ x.astype(np.float64))
    assert (err <= bound * 1.0001 + 1e-6 * np.abs(y)).all()
    assert np.median(err / np.abs(w @ x)) < 0.02  # and in practice far below the bound


def test_qgemv_reference_checks_its_arguments():
    qt = random_quant(codes.FORMAT_Q4_0, (4, 64), np.random.default_rng(8))
    with pytest.raises(InvalidArgumentError, match=r"x must have shape \(64,\)"):
        qgemv_reference(qt, np.zeros(32, np.float32))
    with pytest.raises(InvalidArgumentError, match="W must be a QuantTensor"):
        qgemv_reference(np.zeros((4, 64), np.uint16), np.zeros(64, np.float32))


# --- random tensors ------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: codes.FORMAT_NAMES[f])
@pytest.mark.parametrize("std", [0.02, 1 / np.sqrt(14336)])
def test_random_quant_has_the_asked_scale_finite_scales_and_zero_padding(fmt, std):
    qt = random_quant(fmt, (256, 4096 if std == 0.02 else 14336), np.random.default_rng(9), std=float(std))
    w = dequantize(qt)
    assert nonfinite_weight(qt) is None
    rms = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
    assert abs(rms / std - 1) < 0.1, rms
    assert abs(float(w.mean())) < 0.15 * std  # Q4_0's d * (q - 8) has mean -d/2 over uniform quants
    L = layout(fmt, qt.cols)
    for start, length, stop in ((L.a, L.a_len, L.b), (L.b, L.b_len, L.c), (L.c, L.c_len, L.d),
                                (L.d, L.d_len, L.row_bytes)):
        assert not qt.data[:, start + length:stop].any()


def test_random_quant_is_deterministic_and_uses_every_scale_bit():
    a = random_quant(codes.FORMAT_Q4_K, (64, 1024), np.random.default_rng(10))
    b = random_quant(codes.FORMAT_Q4_K, (64, 1024), np.random.default_rng(10))
    c = random_quant(codes.FORMAT_Q4_K, (64, 1024), np.random.default_rng(11))
    assert np.array_equal(a.data, b.data) and not np.array_equal(a.data, c.data)
    L = layout(codes.FORMAT_Q4_K, 1024)
    packed = a.data[:, L.c:L.c + L.c_len].reshape(64, -1, 16)[..., 4:16]
    assert np.bitwise_or.reduce(packed.reshape(-1, 12), axis=0).tolist() == [255] * 12


@pytest.mark.parametrize("args, expected", [
    ((codes.FORMAT_BF16, (4, 256)), "quantized arc_format"),
    ((codes.FORMAT_Q4_K, (4, 288)), "multiple of 256"),
    ((codes.FORMAT_Q8_0, (0, 32)), "shape must be (rows, cols)"),
], ids=str)
def test_random_quant_refuses_bad_arguments(args, expected):
    with pytest.raises(InvalidArgumentError) as ei:
        random_quant(*args, np.random.default_rng(0))
    assert expected in str(ei.value)


def test_the_gguf_types_kept_are_arc_h_formats_one_for_one():
    assert GGUF_FORMATS == FORMATS
    assert sorted(GGUF_FORMATS.values()) == list(range(1, 14))
    assert all(codes.FORMAT_NAMES[f] == q.name for q, f in FORMATS.items())


# --- models holding quantized tensors ------------------------------------------------------------

def test_tiny_quant_and_tiny_quant_more_hold_every_format_and_mix_q_k_v_in_one_layer():
    from arcpy.model import synthetic_model
    held = set()
    for name in ("tiny-quant", "tiny-quant-more"):
        model = synthetic_model(name)
        formats = {name: model.format_of(name) for name in model.tensors}
        held |= set(formats.values())
        qkv = [formats[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]
        assert len(set(qkv)) == 3  # the forward must split the fused QKV product
        assert len({formats[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"}) == 1
        for layer in range(2):  # gate and up share a format: the fused SwiGLU product reads both
            p = f"model.layers.{layer}.mlp."
            assert formats[p + "gate_proj.weight"] == formats[p + "up_proj.weight"]
        assert formats["model.embed_tokens.weight"] == codes.FORMAT_BF16 and model.quantized
    assert held == {codes.FORMAT_BF16, *FORMATS.values()}
    tied = synthetic_model("tiny-quant-tied")
    assert tied.config.tied_embeddings and "lm_head.weight" not in tied.tensors


def test_q4_k_m_presets_follow_llama_cpps_mix():
    from arcpy.model.presets import SHAPES, preset_formats
    f = preset_formats("llama8B-q4km")
    six = sorted(int(n.split(".")[2]) for n, v in f.items() if v == codes.FORMAT_Q6_K and "v_proj" in n)
    # use_more_bits(i, 32): i < 4, i >= 28, or (i - 4) % 3 == 2
    assert six == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert six == sorted(int(n.split(".")[2]) for n, v in f.items() if v == codes.FORMAT_Q6_K and "down_proj" in n)
    assert f["lm_head.weight"] == codes.FORMAT_Q6_K
    assert {v for n, v in f.items() if "v_proj" not in n and "down_proj" not in n and "lm_head" not in n} == {4}
    big = preset_formats("llama70B-q4km")  # llama.cpp gives a 70B model's other attn_v Q5_K
    assert {v for n, v in big.items() if "v_proj" in n} == {codes.FORMAT_Q5_K, codes.FORMAT_Q6_K}
    assert set(preset_formats("llama8B-q8").values()) == {codes.FORMAT_Q8_0}
    assert set(preset_formats("llama8B").values()) == {codes.FORMAT_BF16}
    assert not SHAPES["llama1B-q4km"].tied_embeddings and SHAPES["llama1B"].tied_embeddings
    # Bytes of the 8B mix's matrices: within 1% of a Llama-3-8B Q4_K_M file less its Q4_K token_embd.
    cfg = SHAPES["llama8B-q4km"]
    from arcpy.model import expected_tensors
    shapes = expected_tensors(cfg)
    matrices = sum(shapes[n][0] * row_bytes(v, shapes[n][1]) for n, v in f.items())
    assert abs(matrices / (4_920_734_016 - 128256 * 4096 * 144 // 256) - 1) < 0.01


def test_model_weight_bytes_count_the_tensors_as_held():
    from arcpy.model import synthetic_model
    m = synthetic_model("tiny-quant")
    cfg = m.config
    norms = 2 * cfg.dim * (2 * cfg.n_layers + 1)
    matrices = sum(t.nbytes for n, t in m.tensors.items() if n.endswith(("proj.weight", "lm_head.weight")))
    assert m.weight_bytes == matrices + norms + 2 * cfg.dim  # the embedding: one row a step
    assert m.stored_bytes == matrices + norms + 2 * cfg.vocab * cfg.dim
    tied = synthetic_model("tiny-quant-tied")
    assert tied.weight_bytes == tied.stored_bytes  # the table is the head: read whole
    bf16 = synthetic_model("qwen-tiny")
    assert bf16.weight_bytes == bf16.config.weight_bytes and not bf16.quantized


def test_a_model_takes_quant_tensors_only_for_matrices_of_the_right_shape():
    from arcpy.model import Model, synthetic_model
    m = synthetic_model("tiny-quant")
    q = random_quant(codes.FORMAT_Q8_0, (256, 256), np.random.default_rng(0))
    for name, expected in [("model.norm.weight", "must be bf16 words; only the projections and the lm_head"),
                           ("model.layers.0.mlp.up_proj.weight", "has shape (256, 256), expected (768, 256)")]:
        with pytest.raises(InvalidArgumentError) as ei:
            Model(m.config, {**m.tensors, name: q}, "m", "test")
        assert expected in str(ei.value), str(ei.value)
    with pytest.raises(InvalidArgumentError, match="uint16 bf16 words or a QuantTensor"):
        Model(m.config, {**m.tensors, "lm_head.weight": np.zeros((512, 256), np.float32)}, "m", "test")


def test_save_model_refuses_a_quantized_model_in_one_line(tmp_path):
    from arcpy.model import save_model, synthetic_model
    with pytest.raises(InvalidArgumentError) as ei:
        save_model(synthetic_model("tiny-quant"), tmp_path)
    assert "14 tensors are quantized" in str(ei.value) and "quantized=False" in str(ei.value)
    assert not any(tmp_path.iterdir())


def test_the_reference_forward_dequantizes_once_and_decodes():
    from arcpy.devices.reference import ReferenceModel
    from arcpy.model import synthetic_model
    m = synthetic_model("tiny-quant", seed=1)
    ref = ReferenceModel(m, max_seq=64)
    assert np.array_equal(ref.layers[0].wk, dequantize(m.tensor("model.layers.0.self_attn.k_proj.weight")))
    assert np.array_equal(ref.lm_head, dequantize(m.tensor("lm_head.weight")))
    logits = ref.forward(7, 0)
    assert np.isfinite(logits).all() and 0.3 < logits.std() < 3  # activations of order one
    tokens = ReferenceModel(m, max_seq=64).greedy([1, 2, 3], 24)
    assert tokens == ReferenceModel(synthetic_model("tiny-quant", seed=1), max_seq=64).greedy([1, 2, 3], 24)
    assert len(set(tokens)) > 4  # not one token repeated


# --- what the CUDA model hands libarc (checked here without a GPU) -------------------------------

def header_library():
    """arc.h's and arc_model.h's cdef with the process's own symbols standing in for libarc: their
    enum constants."""
    import cffi

    from arcpy import _lib
    ffi = cffi.FFI()
    top = Path(__file__).resolve().parents[1] / "libarc"
    ffi.cdef("".join(_lib.cdef_from_header((top / name).read_text(), name) for name in ("arc.h", "arc_model.h")))
    return ffi, ffi.dlopen(None)


def test_the_device_model_gets_a_format_per_tensor_and_layer():
    from arcpy.devices.cuda_model import CudaModel
    from arcpy.model import synthetic_model
    ffi, lib = header_library()
    model = synthetic_model("tiny-quant")
    table = CudaModel._formats(SimpleNamespace(lib=lib, ffi=ffi), model)
    L = model.config.n_layers
    assert len(table) == lib.ARC_TENSOR_COUNT * L == 56 * 2
    at = [table[getattr(lib, f"ARC_TENSOR_{name}") * L + layer]
          for name, layer in [("WQ", 0), ("WK", 0), ("WV", 0), ("WO", 0), ("W_GATE", 0), ("W_UP", 0), ("W_DOWN", 0),
                              ("WQ", 1), ("WO", 1), ("W_DOWN", 1), ("LM_HEAD", 0), ("EMBED", 0), ("ATTN_NORM", 1)]]
    F = codes
    assert at == [F.FORMAT_Q4_K, F.FORMAT_Q6_K, F.FORMAT_Q8_0, F.FORMAT_Q4_0, F.FORMAT_Q5_K,
                                 F.FORMAT_Q5_K, F.FORMAT_Q4_1, F.FORMAT_Q8_0, F.FORMAT_BF16, F.FORMAT_Q4_K,
                                 F.FORMAT_Q6_K, F.FORMAT_BF16, F.FORMAT_BF16]
    assert sum(x != 0 for x in table) == 14


def test_the_device_model_checks_a_quantized_tensors_bytes_against_libarcs_row_size():
    from arcpy.devices.cuda_model import CudaModel
    from arcpy.errors import NoDeviceError
    ffi, _ = header_library()
    qt = random_quant(codes.FORMAT_Q6_K, (8, 768), np.random.default_rng(0))

    def device(row_size):
        def arc_format_row_bytes(fmt, cols, out):
            out[0] = row_size(fmt, cols)
            return 0
        fake = SimpleNamespace(lib=SimpleNamespace(arc_format_row_bytes=arc_format_row_bytes), ffi=ffi)
        fake._entry = lambda name: CudaModel._entry(fake, name)
        return fake

    CudaModel._check_rows(device(row_bytes), "w", qt)  # agreed
    with pytest.raises(InvalidArgumentError, match="8 rows of 768 Q6_K weights take 630 bytes a row in libarc, 640"):
        CudaModel._check_rows(device(lambda fmt, cols: 630), "w", qt)
    older = SimpleNamespace(lib=SimpleNamespace(), ffi=ffi)
    with pytest.raises(NoDeviceError, match="no arc_format_row_bytes: it predates quantized weights"):
        CudaModel._entry(older, "arc_format_row_bytes")


def test_the_reference_prefill_with_bf16_products_reads_quantized_weights_rounded_to_bf16():
    from arcpy.devices.reference import ReferenceModel
    from arcpy.model import Model, QuantTensor, f32_to_bf16, synthetic_model
    m = synthetic_model("tiny-quant", seed=2)
    # The same model with every quantized matrix as its weights rounded to bf16 (arc_op_dequantize's).
    rounded = Model(m.config, {n: f32_to_bf16(dequantize(t)) if isinstance(t, QuantTensor) else t
                               for n, t in m.tensors.items()}, "rounded", "test")
    tokens = [5, 17, 300, 2, 9, 44]
    a, b = ReferenceModel(m, max_seq=32), ReferenceModel(rounded, max_seq=32)
    a.prefill(tokens, bf16_products=True)
    b.prefill(tokens, bf16_products=True)
    assert np.array_equal(a.k_cache, b.k_cache) and np.array_equal(a.v_cache, b.v_cache)
    c = ReferenceModel(m, max_seq=32)
    c.prefill(tokens)  # float32 products read the dequantized weights as they are
    assert not np.array_equal(c.k_cache, a.k_cache) and np.allclose(c.k_cache, a.k_cache, atol=0.1)


def test_the_main_job_says_how_a_quantized_models_matrices_are_held():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "arcpy.decode", "--shape", "tiny-quant", "--prompt-ids", "1 2 3",
                          "-n", "4", "--backend", "numpy"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert ("model tiny-quant: 2 layers, dim 256, vocab 512, matrices 1 bf16, 4 Q8_0, 3 Q4_0, 1 Q4_1, 2 Q4_K, "
            "2 Q5_K, 2 Q6_K; prompt 3 tokens") in out.stderr.splitlines()
    assert len(out.stdout.split()) == 4
