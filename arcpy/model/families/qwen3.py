"""Qwen3 (dense): the Llama layer with q/k head norms and a head_dim of its own."""

from __future__ import annotations

from arcpy.model.config import ModelConfig
from arcpy.model.families.family import Family


class Qwen3(Family):
    name = "qwen3"
    hf_classes = ("Qwen3ForCausalLM",)
    gguf_arch = "qwen3"
    qk_norm = True
    hf_constants = {"use_sliding_window": False}

    def holds(self, cfg: ModelConfig) -> bool:
        return cfg.qk_norm


QWEN3 = Qwen3()
