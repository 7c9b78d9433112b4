"""Start-up on the GPU, in one place: validate, upload, warm up, capture.

`cuda_device(model)` turns a checked `Model` into a CudaDevice whose forward is libarc's
Llama-family decoder (arc_model_forward), captured once into a CUDA graph.
"""

from __future__ import annotations

import numpy as np

from . import _lib
from .device import Context, CudaDevice
from .errors import InvalidArgumentError
from .model import EMBED, FINAL_NORM, LM_HEAD, Model, layer_prefix, rope_inv_freq

# Tensor ids of arc.h's arc_tensor, by the name suffix of the Hugging Face layout.
_LAYER_TENSORS = {
    "input_layernorm.weight": "ARC_TENSOR_ATTN_NORM",
    "self_attn.q_proj.weight": "ARC_TENSOR_WQ",
    "self_attn.k_proj.weight": "ARC_TENSOR_WK",
    "self_attn.v_proj.weight": "ARC_TENSOR_WV",
    "self_attn.q_proj.bias": "ARC_TENSOR_BQ",
    "self_attn.k_proj.bias": "ARC_TENSOR_BK",
    "self_attn.v_proj.bias": "ARC_TENSOR_BV",
    "self_attn.o_proj.weight": "ARC_TENSOR_WO",
    "post_attention_layernorm.weight": "ARC_TENSOR_MLP_NORM",
    "mlp.gate_proj.weight": "ARC_TENSOR_W_GATE",
    "mlp.up_proj.weight": "ARC_TENSOR_W_UP",
    "mlp.down_proj.weight": "ARC_TENSOR_W_DOWN",
}
_GLOBAL_TENSORS = {EMBED: "ARC_TENSOR_EMBED", FINAL_NORM: "ARC_TENSOR_FINAL_NORM", LM_HEAD: "ARC_TENSOR_LM_HEAD"}


class CudaModel:
    """An arc_model: the weights, KV cache and activations of one model on one context."""

    def __init__(self, ctx: Context, model: Model, max_seq: int):
        cfg = model.config
        if not 0 < max_seq <= cfg.max_seq:
            raise InvalidArgumentError(f"max_seq must be in 1..{cfg.max_seq}, got {max_seq}")
        self.ctx, self.ffi, self.lib = ctx, ctx.ffi, ctx.lib
        c = self.ffi.new("arc_model_config *")
        c.dim, c.n_layers, c.n_heads, c.n_kv_heads = cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads
        c.head_dim, c.ffn_dim, c.vocab, c.max_seq = cfg.head_dim, cfg.ffn_dim, cfg.vocab, max_seq
        c.rms_eps = cfg.rms_eps
        c.tied_embeddings, c.qkv_bias = int(cfg.tied_embeddings), int(cfg.qkv_bias)
        pp = self.ffi.new("arc_model **")
        _lib.check(self.lib.arc_model_create(ctx.ptr, c, pp))
        self.ptr = pp[0]
        self.vocab, self.max_seq = cfg.vocab, max_seq
        try:
            self._upload(model)
        except BaseException:
            self.close()
            raise

    def _upload(self, model: Model) -> None:
        for name, array in model.tensors.items():
            if name in _GLOBAL_TENSORS:
                tensor, layer = _GLOBAL_TENSORS[name], 0
            else:
                layer_s, _, suffix = name[len("model.layers."):].partition(".")
                if not name.startswith("model.layers.") or suffix not in _LAYER_TENSORS:
                    raise InvalidArgumentError(f"tensor {name} has no place in the model")
                tensor, layer = _LAYER_TENSORS[suffix], int(layer_s)
                assert name == layer_prefix(layer) + suffix
            self._put(tensor, layer, array)
        self._put("ARC_TENSOR_ROPE_INV_FREQ", 0, rope_inv_freq(model.config))
        # The uploads read pageable host memory that the arrays own: wait once, at start-up.
        self.ctx.wait_idle()

    def _put(self, tensor: str, layer: int, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        _lib.check(self.lib.arc_model_upload(self.ptr, getattr(self.lib, tensor), layer,
                                             self.ffi.from_buffer(array), array.nbytes))

    def forward(self, loop) -> None:
        """Enqueue one forward reading the loop's token and position."""
        _lib.check(self.lib.arc_model_forward(self.ptr, loop))

    def logits(self):
        lp, vp = self.ffi.new("const float **"), self.ffi.new("int32_t *")
        _lib.check(self.lib.arc_model_logits(self.ptr, lp, vp))
        return lp[0], int(vp[0])

    def close(self) -> None:
        if self.ptr is not None:
            self.lib.arc_model_destroy(self.ptr)
            self.ptr = None


def cuda_device(model: Model, max_seq: int | None = None, use_graph: bool = True,
                vocab_limit: int | None = None, ctx: Context | None = None) -> CudaDevice:
    """Load `model` onto GPU 0: upload, warm up, capture. `vocab_limit` narrows the range of
    valid token ids below the lm_head's width, as a padded head does."""
    ctx = ctx or Context(0)
    cm = CudaModel(ctx, model, max_seq or model.config.max_seq)
    logits, width = cm.logits()
    dev = CudaDevice(ctx, vocab_limit or width, cm.max_seq, cm.forward, logits, width, use_graph)
    dev.model = cm
    return dev
