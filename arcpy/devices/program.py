"""A ModelConfig as libarc's arc_model_config, and libarc's layer program for it.

The layer program (arc.h: arc_layer_op, arc_layer_program) is the sequence of one decoder layer,
written once in libarc: the CUDA forwards run it, and the NumPy reference asks libarc for the same
program and runs each op in its own form, so the two cannot drift apart.
"""

from __future__ import annotations

from arcpy import _lib
from arcpy.codes import OP_NAMES
from arcpy.model import ModelConfig
from arcpy.model.config import ACTIVATIONS


def native_config(ffi, cfg: ModelConfig, max_seq: int | None = None):
    """A new arc_model_config * holding cfg (max_seq: the context to allocate, else the config's)."""
    c = ffi.new("arc_model_config *")
    c.dim, c.n_layers, c.n_heads, c.n_kv_heads = cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads
    c.head_dim, c.ffn_dim, c.vocab = cfg.head_dim, cfg.ffn_dim, cfg.vocab
    c.max_seq = cfg.max_seq if max_seq is None else max_seq
    c.rms_eps = cfg.rms_eps
    c.tied_embeddings, c.qkv_bias, c.qk_norm = int(cfg.tied_embeddings), int(cfg.qkv_bias), int(cfg.qk_norm)
    c.rope_dim = cfg.rope_dim
    c.rope_factor = cfg.rope_attention_factor
    c.post_norms, c.activation = int(cfg.post_norms), ACTIVATIONS.index(cfg.activation)
    # Unset, the scores' factor is libarc's own 1/sqrt(head_dim), rounded once from double.
    c.embed_scale, c.attn_scale = cfg.embed_scale, cfg.attn_scale if cfg.attn_scale is not None else 0.0
    c.sliding_window, c.window_pattern = cfg.sliding_window, cfg.window_pattern
    return c


def layer_program(cfg: ModelConfig, layer: int) -> list[int]:
    """The ops (arc_layer_op ids) that layer `layer` of a model of cfg runs, in order."""
    ffi, lib = _lib.load()
    ops, count = ffi.new("int32_t[]", lib.ARC_MAX_LAYER_OPS), ffi.new("int32_t *")
    _lib.check(lib.arc_layer_program(native_config(ffi, cfg), layer, ops, count))
    return [int(op) for op in ops[0:count[0]]]


def describe(program: list[int]) -> str:
    """The program's op names, as arc.h spells them without the ARC_OP_ prefix."""
    return " ".join(OP_NAMES.get(op, f"op{op}") for op in program)
