"""Gemma 3 (text): q/k norms, post-attention and post-FFN norms, norms that scale by 1 + w, GELU
(tanh), the embedding scaled by sqrt(dim), the scores by query_pre_attn_scalar^-1/2, and a window on
5 layers of 6 whose RoPE base is a local one of its own, unscaled."""

from __future__ import annotations

import math
from typing import Mapping

from arcpy.errors import ModelFileError
from arcpy.model.config import ModelConfig
from arcpy.model.families.family import BY_LAYER, GGUF_LAYER_NAMES, Family
from arcpy.model.families.hf_values import full_attention_every, integer, number, rope_from_hf, size

_PATTERN, _LOCAL_BASE = 6, 10000.0  # llama.cpp's defaults where the file names none
# The norms after attention: its own output norms, and the FFN's input norm as llama's.
_POST_NORM_NAMES = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                    "post_feedforward_layernorm": "post_ffw_norm"}


def windows(d: Mapping, source: str, n_layers: int) -> dict:
    """The window's fields of the layers layer_types (or sliding_window_pattern) names sliding:
    every n-th layer full attention, the others sliding (none: no window)."""
    default = integer(d, "sliding_window_pattern", source, _PATTERN) if "layer_types" not in d else 0
    every = full_attention_every(d, source, n_layers, default)
    return {} if every == 1 else {"sliding_window": integer(d, "sliding_window", source), "window_pattern": every}


class Gemma3(Family):
    name = "gemma3"
    hf_classes = ("Gemma3ForCausalLM",)
    gguf_arch = "gemma3"
    qk_norm = True
    window = BY_LAYER
    norms_less_one = True
    gguf_names = {**GGUF_LAYER_NAMES, **_POST_NORM_NAMES}

    def holds(self, cfg: ModelConfig) -> bool:
        return cfg.post_norms

    def hf_fields(self, d: Mapping, source: str, n_layers: int, head_dim: int) -> dict:
        """Post-norms, norms whose factor is 1 + w, the embedding scaled by sqrt(hidden_size), the
        scores by query_pre_attn_scalar^-1/2, and a window on the layers layer_types (or
        sliding_window_pattern) names sliding, whose RoPE base is rope_local_base_freq, unscaled;
        rope_parameters by layer kind, where given, set both RoPE bases and the scaling."""
        dim = size(d, "hidden_size", source)
        scalar = number(d, "query_pre_attn_scalar", source, float(head_dim))
        if scalar <= 0:
            raise ModelFileError(f"{source}: key 'query_pre_attn_scalar' must be positive, got {scalar}")
        out = {"post_norms": True, "norm_plus_one": self.norms_less_one, "embed_scale": math.sqrt(dim),
               "attn_scale": scalar ** -0.5, **windows(d, source, n_layers)}
        params = d.get("rope_parameters")
        if isinstance(params, dict) and "full_attention" in params:
            local = params.get("sliding_attention")
            if not isinstance(local, dict) or local.get("rope_type", "default") != "default":
                raise ModelFileError(f"{source}: rope_parameters.sliding_attention must be the default rope")
            out["rope_local_theta"] = number(local, "rope_theta", source)
            glob = {**d, "rope_parameters": params["full_attention"]}
            out["rope_theta"], out["rope_scaling"], _ = rope_from_hf(glob, source, head_dim)
        else:
            out["rope_local_theta"] = number(d, "rope_local_base_freq", source, _LOCAL_BASE)
        return out

    def to_hf(self, cfg: ModelConfig, d: dict) -> None:
        d.update(model_type="gemma3_text", hidden_activation=d.pop("hidden_act"),
                 query_pre_attn_scalar=cfg.scores_scale ** -2, sliding_window=cfg.sliding_window or None,
                 layer_types=["sliding_attention" if cfg.window(i) else "full_attention" for i in range(cfg.n_layers)],
                 rope_local_base_freq=cfg.rope_local_theta)

    def gguf_fields(self, m, a: str, dims: tuple[int, int, int], window: int) -> dict:
        """As llama.cpp runs them: post-norms (the files store Gemma's norms with their 1 added),
        GELU, the embedding scaled by sqrt(dim), the scores by 1/sqrt(head_dim) (by
        1/sqrt(dim / heads) for the 62-layer 27B), a window on all but every 6th layer (or the
        file's sliding_window_pattern), whose RoPE base is rope.freq_base_swa (10000 by default)."""
        dim, n_heads, head_dim = dims
        big = m.integer(a + "block_count") == 62
        out = {"post_norms": True, "activation": "gelu_tanh", "embed_scale": math.sqrt(dim),
               "attn_scale": 1.0 / math.sqrt(dim // n_heads if big else head_dim)}
        if window > 0:
            out.update(sliding_window=window, window_pattern=m.integer(a + "attention.sliding_window_pattern",
                                                                       _PATTERN),
                       rope_local_theta=m.number(a + "rope.freq_base_swa", _LOCAL_BASE))
        return out


GEMMA3 = Gemma3()
