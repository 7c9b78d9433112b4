"""Qwen3.5 and Qwen3.6 (dense and MoE): hybrids of three gated DeltaNet layers to one of attention
(arcpy/model/hybrid.py describes the DeltaNet layer); the attention has q/k norms, a sigmoid gate on
its output and RoPE over a quarter of each head (head_dim 256); norms scale by 1 + w. The MoE form
routes every layer's FFN (softmax, top k, renormalized) and adds a shared expert with its sigmoid
gate. The checkpoints of the conditional-generation classes hold the text model's config under
text_config and its weights under model.language_model (the readers take the text model alone).
The multi-token prediction layer (mtp.*) is not read. Text positions rotate every RoPE section
alike, so the multi-section (interleaved) RoPE is the plain one here."""

from __future__ import annotations

from typing import Mapping

from arcpy.checks import quoted
from arcpy.errors import ModelFileError
from arcpy.model.config import ModelConfig
from arcpy.model.families.family import Family
from arcpy.model.families.hf_values import flag, integer
from arcpy.model.hybrid import FULL, LAYER_KINDS, LINEAR

_INTERVAL = 4  # full_attention_interval where config.json does not list layer_types


class Qwen35(Family):
    name = "qwen3_5"
    hf_classes = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
    gguf_arch = "qwen35"
    qk_norm = True
    norms_less_one = True
    hf_constants = {"attention_bias": False}

    def holds(self, cfg: ModelConfig) -> bool:
        return bool(cfg.layer_types) and cfg.n_experts == 0

    def text_config(self, d: Mapping) -> Mapping:
        """The text model's keys: text_config's where config.json has one (the outer file's
        architectures and tie_word_embeddings kept)."""
        inner = d.get("text_config")
        if not isinstance(inner, dict):
            return d
        out = dict(inner)
        for key in ("architectures", "tie_word_embeddings"):
            if key in d:
                out[key] = d[key]
        return out

    def hf_fields(self, d: Mapping, source: str, n_layers: int, head_dim: int) -> dict:
        kinds = d.get("layer_types")
        if kinds is None:
            every = integer(d, "full_attention_interval", source, _INTERVAL)
            if every <= 0:
                raise ModelFileError(f"{source}: key 'full_attention_interval' must be positive, got {every}")
            kinds = [FULL if (i + 1) % every == 0 else LINEAR for i in range(n_layers)]
        if not isinstance(kinds, list) or len(kinds) != n_layers or not set(kinds) <= set(LAYER_KINDS):
            raise ModelFileError(f"{source}: key 'layer_types' must name full_attention or linear_attention for "
                                 f"each of the {n_layers} layers, got {quoted(kinds)}")
        if not flag(d, "attn_output_gate", source, True):
            raise ModelFileError(f"{source}: attn_output_gate=false is not supported (Qwen3.5's attention is gated)")
        return {"layer_types": tuple(kinds), "attn_output_gate": True, "norm_plus_one": True,
                "linear_n_k_heads": integer(d, "linear_num_key_heads", source, 16),
                "linear_n_v_heads": integer(d, "linear_num_value_heads", source, 32),
                "linear_k_head_dim": integer(d, "linear_key_head_dim", source, 128),
                "linear_v_head_dim": integer(d, "linear_value_head_dim", source, 128),
                "linear_conv_kernel": integer(d, "linear_conv_kernel_dim", source, 4)}

    def to_hf(self, cfg: ModelConfig, d: dict) -> None:
        d.update(layer_types=list(cfg.layer_types), linear_num_key_heads=cfg.linear_n_k_heads,
                 linear_num_value_heads=cfg.linear_n_v_heads, linear_key_head_dim=cfg.linear_k_head_dim,
                 linear_value_head_dim=cfg.linear_v_head_dim, linear_conv_kernel_dim=cfg.linear_conv_kernel)


class Qwen35Moe(Qwen35):
    name = "qwen3_5_moe"
    hf_classes = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
    gguf_arch = "qwen35moe"

    def holds(self, cfg: ModelConfig) -> bool:
        return bool(cfg.layer_types) and cfg.n_experts > 0

    def text_config(self, d: Mapping) -> Mapping:
        """As Qwen3.5's; every layer's FFN is the experts', so config.json may name no dense
        width: the experts' stands in (no layer holds a dense FFN)."""
        out = dict(super().text_config(d))
        if "intermediate_size" not in out and "moe_intermediate_size" in out:
            out["intermediate_size"] = out["moe_intermediate_size"]
        return out

    def hf_fields(self, d: Mapping, source: str, n_layers: int, head_dim: int) -> dict:
        return {**super().hf_fields(d, source, n_layers, head_dim),
                "n_experts": integer(d, "num_experts", source),
                "n_experts_used": integer(d, "num_experts_per_tok", source),
                "expert_ffn_dim": integer(d, "moe_intermediate_size", source),
                "shared_expert_ffn_dim": integer(d, "shared_expert_intermediate_size", source),
                "norm_topk_prob": True}

    def to_hf(self, cfg: ModelConfig, d: dict) -> None:
        super().to_hf(cfg, d)
        d.update(num_experts=cfg.n_experts, num_experts_per_tok=cfg.n_experts_used,
                 moe_intermediate_size=cfg.expert_ffn_dim, shared_expert_intermediate_size=cfg.shared_expert_ffn_dim)

    def gguf_experts(self, m, a: str, n: int) -> dict:
        return {"n_experts": n, "n_experts_used": m.integer(a + "expert_used_count"),
                "expert_ffn_dim": m.integer(a + "expert_feed_forward_length"), "routing": "softmax_topk",
                "norm_topk_prob": True,
                "shared_expert_ffn_dim": m.integer(a + "expert_shared_feed_forward_length")}


QWEN3_5 = Qwen35()
QWEN3_5_MOE = Qwen35Moe()
