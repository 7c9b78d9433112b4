"""bf16 words: every weight is held as the top 16 bits of a float32, stored as uint16."""

from __future__ import annotations

import numpy as np

from arcpy.errors import InvalidArgumentError

# Rounding works on slices of this many values, so its temporaries stay a few megabytes even
# for a multi-gigabyte tensor (the output is the only full-size allocation).
_CHUNK = 1 << 16


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
