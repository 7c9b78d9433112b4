"""MXFP4 (the OCP microscaling format of 4-bit floats), as gpt-oss's Hugging Face checkpoints store
their experts' matrices: decoded to float32 here, every value exactly.

A block is 32 consecutive values of a row: 16 bytes of e2m1 codes, value 2j in byte j's low
nibble and value 2j + 1 in its high nibble, and one byte of e8m0 scale s (a power of two,
2^(s - 127); 255 is NaN). An e2m1 code is a sign bit (8) and one of 0, 0.5, 1, 1.5, 2, 3, 4, 6.
A tensor of rows of n values is stored as two: `<name>_blocks` (..., n / 32, 16) uint8 and
`<name>_scales` (..., n / 32) uint8. Every decoded value fits bf16 exactly: two significant bits
times a power of two, from 2^-128 up; those of 2^128 and more (scale 254 with a code of 2 or more)
exceed float32 and are refused.
"""

from __future__ import annotations

import numpy as np

from arcpy.checks import quoted
from arcpy.errors import ModelFileError

BLOCK, BLOCK_BYTES = 32, 16  # values a block, bytes of codes a block
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
NAN_SCALE = 255


def decode(blocks: np.ndarray, scales: np.ndarray, where: str) -> np.ndarray:
    """blocks (..., G, 16) uint8 and scales (..., G) uint8 -> values (..., G * 32) float32. A NaN
    scale, or a value beyond float32, is one ModelFileError line naming `where`."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1:] != (BLOCK_BYTES,):
        raise ModelFileError(f"{where}: MXFP4 blocks of shape {quoted(list(blocks.shape))} do not match scales of "
                             f"shape {quoted(list(scales.shape))} (blocks: the scales' shape and {BLOCK_BYTES} bytes)")
    if np.any(scales == NAN_SCALE):
        raise ModelFileError(f"{where}: an MXFP4 block's scale is NaN (e8m0 255)")
    out = np.empty(blocks.shape[:-1] + (BLOCK,), np.float32)
    out[..., 0::2] = E2M1[blocks & 0x0F]
    out[..., 1::2] = E2M1[blocks >> 4]
    with np.errstate(over="ignore"):
        out *= np.ldexp(np.float32(1.0), scales.astype(np.int32) - 127)[..., None].astype(np.float32)
    if not np.all(np.isfinite(out)):
        raise ModelFileError(f"{where}: an MXFP4 value exceeds the float32 range (scale 2^127 or more)")
    return out.reshape(*blocks.shape[:-2], -1)
