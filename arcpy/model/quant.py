"""Quantized weights held as libarc reads them: llama.cpp's GGUF block types, repacked by row.

arc.h's "Weight formats" is the contract; this module is its NumPy mirror. A row of `cols` weights
is a sequence of units of 32 consecutive weights (a _K superblock is 8 units), stored as four
arrays A, B, C, D, each padded with zeros to a multiple of 16 bytes:

    format  A (quants)         B (high bits)    C (scales)                        D
    Q8_0    int8, 32 a unit    -                f16 d a unit                      -
    Q4_0    nibbles, 16 a unit -                f16 d a unit                      -
    Q4_1    nibbles, 16 a unit -                f16 d, f16 m a unit               -
    Q4_K    nibbles, 16 a unit -                16 bytes a superblock, GGUF's     -
    Q5_K    nibbles, 16 a unit uint32 a unit    16 bytes a superblock, GGUF's     -
    Q6_K    nibbles, 16 a unit 2 uint32 a unit  16 int8 scales a superblock       f16 d a superblock
    MXFP4   codes, 16 a unit   -                uint8 e8m0 exponent e a unit      -
    IQ4_NL  codes, 16 a unit   -                f16 d a unit                      -
    IQ4_XS  codes, 16 a unit   -                int8 scale s a unit               f16 d a superblock
    Q5_0    nibbles, 16 a unit uint32 a unit    f16 d a unit                      -
    Q5_1    nibbles, 16 a unit uint32 a unit    f16 d, f16 m a unit               -
    Q3_K    2-bit, 8 a unit    uint32 a unit    16 int8 scales a superblock       f16 d a superblock
    Q2_K    2-bit, 8 a unit    -                16 bytes a superblock, GGUF's     f16 d, f16 dmin a superblock

Nibbles: byte k of a unit holds weight k's low 4 bits in its low nibble and weight k + 16's in
its high nibble. Codes (the codebook formats MXFP4, IQ4_NL, IQ4_XS): 4-bit indices into a table
of 16 integers, nibble 2k + h of a unit (byte k's low nibble for h = 0) being weight 4i + t
for nibble 8i + t, t < 4, and weight 16 + 4i + (t - 4) for t >= 4: the 32-bit word i holds
weights 4i..4i+3 then 16 + 4i..16 + 4i + 3. 2-bit (Q3_K, Q2_K): two uint32 words a unit, bits 2i,
2i + 1 of byte b of the first holding weight 4i + b, of the second weight 16 + 4i + b (Q6_K's B).
A weight, in float32 and in this order: Q8_0 d*q,
Q4_0 d*(q-8), Q4_1 d*q + m, Q4_K and Q5_K (d*sc)*q - dmin*m, Q6_K (d*scale)*(q-32), MXFP4
2^(e-128) * MXFP4_VALUES[q] (e2m1 values doubled), IQ4_NL d * IQ4_VALUES[q], IQ4_XS
(d*s) * IQ4_VALUES[q], Q5_0 d*(q-16), Q5_1 d*q + m (q of 5 bits: the nibble and the unit's
bit of B, Q5_K's order), Q3_K (d*scale)*(q-4) (q of 3 bits: the 2-bit quant and B's bit, in
Q5_K's order), Q2_K (d*sc)*q - dmin*m (sc, m: the low and high nibble of the byte of C for
those 16 weights). Every product there is exact (an f16 or a power of two times small
integers fits float32's 24 bits; MXFP4's largest exponents overflow to infinity), so only the
final add of Q4_1, Q5_1, Q4_K, Q5_K and Q2_K rounds, as in the gguf package's dequantization:
the two give the same float32 values.

The quantized GEMVs quantize their input per unit (quantize_input) and sum exact integer products;
qgemv_reference computes what they compute, summed in float64. The repacking of GGUF blocks and
random tensors of each format are in quant_pack.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arcpy.checks import is_int, require
from arcpy.codes import (
    FORMAT_BF16,
    FORMAT_IQ4_NL,
    FORMAT_IQ4_XS,
    FORMAT_MXFP4,
    FORMAT_NAMES,
    FORMAT_Q2_K,
    FORMAT_Q3_K,
    FORMAT_Q4_0,
    FORMAT_Q4_1,
    FORMAT_Q4_K,
    FORMAT_Q5_0,
    FORMAT_Q5_1,
    FORMAT_Q5_K,
    FORMAT_Q6_K,
    FORMAT_Q8_0,
)

F32 = np.float32
UNIT = 32       # weights of a unit, the block of every format's quants
SUPER = 256     # weights of a _K superblock: 8 units
QUANT_FORMATS = (FORMAT_Q8_0, FORMAT_Q4_0, FORMAT_Q4_1, FORMAT_Q4_K, FORMAT_Q5_K, FORMAT_Q6_K,
                 FORMAT_MXFP4, FORMAT_IQ4_NL, FORMAT_IQ4_XS, FORMAT_Q5_0, FORMAT_Q5_1, FORMAT_Q3_K, FORMAT_Q2_K)
K_FORMATS = (FORMAT_Q4_K, FORMAT_Q5_K, FORMAT_Q6_K, FORMAT_Q3_K, FORMAT_Q2_K)
SUPER_FORMATS = K_FORMATS + (FORMAT_IQ4_XS,)  # rows of whole superblocks of 256 weights
CODEBOOK_FORMATS = (FORMAT_MXFP4, FORMAT_IQ4_NL, FORMAT_IQ4_XS)
# The codebooks: MXFP4's e2m1 values doubled (its scale is 2^(e - 128), half of e8m0's 2^(e - 127)),
# and the IQ4 formats' non-linear grid (llama.cpp's values).
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int16)
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int16)
# Bytes of A, B and C a unit; of C and D a superblock.
_SIZES = {
    FORMAT_Q8_0: (32, 0, 2, 0, 0), FORMAT_Q4_0: (16, 0, 2, 0, 0), FORMAT_Q4_1: (16, 0, 4, 0, 0),
    FORMAT_Q4_K: (16, 0, 0, 16, 0), FORMAT_Q5_K: (16, 4, 0, 16, 0), FORMAT_Q6_K: (16, 8, 0, 16, 2),
    FORMAT_MXFP4: (16, 0, 1, 0, 0), FORMAT_IQ4_NL: (16, 0, 2, 0, 0), FORMAT_IQ4_XS: (16, 0, 1, 0, 2),
    FORMAT_Q5_0: (16, 4, 2, 0, 0), FORMAT_Q5_1: (16, 4, 4, 0, 0), FORMAT_Q3_K: (8, 4, 0, 16, 2),
    FORMAT_Q2_K: (8, 0, 0, 16, 4),
}
# Rows a slice of the row-by-row passes takes: about this many weights.
_SLICE_WEIGHTS = 1 << 20
# The weight each bit of a unit's high-bit words stands for (arc.h's B). Q5_K: bit 8b + 4h + i
# of H is weight 16h + 4i + b. Q6_K: the 2-bit field i of byte 4h + b (H0, then H1) is weight
# 16h + 4i + b.
Q5_WEIGHT = np.array([16 * h + 4 * i + b for b in range(4) for h in range(2) for i in range(4)])
_Q6_WEIGHT = np.array([16 * h + 4 * i + b for h in range(2) for b in range(4) for i in range(4)])
# The weight each nibble of a codebook format's unit stands for (nibble n: byte n // 2, high for odd n).
CODE_WEIGHT = np.array([4 * i + t if t < 4 else 16 + 4 * i + t - 4 for i in range(4) for t in range(8)])
_Q5_ORDER, _Q6_ORDER, _CODE_ORDER = np.argsort(Q5_WEIGHT), np.argsort(_Q6_WEIGHT), np.argsort(CODE_WEIGHT)
# An MXFP4 exponent from which a weight may be infinite: 2^(253 - 128) * 8 = 2^128.
_MXFP4_HUGE = 253


def _pad16(n: int) -> int:
    return (n + 15) & ~15


@dataclass(frozen=True)
class Layout:
    """Where a row's arrays start (a, b, c, d), their lengths without padding, and the row's bytes."""

    a: int
    b: int
    c: int
    d: int
    a_len: int
    b_len: int
    c_len: int
    d_len: int
    row_bytes: int


def _check_cols(fmt, cols) -> None:
    require(is_int(fmt) and int(fmt) in FORMAT_NAMES,
            f"unknown weight format {fmt!r} (arc.h's arc_format: 0..{max(FORMAT_NAMES)})")
    require(is_int(cols) and cols > 0, f"cols must be a positive int, got {cols!r}")
    block = SUPER if fmt in SUPER_FORMATS else UNIT
    if fmt != FORMAT_BF16:
        require(cols % block == 0, f"{FORMAT_NAMES[int(fmt)]} rows must hold a multiple of {block} weights, got {cols}")


def layout(fmt: int, cols: int) -> Layout:
    """The arrays of one row of `cols` weights in quantized format `fmt` (arc.h's layout)."""
    _check_cols(fmt, cols)
    require(fmt in QUANT_FORMATS, f"layout: {FORMAT_NAMES[int(fmt)]} is not a quantized format")
    a_u, b_u, c_u, c_s, d_s = _SIZES[int(fmt)]
    units, supers = cols // UNIT, cols // SUPER
    lens = (a_u * units, b_u * units, c_u * units + c_s * supers, d_s * supers)
    offs = [0]
    for n in lens:
        offs.append(offs[-1] + _pad16(n))
    return Layout(*offs[:4], *lens, offs[4])


def row_bytes(fmt: int, cols: int) -> int:
    """Bytes of one row of `cols` weights in `fmt`: arc_format_row_bytes (bf16: 2 * cols)."""
    _check_cols(fmt, cols)
    return 2 * int(cols) if fmt == FORMAT_BF16 else layout(fmt, cols).row_bytes


@dataclass(frozen=True, eq=False)
class QuantTensor:
    """A (rows, cols) matrix in a quantized format: `data` is (rows, row_bytes) uint8,
    C-contiguous, each row arc.h's four arrays. What arc_model_upload takes, byte for byte."""

    format: int
    shape: tuple[int, int]
    data: np.ndarray

    def __post_init__(self) -> None:
        fmt, shape = self.format, self.shape
        require(is_int(fmt) and fmt in QUANT_FORMATS,
                f"QuantTensor: format must be a quantized arc_format ({', '.join(map(str, QUANT_FORMATS))}), "
                f"got {fmt!r}")
        require(isinstance(shape, tuple) and len(shape) == 2 and all(is_int(n) and n > 0 for n in shape),
                f"QuantTensor: shape must be (rows, cols) of positive ints, got {shape!r}")
        rb = row_bytes(fmt, shape[1])
        data = self.data
        require(isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.shape == (shape[0], rb)
                and data.flags.c_contiguous,
                f"QuantTensor: data must be C-contiguous uint8 of shape ({shape[0]}, {rb}) for {shape[0]} rows of "
                f"{shape[1]} {FORMAT_NAMES[fmt]} weights, got {getattr(data, 'dtype', type(data).__name__)} "
                f"{getattr(data, 'shape', '')}")
        object.__setattr__(self, "format", int(fmt))
        object.__setattr__(self, "shape", (int(shape[0]), int(shape[1])))

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[1]

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def format_name(self) -> str:
        return FORMAT_NAMES[self.format]

    def with_data(self, data: np.ndarray) -> QuantTensor:
        """The same format and shape over other rows (e.g. the rows reordered)."""
        return QuantTensor(self.format, self.shape, np.ascontiguousarray(data))

    def __repr__(self) -> str:
        return f"QuantTensor({self.format_name}, shape={self.shape}, nbytes={self.nbytes})"


def _slices(qt: QuantTensor):
    """(first row, its data) for slices of about _SLICE_WEIGHTS weights."""
    step = max(1, _SLICE_WEIGHTS // qt.cols)
    for r in range(0, qt.rows, step):
        yield r, qt.data[r:r + step]


def _f16(words: np.ndarray) -> np.ndarray:
    """Bytes whose last axis is whole f16 words -> float32 (exact)."""
    return words.view("<f2").astype(F32)


def mxfp4_scale(e: np.ndarray) -> np.ndarray:
    """MXFP4's exponent bytes -> their scales 2^(e - 128), float32 (exact: subnormal for e < 2)."""
    e = e.astype(np.int32)
    return np.where(e >= 2, (e - 1) << 23, 0x00200000 << np.minimum(e, 1)).astype(np.uint32).view(F32)


def _codes(a: np.ndarray) -> np.ndarray:
    """A of a slice (n, units, 16) of a codebook format -> the 4-bit codes of each unit's 32 weights."""
    nib = np.empty(a.shape[:-1] + (UNIT,), np.uint8)
    np.bitwise_and(a, 0x0F, out=nib[..., 0::2])
    np.right_shift(a, 4, out=nib[..., 1::2])
    return nib[..., _CODE_ORDER]


def _crumbs(a: np.ndarray) -> np.ndarray:
    """A of a slice (n, units, 8) of a 2-bit format -> each unit's 32 quants (n, units, 32): bits
    2i, 2i + 1 of byte b of word h are weight 16h + 4i + b."""
    q = (a.reshape(a.shape[:-1] + (2, 4, 1)) >> np.array([0, 2, 4, 6], np.uint8)) & 3  # (.., h, b, i)
    return q.swapaxes(-1, -2).reshape(a.shape[:-1] + (UNIT,))


def _nibbles(a: np.ndarray) -> np.ndarray:
    """A of a slice (n, units, 16) -> the low 4 bits of each unit's 32 weights (n, units, 32)."""
    q = np.empty(a.shape[:-1] + (UNIT,), np.uint8)
    np.bitwise_and(a, 0x0F, out=q[..., :16])
    np.right_shift(a, 4, out=q[..., 16:])
    return q


def _scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 bytes of 6-bit scales and mins of K superblocks (..., 12) -> sc, m (..., 8) uint8
    (GGUF's get_scale_min_k4 for j = 0..7)."""
    lo, mid, hi = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    m = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, m


@dataclass
class _Fields:
    """A slice of rows unpacked: integer quants (n, units, 32), and the scales of each format."""

    q: np.ndarray                 # int16; Q4_0, Q5_0, Q6_K less their offsets (8, 16, 32); codebooks' values
    d: np.ndarray                 # float32: per unit (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the codebook formats:
                                  # IQ4_XS's d * s) or per superblock (K)
    m: np.ndarray | None = None   # Q4_1, Q5_1: per unit, float32
    sc: np.ndarray | None = None  # K: (n, supers, 8) uint8 (Q4_K, Q5_K), (n, supers, 16) int8 (Q6_K,
                                  # Q3_K) or uint8 (Q2_K, and its mins)
    dmin: np.ndarray | None = None
    mins: np.ndarray | None = None


def _fields(fmt: int, cols: int, data: np.ndarray) -> _Fields:
    L, n = layout(fmt, cols), data.shape[0]
    units, supers = cols // UNIT, cols // SUPER
    a = data[:, L.a:L.a + L.a_len]
    c = data[:, L.c:L.c + L.c_len]
    if fmt == FORMAT_Q8_0:
        return _Fields(a.reshape(n, units, UNIT).view(np.int8).astype(np.int16), _f16(c.reshape(n, units, 2))[..., 0])
    if fmt in CODEBOOK_FORMATS:
        q = (MXFP4_VALUES if fmt == FORMAT_MXFP4 else IQ4_VALUES)[_codes(a.reshape(n, units, 16))]
        if fmt == FORMAT_MXFP4:
            return _Fields(q, mxfp4_scale(c))
        if fmt == FORMAT_IQ4_NL:
            return _Fields(q, _f16(c.reshape(n, units, 2))[..., 0])
        d = _f16(data[:, L.d:L.d + L.d_len].reshape(n, supers, 2))[..., 0]
        return _Fields(q, (d[..., None] * c.reshape(n, supers, 8).view(np.int8).astype(F32)).reshape(n, units))
    if fmt in (FORMAT_Q3_K, FORMAT_Q2_K):
        q = _crumbs(a.reshape(n, units, 8)).astype(np.int16)
        if fmt == FORMAT_Q2_K:
            c = c.reshape(n, supers, 16)
            dd = _f16(data[:, L.d:L.d + L.d_len].reshape(n, supers, 2, 2))
            return _Fields(q, dd[..., 0, 0], sc=c & 0x0F, dmin=dd[..., 1, 0], mins=c >> 4)
        bits = (data[:, L.b:L.b + L.b_len].reshape(n, units, 4, 1) >> np.arange(8, dtype=np.uint8)) & 1
        q |= bits.reshape(n, units, UNIT)[..., _Q5_ORDER].astype(np.int16) << 2
        d = _f16(data[:, L.d:L.d + L.d_len].reshape(n, supers, 2))[..., 0]
        return _Fields(q - 4, d, sc=c.reshape(n, supers, 16).view(np.int8))
    q = _nibbles(a.reshape(n, units, 16)).astype(np.int16)
    if fmt == FORMAT_Q4_0:
        return _Fields(q - 8, _f16(c.reshape(n, units, 2))[..., 0])
    if fmt == FORMAT_Q4_1:
        dm = _f16(c.reshape(n, units, 2, 2))
        return _Fields(q, dm[..., 0, 0], m=dm[..., 1, 0])
    b = data[:, L.b:L.b + L.b_len]
    if fmt in (FORMAT_Q5_0, FORMAT_Q5_1, FORMAT_Q5_K):
        bits = (b.reshape(n, units, 4, 1) >> np.arange(8, dtype=np.uint8)) & 1
        q |= bits.reshape(n, units, UNIT)[..., _Q5_ORDER].astype(np.int16) << 4
    if fmt == FORMAT_Q5_0:
        return _Fields(q - 16, _f16(c.reshape(n, units, 2))[..., 0])
    if fmt == FORMAT_Q5_1:
        dm = _f16(c.reshape(n, units, 2, 2))
        return _Fields(q, dm[..., 0, 0], m=dm[..., 1, 0])
    if fmt == FORMAT_Q6_K:
        fields = (b.reshape(n, units, 8, 1) >> np.array([0, 2, 4, 6], np.uint8)) & 3
        q |= fields.reshape(n, units, UNIT)[..., _Q6_ORDER].astype(np.int16) << 4
        d = _f16(data[:, L.d:L.d + L.d_len].reshape(n, supers, 2))[..., 0]
        return _Fields(q - 32, d, sc=c.reshape(n, supers, 16).view(np.int8))
    c = c.reshape(n, supers, 16)
    sc, mins = _scales_mins(c[..., 4:16])
    return _Fields(q, _f16(c[..., 0:2])[..., 0], sc=sc, dmin=_f16(c[..., 2:4])[..., 0], mins=mins)


def _dequantize_slice(fmt: int, cols: int, data: np.ndarray) -> np.ndarray:
    f, n = _fields(fmt, cols, data), data.shape[0]
    q = f.q.astype(F32)
    if f.m is None and fmt not in K_FORMATS:  # Q8_0, Q4_0, Q5_0, the codebook formats
        w = f.d[..., None] * q
    elif fmt in (FORMAT_Q4_1, FORMAT_Q5_1):
        w = f.d[..., None] * q + f.m[..., None]
    elif fmt in (FORMAT_Q6_K, FORMAT_Q3_K, FORMAT_Q2_K):
        ds = f.d[..., None] * f.sc.astype(F32)                  # (n, supers, 16): d * scale
        w = ds.reshape(n, -1, 1) * q.reshape(n, -1, 16)       # 16 weights a scale
        if fmt == FORMAT_Q2_K:
            w -= (f.dmin[..., None] * f.mins.astype(F32)).reshape(n, -1, 1)
    else:
        ds = f.d[..., None] * f.sc.astype(F32)                  # (n, supers, 8): d * sc
        dm = f.dmin[..., None] * f.mins.astype(F32)             # dmin * m
        w = ds.reshape(n, -1, 1) * q - dm.reshape(n, -1, 1)
    return w.reshape(n, cols)


def dequantize(qt: QuantTensor) -> np.ndarray:
    """The weights (rows, cols) float32, from the repacked layout by arc.h's formulas (the
    module's docstring gives the order of the float32 operations; the results are exact but for
    the final add of Q4_1 and the K formats)."""
    out = np.empty(qt.shape, F32)
    with np.errstate(invalid="ignore", over="ignore"):  # a NaN or infinite scale is reported elsewhere
        for r, data in _slices(qt):
            out[r:r + data.shape[0]] = _dequantize_slice(qt.format, qt.cols, data)
    return out


def _suspect_rows(fmt: int, cols: int, data: np.ndarray) -> np.ndarray:
    """Which rows of a slice may hold a weight that is not finite (n,) bool: those with an f16
    scale (or minimum) that is NaN or infinite; MXFP4, those with an exponent of _MXFP4_HUGE or more."""
    L, n = layout(fmt, cols), data.shape[0]
    if fmt == FORMAT_MXFP4:
        return (data[:, L.c:L.c + L.c_len] >= _MXFP4_HUGE).any(axis=1)
    if fmt in (FORMAT_Q6_K, FORMAT_IQ4_XS, FORMAT_Q3_K, FORMAT_Q2_K):
        words = data[:, L.d:L.d + L.d_len].view("<u2")
    elif fmt in K_FORMATS:
        words = data[:, L.c:L.c + L.c_len].reshape(n, -1, 16)[..., 0:4].view("<u2").reshape(n, -1)
    else:
        words = data[:, L.c:L.c + L.c_len].view("<u2")
    return ((words & 0x7C00) == 0x7C00).any(axis=1)


def nonfinite_weight(qt: QuantTensor) -> tuple[int, int, bool] | None:
    """(row, col, is_nan) of the first weight that is NaN or infinite, or None where every one is
    finite. A weight of an f16-scaled format is finite exactly when its scales are (the largest
    f16 scale times the largest quant stays far inside float32), and an MXFP4 weight can only
    overflow under its largest exponents, so the scales are scanned and only a row that may hold
    such a weight is dequantized, to find it."""
    for r, data in _slices(qt):
        for i in np.flatnonzero(_suspect_rows(qt.format, qt.cols, data)):
            row = r + int(i)
            with np.errstate(invalid="ignore", over="ignore"):
                w = _dequantize_slice(qt.format, qt.cols, qt.data[row:row + 1])[0]
            bad = ~np.isfinite(w)
            if bad.any():
                col = int(np.argmax(bad))
                return row, col, bool(np.isnan(w[col]))
    return None


def all_zero(qt: QuantTensor) -> bool:
    """Whether every weight dequantizes to zero (all its scales zero, say); stops at the first
    slice that holds one that does not."""
    return not any(_dequantize_slice(qt.format, qt.cols, data).any() for _, data in _slices(qt))


def quantize_input(x) -> tuple[np.ndarray, np.ndarray]:
    """A quantized GEMV's input (cols,) float32 -> (x_q int8 (cols,), dx float32 (cols // 32,)).

    Per unit of 32: amax = max |x|, x_q = rint(x * (127 / amax)), dx = amax / 127, each division
    and product in float32; x_q and dx are 0 where amax is 0. Where amax is so small (below
    127 / FLT_MAX, about 3.7e-37) that 127 / amax overflows, arc.h leaves the result open: here
    such a unit quantizes to 0 and +-127, the limit of the formula."""
    x = np.asarray(x)
    require(x.dtype == F32 and x.ndim == 1 and x.size > 0 and x.size % UNIT == 0,
            f"quantize_input: x must be a 1-D float32 array of a multiple of {UNIT} values, got "
            f"{x.dtype} {x.shape}")
    require(bool(np.isfinite(x).all()), "quantize_input: x holds NaN or infinite values")
    u = x.reshape(-1, UNIT)
    amax = np.abs(u).max(axis=1)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(amax > 0, F32(127) / np.where(amax > 0, amax, F32(1)), F32(0)).astype(F32)
        scaled = u * inv[:, None]
    x_q = np.clip(np.nan_to_num(np.rint(scaled), nan=0.0), -127, 127).astype(np.int8)
    return x_q.reshape(-1), (amax / F32(127)).astype(F32)


def qgemv_reference(qt: QuantTensor, x) -> np.ndarray:
    """What the quantized GEMV computes, W (rows, cols) @ x (cols,) -> (rows,) float32: the input
    quantized per unit (quantize_input), per unit an exact integer sum of quants times x_q,
    scaled by arc.h's formula (Q8_0, Q4_0: dx*d*S; Q4_1: dx*(d*S + m*X); Q4_K, Q5_K:
    dx*(d*sc*S - dmin*m*X); Q6_K: dx*d*(scale_0*S_0 + scale_1*S_1), S the sums of q*x_q (q less
    its offset for Q4_0, Q5_0 and Q6_K; S_0, S_1 over the unit's two halves), X the sum of x_q;
    Q5_0 as Q4_0, Q5_1 as Q4_1; Q3_K as Q6_K; Q2_K dx*(d*(sc_0*S_0 + sc_1*S_1) - dmin*(m_0*X_0 +
    m_1*X_1)), X_0, X_1 the halves' sums; the codebook formats dx*scale*S, q the codebook's value and the
    scale 2^(e-128), d or d*s), then the units summed, all in float64, and rounded once to
    float32. The device sums in float32 in its own order: compare with a tolerance."""
    require(isinstance(qt, QuantTensor), f"qgemv_reference: W must be a QuantTensor, got {type(qt).__name__}")
    x = np.asarray(x)
    require(x.shape == (qt.cols,), f"qgemv_reference: x must have shape ({qt.cols},), got {x.shape}")
    x_q, dx = quantize_input(x)
    xq = x_q.reshape(-1, UNIT).astype(np.float64)
    dx = dx.astype(np.float64)
    xsum = xq.sum(axis=1)
    out = np.empty(qt.rows, F32)
    fmt = qt.format
    for r, data in _slices(qt):
        f, n = _fields(fmt, qt.cols, data), data.shape[0]
        q = f.q.astype(np.float64)
        if fmt in (FORMAT_Q6_K, FORMAT_Q3_K, FORMAT_Q2_K):
            s = np.einsum("nuhk,uhk->nuh", q.reshape(n, -1, 2, 16), xq.reshape(-1, 2, 16))
            scale = f.sc.astype(np.float64).reshape(n, -1, 2)  # two scales a unit
            unit = f.d.astype(np.float64).repeat(8, axis=1) * (scale * s).sum(axis=2)
            if fmt == FORMAT_Q2_K:  # less dmin * (m_0 X_0 + m_1 X_1), X_0, X_1 the halves' sums of x_q
                halves = xq.reshape(-1, 2, 16).sum(axis=2)
                mins = f.mins.astype(np.float64).reshape(n, -1, 2)
                unit -= f.dmin.astype(np.float64).repeat(8, axis=1) * (mins * halves).sum(axis=2)
        else:
            s = np.einsum("nuk,uk->nu", q, xq)
            if f.m is None and fmt not in K_FORMATS:
                unit = f.d.astype(np.float64) * s
            elif fmt in (FORMAT_Q4_1, FORMAT_Q5_1):
                unit = f.d.astype(np.float64) * s + f.m.astype(np.float64) * xsum
            else:
                ds = (f.d.astype(np.float64)[..., None] * f.sc).reshape(n, -1)
                dm = (f.dmin.astype(np.float64)[..., None] * f.mins).reshape(n, -1)
                unit = ds * s - dm * xsum
        out[r:r + n] = (unit * dx).sum(axis=1)
    return out
