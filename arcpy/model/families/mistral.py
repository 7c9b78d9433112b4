"""Mistral: the Llama layer, a sliding window on every layer (config.json); and the text model of
Mistral Small 3.x, whose GGUF files ("mistral3") hold the Llama layer with a head_dim other than
dim / heads (config.json names it MistralForCausalLM)."""

from __future__ import annotations

from arcpy.model.families.family import EVERY_LAYER, Family


class Mistral(Family):
    name = "mistral"
    hf_classes = ("MistralForCausalLM",)
    window = EVERY_LAYER


class Mistral3(Family):
    name = "mistral3"
    gguf_arch = "mistral3"
    gguf_permuted = True


MISTRAL, MISTRAL3 = Mistral(), Mistral3()
