"""bf16 words: every weight is held as the top 16 bits of a float32, stored as uint16."""

from __future__ import annotations

import numpy as np

from arcpy.errors import InvalidArgumentError, ModelFileError

# Rounding works on slices of this many values, so its temporaries stay a few megabytes even
# for a multi-gigabyte tensor (the output is the only full-size allocation).
_CHUNK = 1 << 16
# The finiteness scan reads slices of this many words (512 KB) into two reused buffers.
_SCAN = 1 << 18
_EXPONENT = np.uint16(0x7F80)
_MAGNITUDE = np.uint16(0x7FFF)
# No trained model has a weight near this; a file that does decodes garbage (every logit equal, or
# overflowing), so it is a load error, as a NaN is.
MAX_WEIGHT = 1e30
_LARGEST = np.uint16(0x7149)  # the largest bf16 word whose value is at most MAX_WEIGHT


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    """bf16 words (uint16, any shape) -> float32 of the same shape. Exact: bf16 is the top half of f32."""
    u16 = np.asarray(u16)
    if u16.dtype != np.uint16:
        raise InvalidArgumentError(f"bf16_to_f32 expects uint16 words, got {u16.dtype}")
    return np.asarray(u16.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x) -> np.ndarray:
    """float values (any shape) -> bf16 words (uint16), rounded to nearest, ties to even.

    Values too large for bf16 round to +-inf like any other RNE overflow; a NaN stays a NaN (its
    top bits are kept and the quiet bit set, so rounding can never carry it into an infinity).
    """
    src = np.asarray(x, dtype=np.float32, order="C")
    out = np.empty(src.shape, dtype=np.uint16)
    flat_in, flat_out = src.reshape(-1).view(np.uint32), out.reshape(-1)
    for start in range(0, flat_in.size, _CHUNK):
        bits = flat_in[start:start + _CHUNK]
        # Adding 0x7FFF plus the lowest kept bit rounds half-way cases towards the even word.
        # NaN words may wrap here; they are replaced below.
        rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
        is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        if is_nan.any():
            rounded[is_nan] = (bits[is_nan] >> np.uint32(16)) | np.uint32(0x0040)
        flat_out[start:start + _CHUNK] = rounded
    return out


def first_out_of_range(words: np.ndarray) -> int | None:
    """The flat index of the first bf16 word that is NaN, infinite or larger in magnitude than
    MAX_WEIGHT, or None when there is none.

    Sign aside, bf16 words order as their values do, infinity and NaN above every finite one: one
    comparison of the low fifteen bits finds all three. The words (C-contiguous, often a view of
    a mapped file) are scanned in slices into two reused buffers, so memory stays under a
    megabyte whatever the tensor's size.
    """
    flat = words.reshape(-1)
    bits = np.empty(min(flat.size, _SCAN), dtype=np.uint16)
    hit = np.empty(bits.size, dtype=bool)
    for start in range(0, flat.size, _SCAN):
        chunk = flat[start:start + _SCAN]
        n = chunk.size
        np.bitwise_and(chunk, _MAGNITUDE, out=bits[:n])
        np.greater(bits[:n], _LARGEST, out=hit[:n])
        if hit[:n].any():
            return start + int(np.argmax(hit[:n]))
    return None


def require_finite(words: np.ndarray, where: str) -> None:
    """Refuse bf16 words that hold a NaN, an infinity, or a magnitude past MAX_WEIGHT: one
    ModelFileError line, `where` first (the file and the tensor), with the first such weight's
    index."""
    i = first_out_of_range(words)
    if i is None:
        return
    at = [int(k) for k in np.unravel_index(i, words.shape)]
    word = int(words.reshape(-1)[i])
    if word & _EXPONENT == _EXPONENT:
        what = "a NaN weight" if word & 0x7F else "a weight that is infinite in bf16"
        raise ModelFileError(f"{where} holds {what} at {at}")
    value = float(bf16_to_f32(np.array([word], dtype=np.uint16))[0])
    raise ModelFileError(f"{where} holds a weight of {value:.3g} at {at}: no trained model has one beyond "
                         f"{MAX_WEIGHT:.0e}, and every answer it gave would be garbage")


def all_zero(words: np.ndarray) -> bool:
    """Whether every bf16 word is zero (either sign); stops at the first that is not."""
    flat = words.reshape(-1)
    for start in range(0, flat.size, _SCAN):
        if (flat[start:start + _SCAN] & _MAGNITUDE).any():
            return False
    return True
