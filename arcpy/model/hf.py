"""Hugging Face config.json <-> ModelConfig.

Everything read here came from a file: each key is checked for its JSON type before use (a wrong
type is one ModelFileError line, never a TypeError), numbers must convert to finite floats, and
every value a message repeats is quoted. An absent key takes its default; a null is a wrong type,
except where null has a meaning (no rope scaling, no sliding window).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from arcpy.checks import is_finite_real, is_int, quoted
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.model.moe import GPT_OSS_NEEDS
from arcpy.model.config import (INT32_LIMIT, LinearScaling, LongRopeScaling, ModelConfig, RopeScaling, Scaling,
                                 YarnScaling)

_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                  "Qwen3ForCausalLM": "qwen3", "SmolLM3ForCausalLM": "smollm3", "Phi3ForCausalLM": "phi3",
                  "Gemma3ForCausalLM": "gemma3", "Qwen3MoeForCausalLM": "qwen3_moe",
                  "Qwen2MoeForCausalLM": "qwen2_moe", "MixtralForCausalLM": "mixtral"}
# What the families this engine does not run yet need, refused in one line each.
_REFUSED = ("GptOssForCausalLM", "gpt_oss")
# The activations a GLU may take, by the names config.json gives them.
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
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


def _size(d: Mapping, key: str, source: str, default=_MISSING) -> int:
    """A size the config's arithmetic goes on to use: a positive int32, checked first (10**400
    is an integer, and no float holds it)."""
    v = _int(d, key, source, default)
    if not 0 < v < INT32_LIMIT:
        raise ModelFileError(f"{source}: key '{key}' must be a positive int32, got {quoted(v)}")
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
    named = archs if isinstance(archs, list) else [d.get("model_type")]
    if any(isinstance(a, str) and a in _REFUSED for a in named):
        raise ModelFileError(f"{source}: {GPT_OSS_NEEDS}")
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
    v = _get(rs, key, source)
    if not isinstance(v, list) or not v or not all(is_finite_real(f) for f in v):
        raise ModelFileError(f"{source}: key '{key}' must be a non-empty list of finite numbers")
    return tuple(float(f) for f in v)


def _scaling(rs: Mapping, d: Mapping, source: str) -> Scaling | None:
    """The RoPE scaling the settings name (llama3, linear, yarn, longrope), with Hugging Face's
    defaults; None for the default rope."""
    rope_type = rs.get("rope_type", rs.get("type"))
    if rope_type in _IGNORED_ROPE_TYPES:
        return None
    max_pos = _size(d, "max_position_embeddings", source)
    if rope_type == "llama3":
        return RopeScaling(factor=_number(rs, "factor", source), low_freq_factor=_number(rs, "low_freq_factor", source),
                           high_freq_factor=_number(rs, "high_freq_factor", source),
                           original_max_position_embeddings=_int(rs, "original_max_position_embeddings", source))
    if rope_type == "linear":
        return LinearScaling(factor=_number(rs, "factor", source))
    if rope_type in ("yarn", "longrope"):
        # The original context, and the factor (default: how far the context reaches past it).
        orig = _size(rs, "original_max_position_embeddings", source, _size(d, "original_max_position_embeddings",
                                                                            source, max_pos))
        factor = max_pos / orig if rs.get("factor") is None else _number(rs, "factor", source)
    if rope_type == "yarn":
        attention = rs.get("attention_factor")
        if attention is None:
            mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")
            if mscale and mscale_all:
                attention = _yarn_mscale(factor, _number(rs, "mscale", source)) / _yarn_mscale(
                    factor, _number(rs, "mscale_all_dim", source))
            else:
                attention = _yarn_mscale(factor, 1.0)
        else:
            attention = _number(rs, "attention_factor", source)
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1
        return YarnScaling(factor=factor, original_max_position_embeddings=orig, attention_factor=attention,
                           beta_fast=_number({"b": beta_fast}, "b", source), beta_slow=_number({"b": beta_slow}, "b", source),
                           truncate=_flag(rs, "truncate", source, True))
    if rope_type == "longrope":
        attention = rs.get("attention_factor")
        if attention is None and factor > 1.0 and orig == 1:
            raise ModelFileError(f"{source}: longrope's original_max_position_embeddings must be above 1, got 1")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        else:
            attention = _number(rs, "attention_factor", source)
        return LongRopeScaling(short_factors=_factors(rs, "short_factor", source),
                               long_factors=_factors(rs, "long_factor", source),
                               original_max_position_embeddings=orig, attention_factor=attention)
    raise ModelFileError(f"{source}: unsupported rope scaling type {quoted(rope_type)} "
                         "(supported: llama3, linear, yarn, longrope)")


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _rope_from_hf(d: Mapping, source: str, head_dim: int) -> tuple[float, Scaling | None, int]:
    """(rope_theta, scaling, rope_dim) of a config: rope_dim 0 where RoPE rotates whole heads."""
    rs = _rope_params(d, source)
    theta = _number(rs, "rope_theta", source, 10000.0)
    fraction = _number(rs, "partial_rotary_factor", source, 1.0)
    if not 0 < fraction <= 1:  # before any arithmetic: 1e308 times a head overflows
        raise ModelFileError(f"{source}: key 'partial_rotary_factor' must be in (0, 1], got {fraction}")
    rope_dim = int(head_dim * fraction)  # head_dim is an int32 (_size)
    if rope_dim % 2 or rope_dim == 0:
        raise ModelFileError(f"{source}: partial_rotary_factor {fraction} of head_dim {head_dim} gives {rope_dim} "
                             "rotated elements; an even number in 2..head_dim is needed")
    try:
        scaling = _scaling(rs, d, source)
    except InvalidArgumentError as e:
        raise ModelFileError(f"{source}: {e}") from None
    return theta, scaling, 0 if rope_dim == head_dim else rope_dim


def _no_rope_layers(d: Mapping, family: str, n_layers: int, source: str) -> tuple[int, ...]:
    """SmolLM3's layers without RoPE: its no_rope_layers list (1 rotates, 0 does not), else every
    no_rope_layer_interval-th layer (4 by default)."""
    if family != "smollm3":
        return ()
    flags = d.get("no_rope_layers")
    if flags is None:
        every = _int(d, "no_rope_layer_interval", source, 4)
        if every <= 0:
            raise ModelFileError(f"{source}: key 'no_rope_layer_interval' must be positive, got {every}")
        return tuple(i for i in range(n_layers) if (i + 1) % every == 0)
    if not isinstance(flags, list) or len(flags) < n_layers or not all(f in (0, 1) and is_int(f) for f in flags):
        raise ModelFileError(f"{source}: key 'no_rope_layers' must list 0 or 1 for each of the {n_layers} layers")
    return tuple(i for i in range(n_layers) if flags[i] == 0)


def stores_norms_less_one(d: Mapping) -> bool:
    """Whether a family's files store each norm's weights as its factor less one: Gemma's norms
    scale by (1 + w)."""
    return d.get("model_type") in ("gemma3", "gemma3_text") or d.get("architectures") == ["Gemma3ForCausalLM"]


def _gemma3(d: Mapping, n_layers: int, head_dim: int, source: str) -> dict:
    """Gemma 3's fields: post-norms, norms whose factor is 1 + w, the embedding scaled by
    sqrt(hidden_size), the scores by query_pre_attn_scalar^-1/2, and a window on the layers
    layer_types (or sliding_window_pattern) names sliding, whose RoPE base is rope_local_base_freq,
    unscaled."""
    dim = _size(d, "hidden_size", source)
    scalar = _number(d, "query_pre_attn_scalar", source, float(head_dim))
    if scalar <= 0:
        raise ModelFileError(f"{source}: key 'query_pre_attn_scalar' must be positive, got {scalar}")
    out = {"post_norms": True, "norm_plus_one": True, "embed_scale": math.sqrt(dim), "attn_scale": scalar ** -0.5}
    kinds = d.get("layer_types")
    if kinds is None:
        every = _int(d, "sliding_window_pattern", source, 6)
        kinds = ["full_attention" if every > 0 and i % every == every - 1 else "sliding_attention"
                 for i in range(n_layers)]
    if not isinstance(kinds, list) or len(kinds) != n_layers or not set(kinds) <= {"full_attention",
                                                                                    "sliding_attention"}:
        raise ModelFileError(f"{source}: key 'layer_types' must name full_attention or sliding_attention for each "
                             f"of the {n_layers} layers")
    full = [i for i, k in enumerate(kinds) if k == "full_attention"]
    every = full[0] + 1 if full else 0
    if [i for i in range(n_layers) if every and i % every == every - 1] != full:
        raise ModelFileError(f"{source}: layer_types must make every n-th layer full attention, the others sliding "
                             f"(got full attention at layers {full})")
    window = _int(d, "sliding_window", source)
    if full != list(range(n_layers)):
        out.update(sliding_window=window, window_pattern=every)
    params = d.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        local = params.get("sliding_attention")
        if not isinstance(local, dict) or local.get("rope_type", "default") != "default":
            raise ModelFileError(f"{source}: rope_parameters.sliding_attention must be the default rope")
        out["rope_local_theta"] = _number(local, "rope_theta", source)
        glob = {**d, "rope_parameters": params["full_attention"]}
        theta, scaling, _ = _rope_from_hf(glob, source, head_dim)
        out["full_attention"] = (theta, scaling)
    else:
        out["rope_local_theta"] = _number(d, "rope_local_base_freq", source, 10000.0)
    return out


def _experts(d: Mapping, family: str, source: str) -> dict:
    """The mixture of experts' fields of Qwen3-MoE, Qwen2-MoE (a shared expert) and Mixtral."""
    if family not in ("qwen3_moe", "qwen2_moe", "mixtral"):
        return {}
    if family == "mixtral":
        return {"n_experts": _int(d, "num_local_experts", source, 8),
                "n_experts_used": _int(d, "num_experts_per_tok", source, 2),
                "expert_ffn_dim": _int(d, "intermediate_size", source),
                # The top k logits, then their softmax: what transformers computes as softmax, top k,
                # renormalized, in exact arithmetic (model.moe).
                "routing": "topk_softmax"}
    dense = d.get("mlp_only_layers", [])
    if not isinstance(dense, list) or not all(is_int(i) for i in dense):
        raise ModelFileError(f"{source}: key 'mlp_only_layers' must be a list of layer indices, got {quoted(dense)}")
    out = {"n_experts": _int(d, "num_experts", source),
           "n_experts_used": _int(d, "num_experts_per_tok", source),
           "expert_ffn_dim": _int(d, "moe_intermediate_size", source),
           "norm_topk_prob": _flag(d, "norm_topk_prob", source, family == "qwen3_moe"),
           "moe_every": _int(d, "decoder_sparse_step", source, 1),
           "mlp_only_layers": tuple(sorted(set(dense)))}
    if family == "qwen2_moe":
        out["shared_expert_ffn_dim"] = _int(d, "shared_expert_intermediate_size", source)
    if out["moe_every"] <= 0:
        raise ModelFileError(f"{source}: key 'decoder_sparse_step' must be positive, got {out['moe_every']}")
    return out


def config_from_hf(d: dict, source: str) -> ModelConfig:
    """A Hugging Face config.json dict -> ModelConfig. `source` names the file in error messages.

    Accepts Llama, Mistral, Qwen2, Qwen3 (q/k norms), SmolLM3 (layers without RoPE) and Phi-3 /
    Phi-4 (partial rotary, LongRoPE; fused qkv and gate_up, split by the checkpoint reader)
    decoders. A Mistral or Phi-3 sliding window shorter than the context is honoured exactly by
    capping max_seq at the window (attention then never reaches past it); an active Qwen sliding
    window is refused. Llama's attention_bias also adds an o_proj bias, which
    this engine does not carry, so it is refused rather than dropped.
    """
    if not isinstance(d, dict):
        raise ModelFileError(f"{source}: config must be a JSON object")
    family = _family(d, source)
    act_key = "hidden_activation" if "hidden_activation" in d else "hidden_act"
    act = _str(d, act_key, source, "silu")
    if act not in _ACTIVATIONS:
        raise ModelFileError(f"{source}: unsupported {act_key} {quoted(act)} (supported: {', '.join(_ACTIVATIONS)})")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if d.get(key) is not None:
            raise ModelFileError(f"{source}: {key} is not supported")
    if _flag(d, "mlp_bias", source, False):
        raise ModelFileError(f"{source}: unsupported mlp_bias=true")
    attention_bias = _flag(d, "attention_bias", source, False)
    if family in ("qwen2", "qwen2_moe"):
        qkv_bias = True
    elif attention_bias:
        raise ModelFileError(f"{source}: unsupported attention_bias=true (o_proj bias)")
    else:
        qkv_bias = False

    dim = _size(d, "hidden_size", source)
    n_heads = _size(d, "num_attention_heads", source)
    max_seq = _size(d, "max_position_embeddings", source)
    window = d.get("sliding_window")
    # Mistral and Phi-3 window every layer: a context no longer than the window is exact.
    capped = family in ("mistral", "phi3", "mixtral")
    if family == "gemma3":
        pass  # its windowed layers are read below (_gemma3)
    elif _flag(d, "use_sliding_window", source, capped) and window is not None:
        if not capped:
            raise ModelFileError(f"{source}: unsupported active sliding window (use_sliding_window=true)")
        if not is_int(window) or window <= 0:
            raise ModelFileError(f"{source}: key 'sliding_window' must be a positive int, got {quoted(window)}")
        max_seq = min(max_seq, window)
    head_dim = _size(d, "head_dim", source, default=dim // n_heads)
    n_layers = _size(d, "num_hidden_layers", source)
    theta, scaling, rope_dim = _rope_from_hf(d, source, head_dim)
    extra = _gemma3(d, n_layers, head_dim, source) if family == "gemma3" else {}
    if "full_attention" in extra:  # Gemma 3's rope settings by layer kind
        theta, scaling = extra.pop("full_attention")
    try:
        return ModelConfig(
            **extra,
            **_experts(d, family, source),
            activation=_ACTIVATIONS[act],
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=_int(d, "num_key_value_heads", source, default=n_heads),
            head_dim=head_dim,
            ffn_dim=_int(d, "intermediate_size", source),
            vocab=_int(d, "vocab_size", source),
            max_seq=max_seq,
            rms_eps=_number(d, "rms_norm_eps", source, 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tied_embeddings=_flag(d, "tie_word_embeddings", source, False),
            qkv_bias=qkv_bias,
            qk_norm=family in ("qwen3", "gemma3", "qwen3_moe"),
            rope_dim=rope_dim,
            no_rope_layers=_no_rope_layers(d, family, n_layers, source),
        )
    except InvalidArgumentError as e:
        raise ModelFileError(f"{source}: {e}") from None


def _family_of(cfg: ModelConfig) -> str:
    """The family whose config.json says what cfg holds (the first whose features cover it)."""
    if cfg.n_experts:
        if cfg.shared_expert_ffn_dim or cfg.qkv_bias:
            return "qwen2_moe"
        return "mixtral" if cfg.routing == "topk_softmax" else "qwen3_moe"
    if cfg.qkv_bias:
        return "qwen2"
    if cfg.post_norms:
        return "gemma3"
    if cfg.qk_norm:
        return "qwen3"
    if cfg.no_rope_layers:
        return "smollm3"
    if cfg.rope_dim or isinstance(cfg.rope_scaling, LongRopeScaling):
        return "phi3"
    return "llama"


_CLASSES = {family: name for name, family in _ARCHITECTURES.items()}


def _scaling_to_hf(rs: Scaling) -> dict:
    if isinstance(rs, RopeScaling):
        return {"rope_type": "llama3", **dataclasses.asdict(rs)}
    if isinstance(rs, LinearScaling):
        return {"rope_type": "linear", "factor": rs.factor}
    if isinstance(rs, YarnScaling):
        return {"rope_type": "yarn", **dataclasses.asdict(rs)}
    return {"rope_type": "longrope", "short_factor": list(rs.short_factors), "long_factor": list(rs.long_factors),
            "original_max_position_embeddings": rs.original_max_position_embeddings,
            "attention_factor": rs.attention_factor}


def config_to_hf(cfg: ModelConfig) -> dict:
    """ModelConfig -> a config.json dict that `config_from_hf` reads back to the same config."""
    family = _family_of(cfg)
    d = {
        "architectures": [_CLASSES[family]],
        "model_type": family,
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
        "hidden_act": {v: k for k, v in _ACTIVATIONS.items()}[cfg.activation],
        "torch_dtype": "bfloat16",
    }
    if family == "gemma3":
        d.update(model_type="gemma3_text", hidden_activation=d.pop("hidden_act"),
                 query_pre_attn_scalar=cfg.scores_scale ** -2, sliding_window=cfg.sliding_window or None,
                 layer_types=["sliding_attention" if cfg.window(i) else "full_attention" for i in range(cfg.n_layers)],
                 rope_local_base_freq=cfg.rope_local_theta)
    if family == "mixtral":
        d.update(num_local_experts=cfg.n_experts, num_experts_per_tok=cfg.n_experts_used, sliding_window=None,
                 intermediate_size=cfg.expert_ffn_dim)
    elif cfg.n_experts:
        d.update(num_experts=cfg.n_experts, num_experts_per_tok=cfg.n_experts_used,
                 moe_intermediate_size=cfg.expert_ffn_dim, norm_topk_prob=cfg.norm_topk_prob,
                 decoder_sparse_step=cfg.moe_every or 1, mlp_only_layers=list(cfg.mlp_only_layers))
        if cfg.shared_expert_ffn_dim:
            d["shared_expert_intermediate_size"] = cfg.shared_expert_ffn_dim
    if family.startswith("qwen"):
        d["use_sliding_window"] = False
    else:
        d["attention_bias"] = False
    if family == "smollm3":
        d["no_rope_layers"] = [int(i not in cfg.no_rope_layers) for i in range(cfg.n_layers)]
    if cfg.rope_dim:
        d["partial_rotary_factor"] = cfg.rope_dim / cfg.head_dim
    if cfg.rope_scaling is not None:
        d["rope_scaling"] = _scaling_to_hf(cfg.rope_scaling)
    return d
