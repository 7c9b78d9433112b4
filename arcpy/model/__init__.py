"""Model description and weights.

A model is a `ModelConfig` plus a dict of tensors under their Hugging Face names, every tensor held
as raw bf16 words (`uint16`, C-contiguous), or, for the projections and the lm_head, as a
QuantTensor in one of arc.h's quantized formats. One concept per module:

    bf16         bf16 words <-> float32
    quant        quantized rows as libarc reads them: QuantTensor, dequantize, the quantized GEMV's arithmetic
    quant_pack   GGUF blocks repacked into those rows, and random quantized tensors
    config       ModelConfig, its RoPE scalings, RoPE frequencies
    native       libarc's description of a model: arc_model_config, the tensor table, the layer program
    table        the tensor table and the layer program read in Python, for an install without libarc.so
    moe          mixtures of experts: the routing rule, the bytes of the experts a token or a step reads
    hybrid       Qwen3.5's hybrids of attention and gated DeltaNet layers: layer kinds, tensors, the CUDA refusal
    gemma4       Gemma 4's layer: its tensors and ops past libarc's, the CUDA refusal
    tensors      Model
    hf           Hugging Face config.json <-> ModelConfig
    families     a module per family of decoders (what it changes in reading its files), and their registry
    safetensors  the safetensors reader and writer
    checkpoint   model directories: load_model, save_model
    gguf         GGUF files (with gguf_file, the container, and gguf_vocab, the tokenizer's metadata)
    presets      named shapes with deterministic random weights
    hub          models named on the Hugging Face hub (org/name, org/name:QUANT), resolved to files here
    files        opening files and parsing JSON that may be hostile
    checks       argument checks, and quoting file text for messages
"""

from arcpy.model.bf16 import bf16_to_f32, f32_to_bf16
from arcpy.model.checkpoint import PICKLE_SUFFIXES, load_model, save_model
from arcpy.model.config import LinearScaling, LongRopeScaling, ModelConfig, RopeScaling, YarnScaling, rope_inv_freq
from arcpy.model.gguf import GGUFCheckpoint, load_gguf_model, open_gguf, unpermute_rotary_rows
from arcpy.model.hf import config_from_hf, config_to_hf
from arcpy.model.native import EMBED, FINAL_NORM, LM_HEAD, expected_tensors, is_matrix, iter_tensors, layer_prefix, norm_names
from arcpy.model.presets import SHAPES, preset_formats, preset_scales, synthetic_model
from arcpy.model.random_weights import random_model
from arcpy.model.quant import QuantTensor, dequantize, qgemv_reference, quantize_input, row_bytes
from arcpy.model.quant_pack import from_gguf, random_quant
from arcpy.model.safetensors import MAX_HEADER_BYTES, save_safetensors
from arcpy.model.tensors import Model

__all__ = [
    "EMBED", "FINAL_NORM", "GGUFCheckpoint", "LM_HEAD", "LinearScaling", "LongRopeScaling", "MAX_HEADER_BYTES",
    "Model", "ModelConfig", "YarnScaling",
    "PICKLE_SUFFIXES", "QuantTensor", "RopeScaling", "SHAPES", "bf16_to_f32", "config_from_hf",
    "config_to_hf", "dequantize", "expected_tensors", "f32_to_bf16", "from_gguf", "is_matrix", "iter_tensors",
    "layer_prefix", "load_gguf_model", "norm_names", "load_model", "open_gguf", "preset_formats", "preset_scales",
    "qgemv_reference", "quantize_input", "random_model", "random_quant", "rope_inv_freq", "row_bytes", "save_model",
    "save_safetensors", "synthetic_model", "unpermute_rotary_rows",
]
