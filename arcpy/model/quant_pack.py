"""QuantTensors made: GGUF blocks repacked into arc.h's row layout, and random ones for presets.

How each GGUF block maps to a row's arrays (quant.py gives the layout; unit u: weights 32u..32u+31):
    Q8_0  (d, qs[32])                  A = qs, C = d: both copied.
    Q4_0  (d, qs[16])                  A = qs (GGUF's nibble order is arc.h's), C = d.
    Q4_1  (d, m, qs[16])               A = qs, C = d, m.
    Q4_K  (d, dmin, scales[12], qs[128])  C = the first 16 bytes as they are; bytes 32j..32j+31
          of qs hold units 2j (low nibbles) and 2j+1 (high nibbles), regrouped into arc.h's
          nibble pairs (weight k with weight k + 16).
    Q5_K  Q4_K's, and qh[32]: bit s of qh[l] is bit 4 of unit s's weight l, gathered into each
          unit's word H.
    Q6_K  (ql[128], qh[64], scales[16], d): bytes 64h + 32c .. +31 of ql hold units 4h + c (low
          nibbles) and 4h + 2 + c (high nibbles); bits 2t, 2t+1 of qh[32h + l] are bits 4 and 5
          of unit 4h + t's weight l, gathered into H0, H1; C = scales, D = d.
    MXFP4 (e, qs[16])                  A = qs's codes reordered (quant.CODE_WEIGHT), C = e.
    IQ4_NL (d, qs[16])                 A = qs's codes reordered, C = d.
    IQ4_XS (d, scales_h, scales_l[4], qs[128])  bytes 16j..16j+15 of qs: unit j's codes, reordered;
          C = each unit's 6-bit scale less 32 (low 4 bits from scales_l, high 2 from scales_h), D = d.
    Q5_0  (d, qh, qs[16])              A = qs, B: bit l of qh is bit 4 of weight l, gathered into
          H as Q5_K's; C = d.
    Q5_1  (d, m, qh, qs[16])           A = qs, B as Q5_0's, C = d, m.
    Q3_K  (hmask[32], qs[64], scales[12], d)  bits 2s, 2s+1 of qs[32h + l] are unit 4h + s's
          weight l, regrouped into its two words; bit s of hmask[l] is bit 2 of unit s's weight l,
          gathered into H as Q5_K's; C = the 16 6-bit scales less 32, D = d.
    Q2_K  (scales[16], qs[64], d, dmin)  qs as Q3_K's; C = scales, D = d, dmin.
Every pass is a few NumPy operations over a slice of rows (about a megabyte), so the source can
be a memory-mapped file and no tensor-sized temporary is made.
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from arcpy.checks import is_int, quoted, require
from arcpy.codes import (
    FORMAT_IQ4_NL,
    FORMAT_IQ4_XS,
    FORMAT_MXFP4,
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
from arcpy.errors import ModelFileError
from arcpy.model.quant import (
    CODE_WEIGHT,
    IQ4_VALUES,
    MXFP4_VALUES,
    Q5_WEIGHT,
    SUPER,
    SUPER_FORMATS,
    UNIT,
    QuantTensor,
    layout,
    nonfinite_weight,
)

# The GGUF block types libarc keeps quantized, and their arc formats.
GGUF_FORMATS = {
    GGMLQuantizationType.Q8_0: FORMAT_Q8_0, GGMLQuantizationType.Q4_0: FORMAT_Q4_0,
    GGMLQuantizationType.Q4_1: FORMAT_Q4_1, GGMLQuantizationType.Q4_K: FORMAT_Q4_K,
    GGMLQuantizationType.Q5_K: FORMAT_Q5_K, GGMLQuantizationType.Q6_K: FORMAT_Q6_K,
    GGMLQuantizationType.MXFP4: FORMAT_MXFP4, GGMLQuantizationType.IQ4_NL: FORMAT_IQ4_NL,
    GGMLQuantizationType.IQ4_XS: FORMAT_IQ4_XS, GGMLQuantizationType.Q5_0: FORMAT_Q5_0,
    GGMLQuantizationType.Q5_1: FORMAT_Q5_1, GGMLQuantizationType.Q3_K: FORMAT_Q3_K,
    GGMLQuantizationType.Q2_K: FORMAT_Q2_K,
}
_SLICE_BYTES = 1 << 19  # source bytes a slice of the repack reads (512 KiB: fastest here)


def _record(itemsize: int, **fields: tuple[int, int]) -> np.dtype:
    """A GGUF block as a record of raw byte fields: name=(offset, length)."""
    names = list(fields)
    return np.dtype({"names": names, "formats": [f"V{fields[k][1]}" for k in names],
                     "offsets": [fields[k][0] for k in names], "itemsize": itemsize})


_BLOCKS = {
    FORMAT_Q8_0: _record(34, d=(0, 2), qs=(2, 32)),
    FORMAT_Q4_0: _record(18, d=(0, 2), qs=(2, 16)),
    FORMAT_Q4_1: _record(20, d=(0, 4), qs=(4, 16)),  # d, m
    FORMAT_Q4_K: _record(144, head=(0, 16), qs=(16, 128)),  # head: d, dmin, the 6-bit scales and mins
    FORMAT_Q5_K: _record(176, head=(0, 16), qh=(16, 32), qs=(48, 128)),
    FORMAT_Q6_K: _record(210, ql=(0, 128), qh=(128, 64), sc=(192, 16), d=(208, 2)),
    FORMAT_MXFP4: _record(17, e=(0, 1), qs=(1, 16)),
    FORMAT_IQ4_NL: _record(18, d=(0, 2), qs=(2, 16)),
    FORMAT_IQ4_XS: _record(136, d=(0, 2), sh=(2, 2), sl=(4, 4), qs=(8, 128)),
    FORMAT_Q5_0: _record(22, d=(0, 2), qh=(2, 4), qs=(6, 16)),
    FORMAT_Q5_1: _record(24, d=(0, 4), qh=(4, 4), qs=(8, 16)),  # d, m
    FORMAT_Q3_K: _record(110, hmask=(0, 32), qs=(32, 64), sc=(96, 12), d=(108, 2)),
    FORMAT_Q2_K: _record(84, sc=(0, 16), qs=(16, 64), d=(80, 4)),  # d, dmin
}
_LOW = np.uint64(0x0F0F0F0F0F0F0F0F)
_FOUR = np.uint64(4)


def _bytes(field: np.ndarray, width: int) -> np.ndarray:
    """A field of N blocks -> its bytes, contiguous, as (N, bytes / width) items of `width` bytes."""
    return np.ascontiguousarray(field).view(np.uint8).reshape(field.shape[0], -1).view(f"V{width}")


def _nibble_pairs(qs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """16-byte pieces (N, 2k) taken in pairs (x, y), the low nibbles of x then y being one unit's
    32 weights and the high nibbles another's -> those two units in arc.h's nibble order, (N, k)
    16-byte items each: lo = low(x) | low(y) << 4, hi = high(x) | high(y) << 4."""
    x = np.ascontiguousarray(qs[:, 0::2]).view(np.uint64)
    y = np.ascontiguousarray(qs[:, 1::2]).view(np.uint64)
    lo = x & _LOW
    lo |= (y & _LOW) << _FOUR
    hi = x >> _FOUR
    hi &= _LOW
    hi |= y & ~_LOW
    return lo.view("V16"), hi.view("V16")


def _q5_high_bits(qh: np.ndarray) -> np.ndarray:
    """qh (N, 32 bytes) -> each unit's H (8 s, N) uint32. Word w = 4h + i of qh holds the bytes
    16h + 4i + b (b = 0..3); bit s of its byte b, moved to bit 4h + i, is unit s's bit for
    weight 16h + 4i + b: arc.h's bit 8b + 4h + i."""
    words = np.ascontiguousarray(qh.view("<u4").T)  # (8 w, N)
    shift = np.arange(8, dtype=np.uint32).reshape(8, 1)
    out = np.zeros((8, words.shape[1]), np.uint32)
    for w in range(8):
        out |= ((words[w] >> shift) & np.uint32(0x01010101)) << np.uint32(w)
    return out


def _q6_high_bits(qh: np.ndarray) -> np.ndarray:
    """qh (N, 64 bytes) -> units' H0, H1 (2 h, 4 t, 2 H, N) uint32. Word 8h + 4H + i holds bytes
    32h + 16H + 4i + b; bits 2t, 2t+1 of its byte b, moved to bits 2i, 2i+1, are unit 4h + t's
    bits 4 and 5 of weight 16H + 4i + b: arc.h's bits 8b + 2i, 8b + 2i + 1 of word H."""
    words = np.ascontiguousarray(qh.view("<u4").T).reshape(2, 2, 4, -1)  # (h, H, i, N)
    shift = np.array([0, 2, 4, 6], np.uint32).reshape(1, 4, 1, 1)
    out = np.zeros((2, 4, 2, words.shape[-1]), np.uint32)
    for i in range(4):
        out |= ((words[:, None, :, i, :] >> shift) & np.uint32(0x03030303)) << np.uint32(2 * i)
    return out


def _reorder_codes(qs: np.ndarray) -> np.ndarray:
    """GGUF's 16 bytes of a unit's codes (N, 16) uint8, byte k holding weight k (low nibble) and
    k + 16 (high) -> arc.h's (N, 16): nibble n is weight CODE_WEIGHT[n]."""
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)[:, CODE_WEIGHT]
    return q[:, 0::2] | (q[:, 1::2] << 4)


def _q5_words(qh: np.ndarray) -> np.ndarray:
    """Q5_0's and Q5_1's qh (N,) uint32, bit l the fifth bit of weight l -> Q5_K's H (N,)."""
    bits = (qh[:, None] >> Q5_WEIGHT.astype(np.uint32)) & np.uint32(1)
    return np.bitwise_or.reduce(bits << np.arange(32, dtype=np.uint32), axis=1)


def _iq4xs_scales(sh: np.ndarray, sl: np.ndarray) -> np.ndarray:
    """IQ4_XS's scales_h (N, 2 bytes) and scales_l (N, 4 bytes) -> each unit's scale less 32 (N, 8) int8."""
    low = np.stack([sl & 0x0F, sl >> 4], axis=-1).reshape(-1, 8)
    high = (sh.view("<u2") >> (2 * np.arange(8, dtype=np.uint16))) & 3
    return ((low | (high.astype(np.uint8) << 4)).astype(np.int16) - 32).astype(np.int8)


def _two_bit_words(qs: np.ndarray) -> np.ndarray:
    """The 64 bytes of 2-bit quants of N superblocks (N, 64) -> arc.h's (N, 8 units, 8 bytes):
    unit 4h + s's weight l is bits 2s, 2s+1 of qs[32h + l]; it becomes bits 2i, 2i+1 of byte b of
    the unit's word l // 16, l % 16 = 4i + b."""
    q = (qs.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3  # (N, h, s, l)
    q = q.reshape(-1, 8, 2, 4, 4)  # (N, unit, word, i, b)
    return (q << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)).sum(axis=3, dtype=np.uint8).reshape(-1, 8, 8)


def _q3k_scales(sc: np.ndarray) -> np.ndarray:
    """Q3_K's 12 bytes of 6-bit scales (N, 12) -> the 16 scales less 32 (N, 16) int8: scale j's low 4
    bits are nibble j // 8 of byte j % 8, its high 2 bits field j // 4 of byte 8 + j % 4."""
    j = np.arange(16)
    low = (sc[:, j % 8] >> (4 * (j // 8)).astype(np.uint8)) & 0x0F
    high = (sc[:, 8 + j % 4] >> (2 * (j // 4)).astype(np.uint8)) & 3
    return ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8)


def _repack_slice(fmt: int, cols: int, src: np.ndarray, out: np.ndarray) -> None:
    """GGUF rows (n, blocks * block bytes), contiguous -> arc.h rows written into out (n, row_bytes)."""
    L, n = layout(fmt, cols), src.shape[0]
    units, supers = cols // UNIT, cols // SUPER
    for start, stop in ((L.a + L.a_len, L.b), (L.b + L.b_len, L.c), (L.c + L.c_len, L.d),
                        (L.d + L.d_len, L.row_bytes)):
        out[:, start:stop] = 0  # the padding of each array
    blocks = src.reshape(-1, _BLOCKS[fmt].itemsize).view(_BLOCKS[fmt])[:, 0]
    a = out[:, L.a:L.a + L.a_len].view("V16")  # (n, units) for every format but Q8_0
    c = out[:, L.c:L.c + L.c_len]
    if fmt in (FORMAT_MXFP4, FORMAT_IQ4_NL, FORMAT_IQ4_XS):
        qs = _bytes(blocks["qs"], 1).view(np.uint8).reshape(-1, 16)  # a unit a row
        out[:, L.a:L.a + L.a_len] = _reorder_codes(qs).reshape(n, L.a_len)
        if fmt == FORMAT_MXFP4:
            c[...] = _bytes(blocks["e"], 1).view(np.uint8).reshape(n, units)
        elif fmt == FORMAT_IQ4_NL:
            c.view("V2")[...] = blocks["d"].reshape(n, units)
        else:
            scales = _iq4xs_scales(_bytes(blocks["sh"], 1).view(np.uint8), _bytes(blocks["sl"], 1).view(np.uint8))
            c.view(np.int8)[...] = scales.reshape(n, units)
            out[:, L.d:L.d + L.d_len].view("V2")[...] = blocks["d"].reshape(n, supers)
        return
    if fmt in (FORMAT_Q3_K, FORMAT_Q2_K):
        qs = _bytes(blocks["qs"], 1).view(np.uint8)
        out[:, L.a:L.a + L.a_len] = _two_bit_words(qs).reshape(n, L.a_len)
        out[:, L.d:L.d + L.d_len].view(f"V{L.d_len // supers}")[...] = blocks["d"].reshape(n, supers)
        if fmt == FORMAT_Q2_K:
            c.view("V16")[...] = blocks["sc"].reshape(n, supers)
            return
        c.view(np.int8)[...] = _q3k_scales(_bytes(blocks["sc"], 1).view(np.uint8)).reshape(n, L.c_len)
        hmask = _bytes(blocks["hmask"], 1).view(np.uint8)  # (N, 32): bit s of byte l, unit s's weight l
        bits = (hmask[:, None, :] >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1  # (N, unit, l)
        words = np.bitwise_or.reduce(bits[..., Q5_WEIGHT].astype(np.uint32) << np.arange(32, dtype=np.uint32), axis=2)
        out[:, L.b:L.b + L.b_len].view("<u4")[...] = words.reshape(n, units)
        return
    if fmt in (FORMAT_Q5_0, FORMAT_Q5_1):
        c.view("V4" if fmt == FORMAT_Q5_1 else "V2")[...] = blocks["d"].reshape(n, units)
        out[:, L.a:L.a + L.a_len].view("V16")[...] = blocks["qs"].reshape(n, units)
        qh = _bytes(blocks["qh"], 4).view("<u4").reshape(-1)
        out[:, L.b:L.b + L.b_len].view("<u4")[...] = _q5_words(qh).reshape(n, units)
        return
    if fmt in (FORMAT_Q8_0, FORMAT_Q4_0, FORMAT_Q4_1):
        width = 4 if fmt == FORMAT_Q4_1 else 2
        c.view(f"V{width}")[...] = blocks["d"].reshape(n, units)
        out[:, L.a:L.a + L.a_len].view(f"V{L.a_len // units}")[...] = blocks["qs"].reshape(n, units)
        return
    if fmt in (FORMAT_Q4_K, FORMAT_Q5_K):
        c.view("V16")[...] = blocks["head"].reshape(n, supers)
        # The block is whole 16-byte pieces: qs is read in place. Bytes 32j..32j+31: units 2j, 2j+1.
        lo, hi = _nibble_pairs(src.reshape(-1, _BLOCKS[fmt].itemsize).view("V16")[:, -8:])
        dst = a.reshape(n, supers, 4, 2)
        dst[..., 0] = lo.reshape(n, supers, 4)
        dst[..., 1] = hi.reshape(n, supers, 4)
        if fmt == FORMAT_Q5_K:
            h = _q5_high_bits(_bytes(blocks["qh"], 1).view(np.uint8))
            out[:, L.b:L.b + L.b_len].view("<u4").reshape(n, supers, 8)[...] = h.T.reshape(n, supers, 8)
        return
    lo, hi = _nibble_pairs(_bytes(blocks["ql"], 16))          # bytes 64h + 32c..: units 4h + c, 4h + 2 + c
    dst = a.reshape(n, supers, 2, 2, 2)                        # (h, s, c): unit 4h + 2s + c
    dst[:, :, :, 0] = lo.reshape(n, supers, 2, 2)
    dst[:, :, :, 1] = hi.reshape(n, supers, 2, 2)
    h = _q6_high_bits(_bytes(blocks["qh"], 1).view(np.uint8))
    out[:, L.b:L.b + L.b_len].view("<u4").reshape(n, supers, 2, 4, 2)[...] = \
        h.transpose(3, 0, 1, 2).reshape(n, supers, 2, 4, 2)
    c.view("V16")[...] = blocks["sc"].reshape(n, supers)
    out[:, L.d:L.d + L.d_len].view("V2")[...] = blocks["d"].reshape(n, supers)


def from_gguf(qtype, shape, raw, where: str = "GGUF tensor") -> QuantTensor:
    """GGUF blocks of type `qtype` (one of GGUF_FORMATS) holding a (rows, cols)
    matrix, as uint8 bytes (any shape; a memory-mapped file's slice is read a slice of rows at a
    time) -> the same weights as a QuantTensor. A NaN or infinite scale is refused: one
    ModelFileError line, `where` first, naming the first weight it spoils."""
    try:
        qtype = GGMLQuantizationType(qtype)
    except ValueError:
        raise ModelFileError(f"{where}: unknown GGUF type {quoted(qtype)}") from None
    if qtype not in GGUF_FORMATS:
        raise ModelFileError(f"{where}: type {qtype.name} has no arc format "
                             f"(kept quantized: {', '.join(t.name for t in GGUF_FORMATS)})")
    fmt = GGUF_FORMATS[qtype]
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    shape = tuple(shape)
    if not (len(shape) == 2 and all(is_int(s) and s > 0 for s in shape) and shape[1] % block == 0):
        raise ModelFileError(f"{where}: a {qtype.name} matrix needs (rows, cols) with cols a multiple of {block}, "
                             f"got {quoted(list(shape))}")
    rows, cols = int(shape[0]), int(shape[1])
    native = cols // block * block_bytes
    raw = np.asarray(raw)
    if raw.dtype != np.uint8 or raw.size != rows * native:
        raise ModelFileError(f"{where}: {rows} rows of {cols} {qtype.name} weights take {rows * native} bytes, "
                             f"got {raw.size} {raw.dtype}")
    src = raw.reshape(rows, native)
    out = np.empty((rows, layout(fmt, cols).row_bytes), np.uint8)
    step = max(1, _SLICE_BYTES // native)
    for r in range(0, rows, step):
        _repack_slice(fmt, cols, src[r:r + step], out[r:r + step])
    qt = QuantTensor(fmt, (rows, cols), out)
    bad = nonfinite_weight(qt)
    if bad is not None:
        row, col, nan = bad
        why = "exponent too large for its values" if fmt == FORMAT_MXFP4 else "scale that is NaN or infinite"
        raise ModelFileError(f"{where} holds {'a NaN' if nan else 'an infinite'} weight at [{row}, {col}] "
                             f"(a {qtype.name} {why})")
    return qt


# --- random tensors ---------------------------------------------------------------------------

# Root mean square of the quants as random bytes make them: uniform int8 (Q8_0), q - 8 over
# 0..15 (Q4_0), q - 32 over 0..63 (Q6_K), a 6-bit scale over 0..63 (K formats), an int8 scale
# (Q6_K); and of q - 7.5 over 0..15, q - 15.5 over 0..31 (Q4_1 and the K formats, centred by
# their minimums). Scales are drawn times a uniform factor in [0.5, 1.5], whose mean square is 13/12.
_RMS_INT8 = math.sqrt(5461.5)
_RMS_Q4, _RMS_Q4_CENTRED, _RMS_Q5_CENTRED = math.sqrt(21.5), math.sqrt(21.25), math.sqrt(85.25)
_RMS_Q6, _RMS_SC6 = math.sqrt(341.5), math.sqrt(1333.5)
# q - 16 over 0..31 (Q5_0), and the codebooks' values over uniform codes (MXFP4, the IQ4 formats).
_RMS_Q5 = math.sqrt(85.5)
# q - 4 over 0..7 (Q3_K), q - 1.5 over 0..3 (Q2_K), a 4-bit scale over 0..15 (Q2_K).
_RMS_Q3, _RMS_Q2_CENTRED, _RMS_SC4 = math.sqrt(5.5), math.sqrt(1.25), math.sqrt(77.5)
_RMS_MXFP4, _RMS_IQ4 = math.sqrt(float(np.mean(MXFP4_VALUES.astype(float) ** 2))), \
    math.sqrt(float(np.mean(IQ4_VALUES.astype(float) ** 2)))
_FACTOR_RMS = math.sqrt(13 / 12)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape[:-1], -1)


def _pack_scales_mins(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """6-bit scales and mins (..., 8) -> GGUF's 12 bytes (the inverse of get_scale_min_k4)."""
    return np.concatenate([(sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6),
                           (m[..., :4] & 63) | ((m[..., 4:] >> 4) << 6),
                           (sc[..., 4:] & 0x0F) | ((m[..., 4:] & 0x0F) << 4)], axis=-1)


def random_quant(fmt: int, shape, rng: np.random.Generator, std: float = 0.02) -> QuantTensor:
    """A (rows, cols) QuantTensor of random blocks, made in the layout directly: random quants and
    high bits; finite scales drawn so that the weights have about `std` as root mean square (and
    a mean near 0: Q4_1's and the K formats' minimums centre their quants). Every bit of the
    6-bit scales and of the int8 ones is exercised; the IQ4 formats' d takes either sign (their
    codebook is not centred), MXFP4's exponent two neighbouring values in the proportion that
    gives `std`. Deterministic for a given generator state."""
    require(fmt in GGUF_FORMATS.values(), f"random_quant: format must be a quantized arc_format, got {fmt!r}")
    require(isinstance(std, float) and 0 < std < 1e3, f"random_quant: std must be a float in (0, 1000), got {std!r}")
    shape = tuple(shape)
    require(len(shape) == 2 and all(is_int(s) and s > 0 for s in shape),
            f"random_quant: shape must be (rows, cols) of positive ints, got {shape!r}")
    rows, cols = shape
    L = layout(fmt, cols)  # checks cols against the format's block
    units, supers = cols // UNIT, cols // SUPER
    # Random bytes everywhere (quants, high bits, Q6_K's int8 scales), then the f16 scales and the padding.
    out = rng.bit_generator.random_raw(rows * L.row_bytes // 8).view(np.uint8).reshape(rows, L.row_bytes)
    factor = (np.float32(0.5) + rng.random((rows, supers if fmt in SUPER_FORMATS else units), dtype=np.float32))
    c = out[:, L.c:L.c + L.c_len]
    if fmt == FORMAT_MXFP4:  # e = k or k + 1: a mean square 4^k (1 + 3p) of 2^(e - 128) is (std / rms)^2
        t = math.log2(std / _RMS_MXFP4)
        k = math.floor(t)
        p = (4.0 ** (t - k) - 1) / 3
        c[...] = k + 128 + (rng.random((rows, units)) < p)
    elif fmt in (FORMAT_Q8_0, FORMAT_Q4_0, FORMAT_Q5_0, FORMAT_IQ4_NL):
        rms = {FORMAT_Q8_0: _RMS_INT8, FORMAT_Q4_0: _RMS_Q4, FORMAT_Q5_0: _RMS_Q5, FORMAT_IQ4_NL: _RMS_IQ4}[fmt]
        d = factor * np.float32(std / rms / _FACTOR_RMS)
        if fmt == FORMAT_IQ4_NL:
            d *= rng.choice(np.array([-1, 1], np.float32), d.shape)
        c.reshape(rows, units, 2)[...] = _f16_bytes(d[..., None])
    elif fmt == FORMAT_IQ4_XS:  # scales s in -32..31, from the random bytes
        c[...] = ((c & 63).astype(np.int16) - 32).astype(np.int8).view(np.uint8)
        d = factor * np.float32(std / (_RMS_Q6 * _RMS_IQ4 * _FACTOR_RMS))
        d *= rng.choice(np.array([-1, 1], np.float32), d.shape)
        out[:, L.d:L.d + L.d_len].reshape(rows, supers, 2)[...] = _f16_bytes(d[..., None])
    elif fmt in (FORMAT_Q4_1, FORMAT_Q5_1):
        five = fmt == FORMAT_Q5_1
        d = factor * np.float32(std / (_RMS_Q5_CENTRED if five else _RMS_Q4_CENTRED) / _FACTOR_RMS)
        # centred on q = 15.5 or 7.5
        m = -d * (np.float32(15.0 if five else 7.0) + rng.random(d.shape, dtype=np.float32))
        c.reshape(rows, units, 2, 2)[...] = _f16_bytes(np.stack([d, m], axis=-1)[..., None])
    elif fmt == FORMAT_Q3_K:  # scales in -32..31 from the random bytes; q - 4 over 0..7
        c[...] = ((c & 63).astype(np.int16) - 32).astype(np.int8).view(np.uint8)
        d = factor * np.float32(std / (_RMS_Q6 * _RMS_Q3 * _FACTOR_RMS))
        out[:, L.d:L.d + L.d_len].reshape(rows, supers, 2)[...] = _f16_bytes(d[..., None])
    elif fmt == FORMAT_Q2_K:  # m = sc and dmin = 1.5 d: the weights d sc (q - 1.5), centred
        c[...] = (c & 0x0F) * np.uint8(0x11)
        d = factor * np.float32(std / (_RMS_SC4 * _RMS_Q2_CENTRED * _FACTOR_RMS))
        out[:, L.d:L.d + L.d_len].reshape(rows, supers, 4)[...] = _f16_bytes(np.stack([d, d * np.float32(1.5)], axis=-1))
    elif fmt == FORMAT_Q6_K:
        d = factor * np.float32(std / (_RMS_Q6 * _RMS_INT8 * _FACTOR_RMS))
        out[:, L.d:L.d + L.d_len].reshape(rows, supers, 2)[...] = _f16_bytes(d[..., None])
    else:
        five = fmt == FORMAT_Q5_K
        d = factor * np.float32(std / (_RMS_SC6 * (_RMS_Q5_CENTRED if five else _RMS_Q4_CENTRED) * _FACTOR_RMS))
        sc = rng.integers(0, 64, (rows, supers, 8), dtype=np.uint8)
        # dmin = 16 d (Q5_K) or 8 d (Q4_K) and m = round(sc * 15.5 / 16) or round(sc * 7.5 / 8):
        # dmin * m is d * sc * 15.5 or 7.5, the middle of the quants.
        m = ((sc.astype(np.uint16) * 31 + 16) // 32 if five else (sc.astype(np.uint16) * 15 + 8) // 16).astype(np.uint8)
        dmin = d * np.float32(16.0 if five else 8.0)
        block = c.reshape(rows, supers, 16)
        block[..., 0:4] = _f16_bytes(np.stack([d, dmin], axis=-1))
        block[..., 4:16] = _pack_scales_mins(sc, m)
    for start, stop in ((L.a + L.a_len, L.b), (L.b + L.b_len, L.c), (L.c + L.c_len, L.d),
                        (L.d + L.d_len, L.row_bytes)):
        out[:, start:stop] = 0
    return QuantTensor(fmt, (rows, cols), out)

