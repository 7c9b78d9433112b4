"""Hybrid decoders of attention and gated DeltaNet layers (Qwen3.5, Qwen3.6): their layer kinds,
the DeltaNet layer's tensors and op, and what the CUDA backend does not run yet.

A gated DeltaNet layer (transformers' Qwen3_5GatedDeltaNet; llama.cpp's qwen35) takes the normed
input n of a token and
- projects it: qkv = in_proj_qkv n (q and k of n_k heads of k_head_dim, v of n_v heads of
  v_head_dim), z = in_proj_z n (as v), b = in_proj_b n and a = in_proj_a n (one a value head);
- convolves qkv causally, channel by channel, with the last conv_kernel inputs (conv1d, no bias),
  then SiLU;
- L2-normalizes each q and k head (x / sqrt(sum x^2 + 1e-6)) and scales q by 1/sqrt(k_head_dim);
  value head h reads key head h // (n_v / n_k);
- g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), per value head, and updates that
  head's state S (k_head_dim, v_head_dim): S <- exp(g) S; S <- S + k (beta (v - S^T k))^T;
  its output is o = S^T q;
- o RMS-normed per head by linear_attn.norm (its factor w as stored, never 1 + w) times silu(z),
  then out_proj, added to the residual stream.
Its state, fixed in size: the convolution's last conv_kernel - 1 inputs and S of every value head,
float32. The attention layers of these models gate their output: q_proj holds, for each query
head, its head_dim query rows and then head_dim gate rows; the attention's output is multiplied by
sigmoid(gate) before o_proj.

libarc's layer program runs both (arc.h: ARC_OP_ATTN_GATE, ARC_OP_DN_IN, ARC_OP_DN_STEP,
ARC_OP_DN_OUT; arc_model_config's attn_gate and dn_ fields): its table holds the gate's rows as
their own tensor (ARC_TENSOR_WQ_GATE, split from q_proj by split_gate) and the DeltaNet's under
ARC_TENSOR_DN_*. libarc's kernel takes heads of 128 (every Qwen3.5 and Qwen3.6 model's); the CUDA
backend refuses other sizes in one line (check_cuda).
"""

from __future__ import annotations

import numpy as np

from arcpy.checks import is_int, quoted, require
from arcpy.model.quant import QuantTensor

FULL, LINEAR = "full_attention", "linear_attention"  # the layer kinds, as config.json names them
LAYER_KINDS = (FULL, LINEAR)
CUDA_HEAD_DIM = 128  # the DeltaNet heads libarc's kernel takes (arc.h: dn_head_dim)
STATE_SLOTS = 9  # the states libarc keeps a DeltaNet layer, one a position mod 9 (arc_model_state)
_DIMS = ("linear_n_k_heads", "linear_n_v_heads", "linear_k_head_dim", "linear_v_head_dim", "linear_conv_kernel")
GATED_NORM = "linear_attn.norm.weight"  # the one norm whose factors are never 1 + w


def is_hybrid(cfg) -> bool:
    """Whether the config has DeltaNet layers or gated attention (what libarc does not run)."""
    return bool(cfg.layer_types) or cfg.attn_output_gate


def check_hybrid(cfg) -> None:
    """ModelConfig's checks of its hybrid fields (InvalidArgumentError, one line each)."""
    kinds = cfg.layer_types
    require(isinstance(kinds, tuple) and all(k in LAYER_KINDS for k in kinds),
            f"layer_types must be a tuple of {' or '.join(map(repr, LAYER_KINDS))}, got {quoted(kinds)}")
    require(not kinds or len(kinds) == cfg.n_layers,
            f"layer_types must name each of the {cfg.n_layers} layers, got {len(kinds)}")
    require(isinstance(cfg.attn_output_gate, bool), "attn_output_gate must be bool")
    for field in _DIMS:
        v = getattr(cfg, field)
        require(is_int(v) and 0 <= v < 2**31, f"{field} must be a non-negative int32, got {quoted(v)}")
    if not kinds:
        require(not any(getattr(cfg, f) for f in _DIMS) and not cfg.attn_output_gate,
                f"{', '.join(_DIMS)} and attn_output_gate need layer_types")
    if LINEAR not in kinds:
        return
    require(all(getattr(cfg, f) > 0 for f in _DIMS), f"a linear_attention layer needs {', '.join(_DIMS)} > 0")
    require(cfg.linear_n_v_heads % cfg.linear_n_k_heads == 0,
            f"linear_n_v_heads ({cfg.linear_n_v_heads}) must be a multiple of linear_n_k_heads "
            f"({cfg.linear_n_k_heads})")
    require(cfg.linear_conv_kernel >= 2, f"linear_conv_kernel must be 2 or more, got {cfg.linear_conv_kernel}")
    require(cfg.linear_k_head_dim == cfg.linear_v_head_dim,
            f"linear_k_head_dim ({cfg.linear_k_head_dim}) and linear_v_head_dim ({cfg.linear_v_head_dim}) must be equal")
    require(cfg.n_layers <= 128, f"a hybrid has at most 128 layers, got {cfg.n_layers}")
    require(not cfg.post_norms and not cfg.qkv_bias and cfg.sliding_window == 0,
            "linear_attention layers do not combine with post_norms, qkv_bias or a sliding window")


def key_dim(cfg) -> int:
    return cfg.linear_n_k_heads * cfg.linear_k_head_dim


def value_dim(cfg) -> int:
    return cfg.linear_n_v_heads * cfg.linear_v_head_dim


def conv_dim(cfg) -> int:
    """The channels the convolution runs over: q, k and v."""
    return 2 * key_dim(cfg) + value_dim(cfg)


def state_bytes_per_token(cfg) -> int:
    """Bytes of DeltaNet state a token reads and writes (float32, every DeltaNet layer's S and
    convolution inputs, read once and written once): a step's floor beside its weights."""
    layers = sum(cfg.is_linear_layer(i) for i in range(cfg.n_layers))
    per_layer = (cfg.linear_n_v_heads * cfg.linear_k_head_dim * cfg.linear_v_head_dim
                 + conv_dim(cfg) * (cfg.linear_conv_kernel - 1)) if layers else 0
    return 2 * 4 * layers * per_layer


def check_cuda(cfg) -> None:
    """What libarc's DeltaNet kernel does not take, refused in one line (InvalidArgumentError)."""
    if LINEAR in cfg.layer_types:
        require(cfg.linear_k_head_dim == CUDA_HEAD_DIM and cfg.linear_conv_kernel <= 4,
                f"the CUDA backend runs DeltaNet heads of {CUDA_HEAD_DIM} and convolutions of at most 4 taps, this "
                f"model has heads of {cfg.linear_k_head_dim} and {cfg.linear_conv_kernel} taps: use --backend numpy")


def split_gate(w, n_heads: int, head_dim: int):
    """A gated attention's q_proj rows (each head's head_dim query rows, then its gate's) -> (the
    query rows, the gate rows), each head's in head order: an array of any dtype (rows, ...) or a
    QuantTensor (its packed rows, split without decoding)."""
    data = w.data if isinstance(w, QuantTensor) else w
    heads = data.reshape(n_heads, 2, head_dim, *data.shape[1:])
    parts = tuple(np.ascontiguousarray(heads[:, j].reshape(n_heads * head_dim, *data.shape[1:])) for j in (0, 1))
    if isinstance(w, QuantTensor):
        return tuple(QuantTensor(w.format, (n_heads * head_dim, w.cols), p) for p in parts)
    return parts
