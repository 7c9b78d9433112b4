"""Qwen3-MoE: Qwen3's layer with a mixture of experts' FFN: softmax over the experts, the top k,
renormalized with norm_topk_prob; dense layers by decoder_sparse_step and mlp_only_layers."""

from __future__ import annotations

from typing import Mapping

from arcpy.checks import is_int, quoted
from arcpy.errors import ModelFileError
from arcpy.model.config import ModelConfig
from arcpy.model.families.family import Family
from arcpy.model.families.hf_values import flag, integer


class Qwen3Moe(Family):
    name = "qwen3_moe"
    hf_classes = ("Qwen3MoeForCausalLM",)
    gguf_arch = "qwen3moe"
    qk_norm = True
    hf_constants = {"use_sliding_window": False}
    norm_topk_default = True  # norm_topk_prob where config.json does not say
    shared_expert = False     # config.json names a shared expert's width

    def holds(self, cfg: ModelConfig) -> bool:
        return cfg.n_experts > 0

    def hf_fields(self, d: Mapping, source: str, n_layers: int, head_dim: int) -> dict:
        dense = d.get("mlp_only_layers", [])
        if not isinstance(dense, list) or not all(is_int(i) for i in dense):
            raise ModelFileError(f"{source}: key 'mlp_only_layers' must be a list of layer indices, "
                                 f"got {quoted(dense)}")
        out = {"n_experts": integer(d, "num_experts", source),
               "n_experts_used": integer(d, "num_experts_per_tok", source),
               "expert_ffn_dim": integer(d, "moe_intermediate_size", source),
               "norm_topk_prob": flag(d, "norm_topk_prob", source, self.norm_topk_default),
               "moe_every": integer(d, "decoder_sparse_step", source, 1),
               "mlp_only_layers": tuple(sorted(set(dense)))}
        if self.shared_expert:
            out["shared_expert_ffn_dim"] = integer(d, "shared_expert_intermediate_size", source)
        if out["moe_every"] <= 0:
            raise ModelFileError(f"{source}: key 'decoder_sparse_step' must be positive, got {out['moe_every']}")
        return out

    def to_hf(self, cfg: ModelConfig, d: dict) -> None:
        d.update(num_experts=cfg.n_experts, num_experts_per_tok=cfg.n_experts_used,
                 moe_intermediate_size=cfg.expert_ffn_dim, norm_topk_prob=cfg.norm_topk_prob,
                 decoder_sparse_step=cfg.moe_every or 1, mlp_only_layers=list(cfg.mlp_only_layers))
        if cfg.shared_expert_ffn_dim:
            d["shared_expert_intermediate_size"] = cfg.shared_expert_ffn_dim

    def gguf_experts(self, m, a: str, n: int) -> dict:
        """As llama.cpp reads them: an expert's width is expert_feed_forward_length, and
        expert_weights_norm (true where absent) is norm_topk_prob."""
        return {"n_experts": n, "n_experts_used": m.integer(a + "expert_used_count"),
                "expert_ffn_dim": m.integer(a + "expert_feed_forward_length"), "routing": "softmax_topk",
                "norm_topk_prob": bool(m.values.get(a + "expert_weights_norm", True))}


QWEN3_MOE = Qwen3Moe()
