"""The forms a KV cache may hold its rows in, as the NumPy reference computes them: what a k (after
RoPE) or v row reads back as after it is stored. The reference holds every form as float32 arrays of
the values the form can represent, so the attention's arithmetic is the same for all of them.

- bf16: each value rounded to the nearest bf16 (ties to even); libarc's cache.
- q8_0: llama.cpp's Q8_0 blocks along a row, 32 values each: the scale d = amax / 127 in float32, the
  values q = round(x / d) (halves away from zero) as int8, and d stored as float16; a value reads
  back as q times the float16 d. It takes 34 bytes per 32 values (bf16: 64).
- fp8: each value rounded to the nearest float8 e4m3 (ties to even; 3 bits of mantissa, exponents
  -6 to 8, subnormals down to 2^-9, saturating at 448), no scale. 32 bytes per 32 values.

libarc holds its cache in bf16 or q8_0 (arc_model.h's arc_kv_form, the same roundings; LIBARC_FORMS);
the NumPy backend in any of them. scripts/perplexity.py measures what each costs a model's
perplexity against bf16.
"""

from __future__ import annotations

import numpy as np

from arcpy.codes import KV_FORMATS
from arcpy.devices.reference_ops import round_bf16
from arcpy.errors import InvalidArgumentError

F32 = np.float32
BYTES_PER_32 = {"bf16": 64, "q8_0": 34, "fp8": 32}  # a row's bytes per 32 values
Q8_BLOCK = 32
E4M3_MAX = 448.0


def round_q8_0(x: np.ndarray) -> np.ndarray:
    """x (..., n), n % 32 == 0, as Q8_0 blocks along its last axis read back (float32)."""
    x = np.asarray(x, F32)
    if x.shape[-1] % Q8_BLOCK:
        raise InvalidArgumentError(f"a q8_0 row holds whole blocks of {Q8_BLOCK} values, got {x.shape[-1]}")
    blocks = x.reshape(-1, Q8_BLOCK)
    d = np.abs(blocks).max(axis=1, keepdims=True) / F32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, F32(0), F32(1) / d).astype(F32)
    scaled = np.abs(blocks * inv)
    whole = np.floor(scaled)
    q = np.copysign(np.minimum(whole + np.floor(2 * (scaled - whole)), 127), blocks)  # halves away from zero
    return (q * d.astype(np.float16).astype(F32)).astype(F32).reshape(x.shape)


def round_fp8(x: np.ndarray) -> np.ndarray:
    """x as the nearest float8 e4m3 values (ties to even, saturating at +-448), as float32."""
    x = np.asarray(x, F32)
    a = np.minimum(np.abs(x), F32(E4M3_MAX))
    # The spacing of e4m3 values at |x|: 2^(e - 3) for |x| in [2^e, 2^(e + 1)), e >= -6; 2^-9 below.
    _, e = np.frexp(np.where(a > 0, a, F32(1)))  # a = m 2^e, m in [0.5, 1): exponent e - 1
    step = np.exp2(np.maximum(e - 1, -6) - 3).astype(F32)
    r = np.minimum(np.rint(a / step) * step, F32(E4M3_MAX))  # rint: ties to even
    return np.copysign(r, x).astype(F32)


ROUND = {"bf16": round_bf16, "q8_0": round_q8_0, "fp8": round_fp8}
LIBARC_FORMS = {"bf16": 0, "q8_0": 1}  # arc_kv_form's values


def kv_position_bytes(fmt: str, layers: int, kv_heads: int, head_dim: int) -> int:
    """Bytes a position's k and v rows take in a cache of form `fmt` over `layers` attention layers."""
    return 2 * layers * kv_heads * head_dim * BYTES_PER_32[fmt] // 32


def check_kv_form(fmt: str, head_dim: int) -> None:
    """One line where `fmt` is no form, or one that cannot hold rows of head_dim values (q8_0: whole
    blocks of 32)."""
    kv_round(fmt)
    if fmt == "q8_0" and head_dim % Q8_BLOCK:
        raise InvalidArgumentError(f"a q8_0 KV cache holds whole blocks of {Q8_BLOCK} values; this model's heads have "
                                   f"{head_dim}: use --kv-cache bf16")


def libarc_form(fmt: str) -> int:
    """arc_kv_form's value for `fmt`; one line where libarc holds no cache of that form."""
    kv_round(fmt)
    if fmt not in LIBARC_FORMS:
        raise InvalidArgumentError(f"the CUDA backend holds its KV cache in {' or '.join(LIBARC_FORMS)}, not {fmt} "
                                   "(the NumPy backend takes every form)")
    return LIBARC_FORMS[fmt]


def kv_round(fmt: str):
    """The function that gives what a cache of form `fmt` reads back (one of KV_FORMATS)."""
    if fmt not in ROUND:
        raise InvalidArgumentError(f"kv cache form must be one of {', '.join(KV_FORMATS)}, got {fmt!r}")
    return ROUND[fmt]
