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

libarc's layer program and tensor table know neither (arc.h): arcpy.model.native adds the DeltaNet
tensors and OP_DELTANET, an op of the NumPy reference alone, to a hybrid config's table and
program, and the CUDA backend refuses such a model in one line (CUDA_REFUSAL).
"""

from __future__ import annotations

from arcpy.checks import is_int, quoted, require

FULL, LINEAR = "full_attention", "linear_attention"  # the layer kinds, as config.json names them
LAYER_KINDS = (FULL, LINEAR)
# The op of a DeltaNet layer, in place of the attention's ops: the NumPy reference's alone (libarc's
# arc_layer_op numbers stop well below it).
OP_DELTANET = 100
CUDA_REFUSAL = ("the gated DeltaNet layer (Qwen3.5, Qwen3.6) and the gated attention of its hybrids run on the "
                "numpy backend only so far: use --backend numpy")
_DIMS = ("linear_n_k_heads", "linear_n_v_heads", "linear_k_head_dim", "linear_v_head_dim", "linear_conv_kernel")
GATED_NORM = "linear_attn.norm.weight"  # the one norm whose factors are never 1 + w
# A DeltaNet layer's tensors after its input norm, by their Hugging Face names under the layer's
# prefix, in the order the files list them (the layer's norms and FFN follow as in any layer).
DELTANET_NAMES = ("linear_attn.A_log", "linear_attn.conv1d.weight", "linear_attn.dt_bias",
                  "linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight", "linear_attn.in_proj_qkv.weight",
                  "linear_attn.in_proj_z.weight", "linear_attn.norm.weight", "linear_attn.out_proj.weight")


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
    require(not cfg.post_norms and not cfg.qkv_bias and cfg.sliding_window == 0,
            "linear_attention layers do not combine with post_norms, qkv_bias or a sliding window")


def key_dim(cfg) -> int:
    return cfg.linear_n_k_heads * cfg.linear_k_head_dim


def value_dim(cfg) -> int:
    return cfg.linear_n_v_heads * cfg.linear_v_head_dim


def conv_dim(cfg) -> int:
    """The channels the convolution runs over: q, k and v."""
    return 2 * key_dim(cfg) + value_dim(cfg)


def deltanet_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """A DeltaNet layer's tensors (DELTANET_NAMES) -> their shapes, as the Hugging Face files hold
    them (the convolution's (channels, 1, kernel), as torch's Conv1d)."""
    nv, d = cfg.linear_n_v_heads, cfg.dim
    shapes = ((nv,), (conv_dim(cfg), 1, cfg.linear_conv_kernel), (nv,), (nv, d), (nv, d), (conv_dim(cfg), d),
              (value_dim(cfg), d), (cfg.linear_v_head_dim,), (d, value_dim(cfg)))
    return dict(zip(DELTANET_NAMES, shapes))
