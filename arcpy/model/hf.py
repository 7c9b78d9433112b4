"""Hugging Face config.json <-> ModelConfig, for every family of arcpy.model.families: the keys
every family shares are read here, each family's own by its module.

Everything read here came from a file: each key is checked for its JSON type before use (a wrong
type is one ModelFileError line, never a TypeError), numbers must convert to finite floats, and
every value a message repeats is quoted (arcpy.model.families.hf_values).
"""

from __future__ import annotations

import dataclasses

from arcpy.checks import is_int, quoted
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.model.config import LinearScaling, ModelConfig, RopeScaling, Scaling, YarnScaling
from arcpy.model.families import family_for, hf_family
from arcpy.model.families.family import BY_LAYER, EVERY_LAYER
from arcpy.model.families.hf_values import flag, integer, number, rope_from_hf, size, text

# The activations a GLU may take, by the names config.json gives them.
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def config_from_hf(d: dict, source: str) -> ModelConfig:
    """A Hugging Face config.json dict -> ModelConfig. `source` names the file in error messages.

    Accepts the families of arcpy.model.families. A sliding window on every layer (Mistral,
    Phi-3, Mixtral) shorter than the context is honoured exactly by capping max_seq at the window
    (attention then never reaches past it); an active sliding window of another family (Qwen's)
    is refused. Llama's attention_bias also adds an o_proj bias, which this engine does not carry,
    so it is refused rather than dropped.
    """
    if not isinstance(d, dict):
        raise ModelFileError(f"{source}: config must be a JSON object")
    family = hf_family(d, source)
    d = family.text_config(d)
    act_key = "hidden_activation" if "hidden_activation" in d else "hidden_act"
    act = text(d, act_key, source, "silu")
    if act not in _ACTIVATIONS:
        raise ModelFileError(f"{source}: unsupported {act_key} {quoted(act)} (supported: {', '.join(_ACTIVATIONS)})")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if d.get(key) is not None and not (key == "final_logit_softcapping" and family.softcaps_logits):
            raise ModelFileError(f"{source}: {key} is not supported")
    if flag(d, "mlp_bias", source, False):
        raise ModelFileError(f"{source}: unsupported mlp_bias=true")
    if flag(d, "attention_bias", source, False) and not family.qkv_bias:
        raise ModelFileError(f"{source}: unsupported attention_bias=true (o_proj bias)")

    dim = size(d, "hidden_size", source)
    n_heads = size(d, "num_attention_heads", source)
    max_seq = size(d, "max_position_embeddings", source)
    window = d.get("sliding_window")
    capped = family.window == EVERY_LAYER
    if family.window == BY_LAYER:
        pass  # the family's hook reads its windowed layers
    elif flag(d, "use_sliding_window", source, capped) and window is not None:
        if not capped:
            raise ModelFileError(f"{source}: unsupported active sliding window (use_sliding_window=true)")
        if not is_int(window) or window <= 0:
            raise ModelFileError(f"{source}: key 'sliding_window' must be a positive int, got {quoted(window)}")
        max_seq = min(max_seq, window)
    head_dim = size(d, "head_dim", source, default=dim // n_heads)
    n_layers = size(d, "num_hidden_layers", source)
    theta, scaling, rope_dim = rope_from_hf(d, source, head_dim)
    fields = {"rope_theta": theta, "rope_scaling": scaling, **family.hf_fields(d, source, n_layers, head_dim)}
    try:
        return ModelConfig(
            **fields,
            activation=_ACTIVATIONS[act],
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=integer(d, "num_key_value_heads", source, default=n_heads),
            head_dim=head_dim,
            ffn_dim=integer(d, "intermediate_size", source),
            vocab=integer(d, "vocab_size", source),
            max_seq=max_seq,
            rms_eps=number(d, "rms_norm_eps", source, 1e-6),
            tied_embeddings=flag(d, "tie_word_embeddings", source, False),
            qkv_bias=family.qkv_bias,
            qk_norm=family.qk_norm,
            rope_dim=rope_dim,
        )
    except InvalidArgumentError as e:
        raise ModelFileError(f"{source}: {e}") from None


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
    """ModelConfig -> a config.json dict that `config_from_hf` reads back to the same config, in
    the form of the first family that holds it (arcpy.model.families.family_for)."""
    family = family_for(cfg)
    d = {
        "architectures": [family.hf_classes[0]],
        "model_type": family.name,
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
    family.to_hf(cfg, d)
    d.update(family.hf_constants)
    if cfg.rope_dim:
        d["partial_rotary_factor"] = cfg.rope_dim / cfg.head_dim
    if cfg.rope_scaling is not None:
        d["rope_scaling"] = _scaling_to_hf(cfg.rope_scaling)
    return d
