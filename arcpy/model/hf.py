"""Hugging Face config.json <-> ModelConfig.

Everything read here came from a file: each key is checked for its JSON type before use (a wrong
type is one ModelFileError line, never a TypeError), numbers must convert to finite floats, and
every value a message repeats is quoted. An absent key takes its default; a null is a wrong type,
except where null has a meaning (no rope scaling, no sliding window).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from arcpy.checks import is_finite_real, is_int, quoted
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.model.config import ModelConfig, RopeScaling

_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
_IGNORED_ROPE_TYPES = (None, "default")
_MISSING = object()


def _get(d: Mapping, key: str, source: str, default=_MISSING):
    """d[key], or `default` when absent; absent without a default is an error.

    A null is returned as it is, for the caller's type check to refuse: "rms_norm_eps": null does
    not say 1e-6. The keys where null has a meaning (rope_scaling, sliding_window) are read apart.
    """
    if key not in d:
        if default is _MISSING:
            raise ModelFileError(f"{source}: missing key '{key}'")
        return default
    return d[key]


def _int(d: Mapping, key: str, source: str, default=_MISSING) -> int:
    v = _get(d, key, source, default)
    if not is_int(v):
        raise ModelFileError(f"{source}: key '{key}' must be an integer, got {quoted(v)}")
    return v


def _number(d: Mapping, key: str, source: str, default=_MISSING) -> float:
    v = _get(d, key, source, default)
    if not is_finite_real(v):  # 1e400 parses as inf, 10**400 as an int no float can hold
        raise ModelFileError(f"{source}: key '{key}' must be a finite number, got {quoted(v)}")
    return float(v)


def _flag(d: Mapping, key: str, source: str, default: bool) -> bool:
    # Only JSON true/false: "false", 0 or [false] must not be guessed at (a guessed tie would
    # drop the file's lm_head).
    v = _get(d, key, source, default)
    if not isinstance(v, bool):
        raise ModelFileError(f"{source}: key '{key}' must be true or false, got {quoted(v)}")
    return v


def _str(d: Mapping, key: str, source: str, default=_MISSING) -> str:
    v = _get(d, key, source, default)
    if not isinstance(v, str):
        raise ModelFileError(f"{source}: key '{key}' must be a string, got {quoted(v)}")
    return v


def _family(d: Mapping, source: str) -> str:
    archs = d.get("architectures")
    if archs is None:
        if "model_type" not in d:
            raise ModelFileError(f"{source}: missing key 'architectures'")
        family = _str(d, "model_type", source)
        if family not in _ARCHITECTURES.values():
            raise ModelFileError(f"{source}: unsupported model_type {quoted(family)} "
                                 f"(supported: {', '.join(sorted(set(_ARCHITECTURES.values())))})")
        return family
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise ModelFileError(f"{source}: key 'architectures' must be a non-empty list of strings, got {quoted(archs)}")
    known = [a for a in archs if a in _ARCHITECTURES]
    if not known:
        raise ModelFileError(f"{source}: unsupported architecture {quoted(archs[0])} "
                             f"(supported: {', '.join(_ARCHITECTURES)})")
    return _ARCHITECTURES[known[0]]


def _rope_from_hf(d: Mapping, source: str) -> tuple[float, RopeScaling | None]:
    # Newer configs group the rope settings under "rope_parameters"; older ones use top-level keys.
    params = d.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ModelFileError(f"{source}: key 'rope_parameters' must be an object or null")
    theta = _number(params if params is not None and "rope_theta" in params else d, "rope_theta", source, 10000.0)
    rs = params if params is not None else d.get("rope_scaling")
    if rs is None:
        return theta, None
    if not isinstance(rs, dict):
        raise ModelFileError(f"{source}: key 'rope_scaling' must be an object or null")
    rope_type = rs.get("rope_type", rs.get("type"))
    if rope_type in _IGNORED_ROPE_TYPES:
        return theta, None
    if rope_type != "llama3":
        raise ModelFileError(f"{source}: unsupported rope scaling type {quoted(rope_type)} (supported: llama3)")
    try:
        scaling = RopeScaling(
            factor=_number(rs, "factor", source),
            low_freq_factor=_number(rs, "low_freq_factor", source),
            high_freq_factor=_number(rs, "high_freq_factor", source),
            original_max_position_embeddings=_int(rs, "original_max_position_embeddings", source),
        )
    except InvalidArgumentError as e:
        raise ModelFileError(f"{source}: {e}") from None
    return theta, scaling


def config_from_hf(d: dict, source: str) -> ModelConfig:
    """A Hugging Face config.json dict -> ModelConfig. `source` names the file in error messages.

    Accepts Llama, Mistral and Qwen2 decoders. A Mistral sliding window shorter than the context is
    honoured exactly by capping max_seq at the window (attention then never reaches past it); an
    active Qwen2 sliding window is refused. Llama's attention_bias also adds an o_proj bias, which
    this engine does not carry, so it is refused rather than dropped.
    """
    if not isinstance(d, dict):
        raise ModelFileError(f"{source}: config must be a JSON object")
    family = _family(d, source)
    act = _str(d, "hidden_act", source, "silu")
    if act != "silu":
        raise ModelFileError(f"{source}: unsupported hidden_act {quoted(act)} (supported: silu)")
    if _flag(d, "mlp_bias", source, False):
        raise ModelFileError(f"{source}: unsupported mlp_bias=true")
    attention_bias = _flag(d, "attention_bias", source, False)
    if family == "qwen2":
        qkv_bias = True
    elif attention_bias:
        raise ModelFileError(f"{source}: unsupported attention_bias=true (o_proj bias)")
    else:
        qkv_bias = False

    dim = _int(d, "hidden_size", source)
    n_heads = _int(d, "num_attention_heads", source)
    if n_heads <= 0:
        raise ModelFileError(f"{source}: key 'num_attention_heads' must be a positive int")
    max_seq = _int(d, "max_position_embeddings", source)
    window = d.get("sliding_window")
    if _flag(d, "use_sliding_window", source, family == "mistral") and window is not None:
        if family != "mistral":
            raise ModelFileError(f"{source}: unsupported active sliding window (use_sliding_window=true)")
        if not is_int(window) or window <= 0:
            raise ModelFileError(f"{source}: key 'sliding_window' must be a positive int, got {quoted(window)}")
        max_seq = min(max_seq, window)
    theta, scaling = _rope_from_hf(d, source)
    try:
        return ModelConfig(
            dim=dim,
            n_layers=_int(d, "num_hidden_layers", source),
            n_heads=n_heads,
            n_kv_heads=_int(d, "num_key_value_heads", source, default=n_heads),
            head_dim=_int(d, "head_dim", source, default=dim // n_heads),
            ffn_dim=_int(d, "intermediate_size", source),
            vocab=_int(d, "vocab_size", source),
            max_seq=max_seq,
            rms_eps=_number(d, "rms_norm_eps", source, 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tied_embeddings=_flag(d, "tie_word_embeddings", source, False),
            qkv_bias=qkv_bias,
        )
    except InvalidArgumentError as e:
        raise ModelFileError(f"{source}: {e}") from None


def config_to_hf(cfg: ModelConfig) -> dict:
    """ModelConfig -> a config.json dict that `config_from_hf` reads back to the same config."""
    qwen = cfg.qkv_bias  # only Qwen2 carries q/k/v biases without an o_proj bias
    d = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen else "llama",
        "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_dim,
        "vocab_size": cfg.vocab,
        "max_position_embeddings": cfg.max_seq,
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": cfg.tied_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    if qwen:
        d["use_sliding_window"] = False
    else:
        d["attention_bias"] = False
    if cfg.rope_scaling is not None:
        d["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(cfg.rope_scaling)}
    return d
