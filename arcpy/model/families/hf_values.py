"""config.json's values, each read with its checks (the readers of arcpy.model.hf and of every
family in arcpy.model.families share them): typed keys, and the RoPE settings.

Everything read here came from a file: each key is checked for its JSON type before use (a wrong
type is one ModelFileError line, never a TypeError), numbers must convert to finite floats, and
every value a message repeats is quoted. An absent key takes its default; a null is a wrong type,
except where null has a meaning (no rope scaling, no sliding window).
"""

from __future__ import annotations

import math
from typing import Mapping

from arcpy.checks import is_finite_real, is_int, quoted
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.model.config import INT32_LIMIT, LinearScaling, LongRopeScaling, RopeScaling, Scaling, YarnScaling

_IGNORED_ROPE_TYPES = (None, "default")
_MISSING = object()


def value(d: Mapping, key: str, source: str, default=_MISSING):
    """d[key], or `default` when absent; absent without a default is an error.

    A null is returned as it is, for the caller's type check to refuse: "rms_norm_eps": null does
    not say 1e-6. The keys where null has a meaning (rope_scaling, sliding_window) are read apart.
    """
    if key not in d:
        if default is _MISSING:
            raise ModelFileError(f"{source}: missing key '{key}'")
        return default
    return d[key]


def integer(d: Mapping, key: str, source: str, default=_MISSING) -> int:
    v = value(d, key, source, default)
    if not is_int(v):
        raise ModelFileError(f"{source}: key '{key}' must be an integer, got {quoted(v)}")
    return v


def size(d: Mapping, key: str, source: str, default=_MISSING) -> int:
    """A size the config's arithmetic goes on to use: a positive int32, checked first (10**400
    is an integer, and no float holds it)."""
    v = integer(d, key, source, default)
    if not 0 < v < INT32_LIMIT:
        raise ModelFileError(f"{source}: key '{key}' must be a positive int32, got {quoted(v)}")
    return v


def number(d: Mapping, key: str, source: str, default=_MISSING) -> float:
    v = value(d, key, source, default)
    if not is_finite_real(v):  # 1e400 parses as inf, 10**400 as an int no float can hold
        raise ModelFileError(f"{source}: key '{key}' must be a finite number, got {quoted(v)}")
    return float(v)


def flag(d: Mapping, key: str, source: str, default: bool) -> bool:
    # Only JSON true/false: "false", 0 or [false] must not be guessed at (a guessed tie would
    # drop the file's lm_head).
    v = value(d, key, source, default)
    if not isinstance(v, bool):
        raise ModelFileError(f"{source}: key '{key}' must be true or false, got {quoted(v)}")
    return v


def text(d: Mapping, key: str, source: str, default=_MISSING) -> str:
    v = value(d, key, source, default)
    if not isinstance(v, str):
        raise ModelFileError(f"{source}: key '{key}' must be a string, got {quoted(v)}")
    return v


def _rope_params(d: Mapping, source: str) -> dict:
    """The rope settings: newer configs group them under "rope_parameters", older ones use
    top-level keys and "rope_scaling". Returns one dict (the scaling's keys, rope_theta and
    partial_rotary_factor where the file has them)."""
    params = d.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ModelFileError(f"{source}: key 'rope_parameters' must be an object or null")
    rs = params if params is not None else d.get("rope_scaling")
    if rs is not None and not isinstance(rs, dict):
        raise ModelFileError(f"{source}: key 'rope_scaling' must be an object or null")
    out = {k: d[k] for k in ("rope_theta", "partial_rotary_factor") if k in d}
    out.update(rs or {})
    return out


def _factors(rs: Mapping, key: str, source: str) -> tuple[float, ...]:
    v = value(rs, key, source)
    if not isinstance(v, list) or not v or not all(is_finite_real(f) for f in v):
        raise ModelFileError(f"{source}: key '{key}' must be a non-empty list of finite numbers")
    return tuple(float(f) for f in v)


def _scaling(rs: Mapping, d: Mapping, source: str) -> Scaling | None:
    """The RoPE scaling the settings name (llama3, linear, yarn, longrope), with Hugging Face's
    defaults; None for the default rope."""
    rope_type = rs.get("rope_type", rs.get("type"))
    if rope_type in _IGNORED_ROPE_TYPES:
        return None
    max_pos = size(d, "max_position_embeddings", source)
    if rope_type == "llama3":
        return RopeScaling(factor=number(rs, "factor", source), low_freq_factor=number(rs, "low_freq_factor", source),
                           high_freq_factor=number(rs, "high_freq_factor", source),
                           original_max_position_embeddings=integer(rs, "original_max_position_embeddings", source))
    if rope_type == "linear":
        return LinearScaling(factor=number(rs, "factor", source))
    if rope_type in ("yarn", "longrope"):
        # The original context, and the factor (default: how far the context reaches past it).
        orig = size(rs, "original_max_position_embeddings", source, size(d, "original_max_position_embeddings",
                                                                            source, max_pos))
        factor = max_pos / orig if rs.get("factor") is None else number(rs, "factor", source)
    if rope_type == "yarn":
        attention = rs.get("attention_factor")
        if attention is None:
            mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")
            if mscale and mscale_all:
                attention = _yarn_mscale(factor, number(rs, "mscale", source)) / _yarn_mscale(
                    factor, number(rs, "mscale_all_dim", source))
            else:
                attention = _yarn_mscale(factor, 1.0)
        else:
            attention = number(rs, "attention_factor", source)
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1
        return YarnScaling(factor=factor, original_max_position_embeddings=orig, attention_factor=attention,
                           beta_fast=number({"b": beta_fast}, "b", source), beta_slow=number({"b": beta_slow}, "b", source),
                           truncate=flag(rs, "truncate", source, True))
    if rope_type == "longrope":
        attention = rs.get("attention_factor")
        if attention is None and factor > 1.0 and orig == 1:
            raise ModelFileError(f"{source}: longrope's original_max_position_embeddings must be above 1, got 1")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        else:
            attention = number(rs, "attention_factor", source)
        return LongRopeScaling(short_factors=_factors(rs, "short_factor", source),
                               long_factors=_factors(rs, "long_factor", source),
                               original_max_position_embeddings=orig, attention_factor=attention)
    raise ModelFileError(f"{source}: unsupported rope scaling type {quoted(rope_type)} "
                         "(supported: llama3, linear, yarn, longrope)")


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_from_hf(d: Mapping, source: str, head_dim: int) -> tuple[float, Scaling | None, int]:
    """(rope_theta, scaling, rope_dim) of a config: rope_dim 0 where RoPE rotates whole heads."""
    rs = _rope_params(d, source)
    theta = number(rs, "rope_theta", source, 10000.0)
    fraction = number(rs, "partial_rotary_factor", source, 1.0)
    if not 0 < fraction <= 1:  # before any arithmetic: 1e308 times a head overflows
        raise ModelFileError(f"{source}: key 'partial_rotary_factor' must be in (0, 1], got {fraction}")
    rope_dim = int(head_dim * fraction)  # head_dim is an int32 (size)
    if rope_dim % 2 or rope_dim == 0:
        raise ModelFileError(f"{source}: partial_rotary_factor {fraction} of head_dim {head_dim} gives {rope_dim} "
                             "rotated elements; an even number in 2..head_dim is needed")
    try:
        scaling = _scaling(rs, d, source)
    except InvalidArgumentError as e:
        raise ModelFileError(f"{source}: {e}") from None
    return theta, scaling, 0 if rope_dim == head_dim else rope_dim


def full_attention_every(d: Mapping, source: str, n_layers: int, default: int) -> int:
    """n where config.json's layer_types makes every n-th layer full attention and the others
    sliding_attention (1: every layer full; 0: none), as the config's window_pattern holds it;
    without layer_types, every `default`-th. Any other pattern is one ModelFileError line."""
    kinds = d.get("layer_types")
    if kinds is None:
        kinds = ["full_attention" if default > 0 and i % default == default - 1 else "sliding_attention"
                 for i in range(n_layers)]
    if not isinstance(kinds, list) or len(kinds) != n_layers or not set(kinds) <= {"full_attention",
                                                                                    "sliding_attention"}:
        raise ModelFileError(f"{source}: key 'layer_types' must name full_attention or sliding_attention for "
                             f"each of the {n_layers} layers")
    full = [i for i, k in enumerate(kinds) if k == "full_attention"]
    every = full[0] + 1 if full else 0
    if [i for i in range(n_layers) if every and i % every == every - 1] != full:
        raise ModelFileError(f"{source}: layer_types must make every n-th layer full attention, the others "
                             f"sliding (got full attention at layers {full})")
    return every
