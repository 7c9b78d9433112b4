"""Llama 2/3, SmolLM and SmolLM2: the Llama layer, every family's default (family.py). Its GGUF
files ("llama") also hold Mistral's and, with expert_count, Mixtral's (mixtral.py)."""

from __future__ import annotations

from arcpy.model.config import ModelConfig
from arcpy.model.families import mixtral
from arcpy.model.families.family import Family


class Llama(Family):
    name = "llama"
    hf_classes = ("LlamaForCausalLM",)
    gguf_arch = "llama"
    gguf_permuted = True

    def holds(self, cfg: ModelConfig) -> bool:
        return True

    def gguf_experts(self, m, a: str, n: int) -> dict:
        return mixtral.gguf_experts(m, a, n)


LLAMA = Llama()
