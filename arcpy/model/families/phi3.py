"""Phi-3.5 and Phi-4-mini: partial rotary (rope_dim), LongRoPE, a sliding window on every layer,
and q/k/v in one tensor and gate/up in another, split on load."""

from __future__ import annotations

from arcpy.model.config import LongRopeScaling, ModelConfig
from arcpy.model.families.family import EVERY_LAYER, Family


class Phi3(Family):
    name = "phi3"
    hf_classes = ("Phi3ForCausalLM",)
    gguf_arch = "phi3"
    window = EVERY_LAYER
    hf_fused = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                              "self_attn.v_proj.weight"),
                "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}

    def holds(self, cfg: ModelConfig) -> bool:
        return bool(cfg.rope_dim) or isinstance(cfg.rope_scaling, LongRopeScaling)

    def gguf_fused(self, cfg: ModelConfig) -> dict[str, tuple[tuple[str, int], ...]]:
        """attn_qkv, and ffn_up holding gate and up."""
        return {"attn_qkv": (("attn_q", cfg.q_dim), ("attn_k", cfg.kv_dim), ("attn_v", cfg.kv_dim)),
                "ffn_up": (("ffn_gate", cfg.ffn_dim), ("ffn_up", cfg.ffn_dim))}


PHI3 = Phi3()
