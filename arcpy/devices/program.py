"""A ModelConfig as libarc's arc_model_config, and libarc's layer program for it.

The layer program (arc.h: arc_layer_op, arc_layer_program) is the sequence of one decoder layer,
written once in libarc: the CUDA forwards run it, and the NumPy reference asks libarc for the same
program and runs each op in its own form. Where no libarc.so loads, a copy of the program serves,
pinned equal to libarc's by a test.
"""

from __future__ import annotations

from arcpy import _lib
from arcpy.codes import (
    OP_ATTEND,
    OP_ATTN_IN,
    OP_ATTN_OUT,
    OP_ATTN_OUT_NORM,
    OP_FFN_IN,
    OP_FFN_OUT,
    OP_FFN_OUT_NORM,
    OP_NAMES,
    OP_QK_NORM,
)
from arcpy.errors import InvalidArgumentError, NoDeviceError
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
    """The ops (arc_layer_op ids) that layer `layer` of a model of cfg runs, in order: libarc's,
    or, where no libarc.so loads (the NumPy backend runs without one), its copy below."""
    try:
        ffi, lib = _lib.load()
    except NoDeviceError:
        return program_copy(cfg, layer)
    ops, count = ffi.new("int32_t[]", lib.ARC_MAX_LAYER_OPS), ffi.new("int32_t *")
    _lib.check(lib.arc_layer_program(native_config(ffi, cfg), layer, ops, count))
    return [int(op) for op in ops[0:count[0]]]


def program_copy(cfg: ModelConfig, layer: int) -> list[int]:
    """libarc/model/layer.cu's layer_program, written out for a machine without libarc.so, as
    codes.py copies arc.h's numbers; tests/test_families.py pins it equal to libarc's."""
    if not 0 <= layer < cfg.n_layers:
        raise InvalidArgumentError(f"layer must be in [0, {cfg.n_layers}), got {layer}")
    return [OP_ATTN_IN, *([OP_QK_NORM] if cfg.qk_norm else []), OP_ATTEND,
            OP_ATTN_OUT_NORM if cfg.post_norms else OP_ATTN_OUT, OP_FFN_IN,
            OP_FFN_OUT_NORM if cfg.post_norms else OP_FFN_OUT]


def describe(program: list[int]) -> str:
    """The program's op names, as arc.h spells them without the ARC_OP_ prefix."""
    return " ".join(OP_NAMES.get(op, f"op{op}") for op in program)
