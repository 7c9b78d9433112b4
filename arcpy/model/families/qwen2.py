"""Qwen2 (and Qwen2.5): the Llama layer with q, k and v biases."""

from __future__ import annotations

from arcpy.model.config import ModelConfig
from arcpy.model.families.family import Family


class Qwen2(Family):
    name = "qwen2"
    hf_classes = ("Qwen2ForCausalLM",)
    gguf_arch = "qwen2"
    qkv_bias = True
    hf_constants = {"use_sliding_window": False}

    def holds(self, cfg: ModelConfig) -> bool:
        return cfg.qkv_bias


QWEN2 = Qwen2()
