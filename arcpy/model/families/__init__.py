"""The families of decoders arcpy reads, one module each, and their registry.

    family       Family: what a family changes in reading its files (attributes and hooks), and
                 the names every family shares
    hf_values    config.json's values read with their checks, and its RoPE settings
    llama        Llama 2/3, SmolLM, SmolLM2 (and GGUF "llama" files of Mistral and Mixtral)
    mistral      Mistral; Mistral Small 3.x's GGUF files ("mistral3")
    qwen2        Qwen2                      qwen3       Qwen3 (dense)
    smollm3      SmolLM3                    phi3        Phi-3.5, Phi-4-mini
    gemma3       Gemma 3 (text)             qwen3_moe   Qwen3-MoE
    qwen2_moe    Qwen2-MoE                  mixtral     Mixtral
    qwen3_5      Qwen3.5 and Qwen3.6, dense and MoE (gated DeltaNet hybrids)
    gpt_oss      gpt-oss (sinks, biases, a clamped GLU: arcpy/model/gpt_oss.py)
    gemma4       Gemma 4 (text), dense and MoE, with per-layer embeddings and shared K/V

The readers (arcpy.model.hf, gguf_config, gguf, checkpoint) look a family up here, by config.json's
architectures or model_type, by a GGUF file's general.architecture, or, to write config.json, by
what a ModelConfig holds, and do what every family shares themselves.
"""

from __future__ import annotations

from typing import Mapping

from arcpy.checks import quoted
from arcpy.errors import ModelFileError
from arcpy.model.config import ModelConfig
from arcpy.model.families.family import Family
from arcpy.model.families.gemma3 import GEMMA3
from arcpy.model.families.gemma4 import GEMMA4
from arcpy.model.families.gpt_oss import GPT_OSS
from arcpy.model.families.hf_values import text
from arcpy.model.families.llama import LLAMA
from arcpy.model.families.mistral import MISTRAL, MISTRAL3
from arcpy.model.families.mixtral import MIXTRAL
from arcpy.model.families.phi3 import PHI3
from arcpy.model.families.qwen2 import QWEN2
from arcpy.model.families.qwen2_moe import QWEN2_MOE
from arcpy.model.families.qwen3 import QWEN3
from arcpy.model.families.qwen3_5 import QWEN3_5, QWEN3_5_MOE
from arcpy.model.families.qwen3_moe import QWEN3_MOE
from arcpy.model.families.smollm3 import SMOLLM3

# In the order messages list them.
FAMILIES: tuple[Family, ...] = (LLAMA, MISTRAL, QWEN2, QWEN3, SMOLLM3, MISTRAL3, PHI3, GEMMA3, QWEN3_MOE,
                                QWEN2_MOE, MIXTRAL, QWEN3_5, QWEN3_5_MOE, GPT_OSS, GEMMA4)
# config_to_hf writes a config as the first of these that holds it.
_WRITERS = (GEMMA4, GPT_OSS, QWEN3_5_MOE, QWEN3_5, QWEN2_MOE, MIXTRAL, QWEN3_MOE, QWEN2, GEMMA3, QWEN3, SMOLLM3, PHI3,
            LLAMA)
_BY_CLASS = {c: f for f in FAMILIES for c in f.hf_classes}
_BY_TYPE = {f.name: f for f in FAMILIES if f.hf_classes}
_BY_GGUF = {f.gguf_arch: f for f in FAMILIES if f.gguf_arch}
# The architectures whose GGUF files may hold experts (their family reads them).
_GGUF_MOE = tuple(f.gguf_arch for f in FAMILIES if f.gguf_arch and type(f).gguf_experts is not Family.gguf_experts)

# Every family's fused tensors and expert names, which the safetensors reader splits and stacks
# wherever they come: a layer's fused tensor -> its parts; an FFN block's name -> its files'
# names of an expert's matrices -> the model's.
HF_FUSED = {name: parts for f in FAMILIES for name, parts in f.hf_fused.items()}
HF_EXPERT_BLOCKS = {f.hf_expert_block: {v: k for k, v in f.hf_expert_names.items()} for f in FAMILIES}


def hf_family(d: Mapping, source: str) -> Family:
    """The family config.json `d` names: the first of its architectures this engine reads, else
    (no architectures) its model_type. `source` names the file in messages."""
    archs = d.get("architectures")
    if archs is None:
        if "model_type" not in d:
            raise ModelFileError(f"{source}: missing key 'architectures'")
        family = text(d, "model_type", source)
        if family not in _BY_TYPE:
            raise ModelFileError(f"{source}: unsupported model_type {quoted(family)} "
                                 f"(supported: {', '.join(sorted(_BY_TYPE))})")
        return _BY_TYPE[family]
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise ModelFileError(f"{source}: key 'architectures' must be a non-empty list of strings, got {quoted(archs)}")
    known = [a for a in archs if a in _BY_CLASS]
    if not known:
        raise ModelFileError(f"{source}: unsupported architecture {quoted(archs[0])} "
                             f"(supported: {', '.join(_BY_CLASS)})")
    return _BY_CLASS[known[0]]


def gguf_family(arch: str, path) -> Family:
    """The family of a GGUF file whose general.architecture is `arch` (`path` names it in messages)."""
    if arch not in _BY_GGUF:
        raise ModelFileError(f"{path}: unsupported architecture {quoted(arch)} (supported: {', '.join(_BY_GGUF)})")
    return _BY_GGUF[arch]


def gguf_experts(family: Family, m, a: str, path) -> dict:
    """A GGUF file's mixture of experts' fields (none where expert_count is 0 or absent), read by
    its family; other families' experts are refused."""
    n = m.integer(a + "expert_count", 0)
    if n < 0:  # before expert_used_count is read: the message names the key that is wrong
        raise ModelFileError(f"{path}: metadata {quoted(a + 'expert_count')} must be 0 (no experts) or more, got {n}")
    if n == 0:
        return {}
    fields = family.gguf_experts(m, a, n)
    if fields is None:
        raise ModelFileError(f"{path}: mixture-of-experts {family.gguf_arch} models are not supported "
                             f"(supported: {', '.join(_GGUF_MOE)})")
    return fields


def family_for(cfg: ModelConfig) -> Family:
    """The family whose config.json says what cfg holds (the first whose features cover it)."""
    return next(f for f in _WRITERS if f.holds(cfg))


__all__ = ["FAMILIES", "HF_EXPERT_BLOCKS", "HF_FUSED", "Family", "family_for", "gguf_experts", "gguf_family",
           "hf_family"]
