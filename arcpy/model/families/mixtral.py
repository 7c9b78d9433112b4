"""Mixtral: a mixture of experts' FFN (the top k router logits, then their softmax) and a sliding
window on every layer. Its Hugging Face files name the FFN block_sparse_moe and an expert's
matrices w1, w3, w2; its GGUF files are llama's with expert_count (llama.py reads them here)."""

from __future__ import annotations

from typing import Mapping

from arcpy.model.config import ModelConfig
from arcpy.model.families.family import EVERY_LAYER, Family
from arcpy.model.families.hf_values import integer


class Mixtral(Family):
    name = "mixtral"
    hf_classes = ("MixtralForCausalLM",)
    window = EVERY_LAYER
    hf_expert_block = "block_sparse_moe"
    hf_expert_names = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}

    def holds(self, cfg: ModelConfig) -> bool:
        return cfg.n_experts > 0 and cfg.routing == "topk_softmax"

    def hf_fields(self, d: Mapping, source: str, n_layers: int, head_dim: int) -> dict:
        return {"n_experts": integer(d, "num_local_experts", source, 8),
                "n_experts_used": integer(d, "num_experts_per_tok", source, 2),
                "expert_ffn_dim": integer(d, "intermediate_size", source),
                # The top k logits, then their softmax: what transformers computes as softmax, top k,
                # renormalized, in exact arithmetic (model.moe).
                "routing": "topk_softmax"}

    def to_hf(self, cfg: ModelConfig, d: dict) -> None:
        d.update(num_local_experts=cfg.n_experts, num_experts_per_tok=cfg.n_experts_used, sliding_window=None,
                 intermediate_size=cfg.expert_ffn_dim)


def gguf_experts(m, a: str, n: int) -> dict:
    """Mixtral's experts in a "llama" file, as llama.cpp reads them: an expert's width is
    feed_forward_length."""
    return {"n_experts": n, "n_experts_used": m.integer(a + "expert_used_count"),
            "expert_ffn_dim": m.integer(a + "feed_forward_length"), "routing": "topk_softmax"}


MIXTRAL = Mixtral()
