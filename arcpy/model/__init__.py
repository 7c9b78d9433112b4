"""Model description and weights.

A model is a `ModelConfig` plus a dict of tensors under their Hugging Face names, every tensor held
as raw bf16 words (`uint16`, C-contiguous). One concept per module:

    bf16         bf16 words <-> float32
    config       ModelConfig, RopeScaling, RoPE frequencies
    tensors      the tensor table of a config, and Model
    hf           Hugging Face config.json <-> ModelConfig
    safetensors  the safetensors reader and writer
    checkpoint   model directories: load_model, save_model
    gguf         GGUF files (with gguf_file, the container, and gguf_vocab, the tokenizer's metadata)
    presets      named shapes with deterministic random weights
    files        opening files and parsing JSON that may be hostile
    checks       argument checks, and quoting file text for messages
"""

from arcpy.model.bf16 import bf16_to_f32, f32_to_bf16
from arcpy.model.checkpoint import PICKLE_SUFFIXES, load_model, save_model
from arcpy.model.config import (
    EMBED,
    FINAL_NORM,
    LM_HEAD,
    ModelConfig,
    RopeScaling,
    expected_tensors,
    iter_tensors,
    layer_prefix,
    rope_inv_freq,
)
from arcpy.model.gguf import GGUFCheckpoint, load_gguf_model, open_gguf, unpermute_rotary_rows
from arcpy.model.hf import config_from_hf, config_to_hf
from arcpy.model.presets import SHAPES, random_model, synthetic_model
from arcpy.model.safetensors import MAX_HEADER_BYTES, save_safetensors
from arcpy.model.tensors import Model

__all__ = [
    "EMBED", "FINAL_NORM", "GGUFCheckpoint", "LM_HEAD", "MAX_HEADER_BYTES", "PICKLE_SUFFIXES", "SHAPES", "Model", "ModelConfig",
    "RopeScaling", "bf16_to_f32", "config_from_hf", "config_to_hf", "expected_tensors", "f32_to_bf16",
    "iter_tensors", "layer_prefix", "load_gguf_model", "load_model", "open_gguf", "random_model", "rope_inv_freq", "save_model",
    "save_safetensors", "synthetic_model", "unpermute_rotary_rows",
]
