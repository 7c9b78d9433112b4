"""bf16 words for the GPU tests, written here rather than imported from arcpy, so that the tests
stand apart from the code they check."""

import numpy as np

F32 = np.float32


def to_bf16(x) -> np.ndarray:
    """float32 -> bf16 words, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def from_bf16(w) -> np.ndarray:
    return (np.asarray(w, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(F32)


def random_bf16(rng, shape, scale=1.0) -> np.ndarray:
    return to_bf16(rng.standard_normal(shape, dtype=F32) * F32(scale))
