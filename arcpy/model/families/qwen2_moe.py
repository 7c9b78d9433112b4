"""Qwen2-MoE: Qwen3-MoE's mixture of experts (norm_topk_prob false by default) in Qwen2's layer (q,
k and v biases, no q/k norms), with a shared expert and its sigmoid gate. No GGUF architecture."""

from __future__ import annotations

from arcpy.model.config import ModelConfig
from arcpy.model.families.qwen3_moe import Qwen3Moe


class Qwen2Moe(Qwen3Moe):
    name = "qwen2_moe"
    hf_classes = ("Qwen2MoeForCausalLM",)
    gguf_arch = None
    qk_norm = False
    qkv_bias = True
    norm_topk_default = False
    shared_expert = True

    def holds(self, cfg: ModelConfig) -> bool:
        return cfg.n_experts > 0 and bool(cfg.shared_expert_ffn_dim or cfg.qkv_bias)


QWEN2_MOE = Qwen2Moe()
