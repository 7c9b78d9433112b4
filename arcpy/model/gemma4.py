"""Gemma 4 (text): its layer, its tensors beyond libarc's table, and what the CUDA backend does not
run yet.

A Gemma 4 layer (transformers' Gemma4TextDecoderLayer; llama.cpp's gemma4) is Gemma 3's, with norms
whose factors are their weights as stored (never 1 + w), and:
- attention: q and k heads RMS-normed by q_norm and k_norm, v heads RMS-normed without weights,
  the scores not scaled (q . k times 1); sliding layers attend the last sliding_window positions
  with heads of head_dim and n_kv_heads kv heads, RoPE of base rope_local_theta over whole heads;
  full-attention ("global") layers attend every position with heads of global_head_dim and
  global_n_kv_heads kv heads, proportional RoPE of base rope_theta: pair i of a head (elements i and
  i + global_head_dim / 2) turns at theta^(-2i / global_head_dim) for i < global_rope_dim / 2 and
  not at all past them. With k_eq_v a global layer has no v_proj: its v is k_proj's output, v-normed
  (its k is the same output k-normed and rotated).
- the FFN: the dense GLU (GELU tanh) of ffn_dim. In a mixture of experts (every layer) the experts
  run beside it: the router reads the FFN's input x (the residual stream), RMS-normed without
  weights, times router.scale and dim^-1/2; router.proj gives the logits; softmax over every
  expert, the top k renormalized to sum 1, each times router.per_expert_scale of its expert. The
  experts (GELU tanh GLUs of expert_ffn_dim) take pre_feedforward_layernorm_2(x). The FFN's output
  is post_feedforward_layernorm(post_feedforward_layernorm_1(dense) + post_feedforward_layernorm_2
  (experts)); a dense layer's is post_feedforward_layernorm(dense).
- per-layer embeddings (ple_dim > 0, E2B and E4B): before the layers, each token's row of
  embed_tokens_per_layer (ple_vocab rows of n_layers * ple_dim) times sqrt(ple_dim), and
  per_layer_model_projection of the scaled embedding times dim^-1/2, RMS-normed per layer by
  per_layer_projection_norm, are summed and times 2^-1/2: layer l's slice p_l. After its FFN a
  layer adds post_per_layer_input_norm(per_layer_projection(gelu_tanh(per_layer_input_gate x) * p_l)).
- every layer's output (the residual stream) times its stored layer_scalar.
- K/V shared across layers: the last kv_shared_layers layers compute no k or v; each reads the
  cache of the last layer of its kind (sliding or global) before them and writes none. Their
  files may still hold k_proj, v_proj and k_norm, which are not read. With double_wide_mlp their
  dense GLU is 2 x ffn_dim wide.
- the logits capped: final_softcap * tanh(logits / final_softcap).

libarc's layer program and tensor table hold every form of the layer (arc_model_config's
global_head_dim, global_n_kv_heads, v_norm, layer_scalar, final_softcap, experts_beside, ple_dim,
ple_vocab, kv_shared_layers and double_wide_ffn: native_fields, over native_base's Gemma 3 layer;
OP_EXPERTS_BESIDE, OP_PER_LAYER_INPUT and the tensors of MOE_IDS, PLE_GLOBAL_IDS and PLE_IDS); a
global layer with k_eq_v is given its k_proj as libarc's WV too (one more product of k's rows, v's
values exact), so its files' tensors are the table's less that v_proj (tensors). libarc's kernels
run every form (libarc/model/ple.cu: the per-layer inputs; a shared layer attends its source's
rows without storing any); the CUDA backend refuses every Gemma 4 model in one line until they
have passed their GPU tests (cuda_refusal, CUDA_LAYER_CHECKED); the NumPy reference runs them all.
"""

from __future__ import annotations

import dataclasses
import math

from arcpy.checks import is_finite_real, is_int, quoted, require
from arcpy.codes import ROUTINGS
from arcpy.model.moe import EXPERT_SUFFIXES

# The tensors outside the layers (per-layer embeddings), and a layer's beyond Gemma 3's, under
# their Hugging Face names (a layer's after its prefix).
PLE_EMBED = "model.embed_tokens_per_layer.weight"
PLE_PROJECTION = "model.per_layer_model_projection.weight"
PLE_NORM = "model.per_layer_projection_norm.weight"
ROUTER, ROUTER_SCALE, EXPERT_SCALE = "router.proj.weight", "router.scale", "router.per_expert_scale"
EXPERT_NORMS = ("pre_feedforward_layernorm_2.weight", "post_feedforward_layernorm_1.weight",
                "post_feedforward_layernorm_2.weight")
PLE_GATE, PLE_LAYER_PROJECTION, PLE_POST_NORM = ("per_layer_input_gate.weight", "per_layer_projection.weight",
                                                 "post_per_layer_input_norm.weight")
LAYER_SCALAR = "layer_scalar"
# What a shared layer's files may hold and the model does not read.
SHARED_UNREAD = ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight")
# Factors held as 1-D tensors (not norms): near 1 in a random model.
SCALES = (ROUTER_SCALE, EXPERT_SCALE, LAYER_SCALAR)
_EXPERTS = EXPERT_SUFFIXES[:3]  # the experts' stacked matrices (their biases are gpt-oss's)
# A mixture-of-experts layer's tensors past the dense FFN, (suffix, arc_tensor name) in file order.
MOE_IDS = tuple(zip(EXPERT_NORMS + (ROUTER, ROUTER_SCALE, EXPERT_SCALE) + _EXPERTS,
                    ("ARC_TENSOR_MOE_NORM", "ARC_TENSOR_FFN_OUT_NORM", "ARC_TENSOR_MOE_OUT_NORM",
                     "ARC_TENSOR_MOE_ROUTER", "ARC_TENSOR_ROUTER_SCALE", "ARC_TENSOR_EXPERT_SCALE",
                     "ARC_TENSOR_MOE_GATE", "ARC_TENSOR_MOE_UP", "ARC_TENSOR_MOE_DOWN")))
# The per-layer embeddings' tensors: the global ones (name, arc_tensor name), a layer's (suffix,
# arc_tensor name), in file order, and those of them held as matrices (rank 2).
PLE_GLOBAL_IDS = ((PLE_EMBED, "ARC_TENSOR_PLE_EMBED"), (PLE_PROJECTION, "ARC_TENSOR_PLE_PROJECTION"),
                  (PLE_NORM, "ARC_TENSOR_PLE_NORM"))
PLE_IDS = ((PLE_GATE, "ARC_TENSOR_PLE_GATE"), (PLE_LAYER_PROJECTION, "ARC_TENSOR_PLE_OUT"),
           (PLE_POST_NORM, "ARC_TENSOR_PLE_POST_NORM"))
PLE_MATRICES = (PLE_GATE, PLE_LAYER_PROJECTION)
_FIELDS = ("global_head_dim", "global_n_kv_heads", "global_rope_dim", "ple_dim", "ple_vocab", "kv_shared_layers")


def check_gemma4(cfg) -> None:
    """ModelConfig's checks of its Gemma 4 fields (InvalidArgumentError, one line each)."""
    for field in _FIELDS:
        v = getattr(cfg, field)
        require(is_int(v) and 0 <= v < 2**31, f"{field} must be a non-negative int32, got {quoted(v)}")
    for field in ("gemma4_layer", "k_eq_v", "double_wide_mlp"):
        require(isinstance(getattr(cfg, field), bool), f"{field} must be bool")
    cap = cfg.final_softcap
    require(is_finite_real(cap) and 0 <= cap < 3.4e38, f"final_softcap must be a finite number >= 0, got {quoted(cap)}")
    if not cfg.gemma4_layer:
        require(not (any(getattr(cfg, f) for f in _FIELDS) or cfg.k_eq_v or cfg.double_wide_mlp or cap),
                f"{', '.join(_FIELDS)}, k_eq_v, double_wide_mlp and final_softcap need gemma4_layer")
        return
    require(cfg.post_norms and cfg.qk_norm and not cfg.norm_plus_one and not cfg.qkv_bias and not cfg.layer_types,
            "gemma4_layer needs post_norms and qk_norm, and takes neither norm_plus_one, qkv_bias nor layer_types")
    gh, gkv = global_dims(cfg)
    require(gh % 2 == 0 and cfg.n_heads % gkv == 0,
            f"global_head_dim ({gh}) must be even and n_heads ({cfg.n_heads}) a multiple of global_n_kv_heads ({gkv})")
    require(cfg.global_rope_dim <= gh and cfg.global_rope_dim % 2 == 0,
            f"global_rope_dim must be even and at most global_head_dim ({gh}), got {cfg.global_rope_dim}")
    require(cfg.rope_scaling is None or type(cfg.rope_scaling).__name__ == "LinearScaling",
            "Gemma 4's proportional RoPE takes a linear scaling or none")
    require((cfg.ple_dim == 0) == (cfg.ple_vocab == 0), "ple_dim and ple_vocab must be both set or both 0")
    n, shared = cfg.n_layers, cfg.kv_shared_layers
    require(shared < n, f"kv_shared_layers must be below n_layers ({n}), got {shared}")
    for layer in range(n - shared, n):
        require(kv_source(cfg, layer) >= 0, f"layer {layer} shares the K/V of an earlier layer of its kind, and "
                                            f"none of layers 0..{n - shared - 1} is one")
    require(not cfg.double_wide_mlp or shared, "double_wide_mlp needs kv_shared_layers")
    if cfg.n_experts:
        require(cfg.moe_every in (0, 1) and not cfg.mlp_only_layers and not cfg.shared_expert_ffn_dim
                and cfg.routing == "softmax_topk" and cfg.norm_topk_prob,
                "Gemma 4's experts run on every layer, routed softmax_topk with norm_topk_prob, without a "
                "shared expert")


def is_global(cfg, layer: int) -> bool:
    """Whether layer `layer` attends every position (else its window)."""
    return cfg.window(layer) == 0


def global_dims(cfg) -> tuple[int, int]:
    """(head_dim, kv heads) of the global layers."""
    return cfg.global_head_dim or cfg.head_dim, cfg.global_n_kv_heads or cfg.n_kv_heads


def layer_dims(cfg, layer: int) -> tuple[int, int]:
    """(head_dim, kv heads) of layer `layer`'s attention."""
    if cfg.gemma4_layer and is_global(cfg, layer):
        return global_dims(cfg)
    return cfg.head_dim, cfg.n_kv_heads


def cache_dims(cfg) -> tuple[int, int]:
    """(kv heads, head_dim) of a KV cache holding every layer's: the larger of the two kinds' each."""
    gh, gkv = global_dims(cfg) if cfg.gemma4_layer else (cfg.head_dim, cfg.n_kv_heads)
    return max(cfg.n_kv_heads, gkv), max(cfg.head_dim, gh)


def kv_source(cfg, layer: int) -> int:
    """The layer whose cache layer `layer` reads: itself, or for a shared layer the last layer of its
    kind before the shared ones (-1: none)."""
    first = cfg.n_layers - cfg.kv_shared_layers
    if layer < first:
        return layer
    return next((i for i in range(first - 1, -1, -1) if is_global(cfg, i) == is_global(cfg, layer)), -1)


def shared_unread(cfg, name: str) -> bool:
    """Whether tensor `name` is one a Gemma 4 layer sharing K/V holds in its files and does not read."""
    if not (cfg.kv_shared_layers and name.startswith("model.layers.")):
        return False
    layer, _, suffix = name[len("model.layers."):].partition(".")
    return layer.isdigit() and suffix in SHARED_UNREAD and int(layer) < cfg.n_layers \
        and kv_source(cfg, int(layer)) != int(layer)


def values_are_keys(cfg, layer: int) -> bool:
    """Whether layer `layer`'s v is its k projection's output (k_eq_v on a global layer)."""
    return cfg.k_eq_v and is_global(cfg, layer)


def ffn_width(cfg, layer: int) -> int:
    """The dense GLU's width of layer `layer`: twice ffn_dim on a shared layer with double_wide_mlp."""
    return 2 * cfg.ffn_dim if cfg.double_wide_mlp and kv_source(cfg, layer) != layer else cfg.ffn_dim


def inv_freq_exponents(cfg, layer: int) -> tuple[int, int] | None:
    """(pairs turning, head_dim dividing their exponents) of a Gemma 4 global layer's proportional
    RoPE: pair i's frequency theta^(-2i / head_dim) for i below the first, 0 past it; None for any
    other layer (its RoPE is the config's usual one)."""
    if not (cfg.gemma4_layer and is_global(cfg, layer)):
        return None
    gh = global_dims(cfg)[0]
    return (cfg.global_rope_dim or gh) // 2, gh


# Whether libarc's Gemma 4 layers and its wide-head attention have passed their GPU tests
# (tests/test_gpu_gemma4.py, tests/test_gpu_gemma4_moe.py, tests/test_gpu_attention_wide.py): until they have, the CUDA backend
# refuses every Gemma 4 model, and the GPU tests set this to run them.
CUDA_LAYER_CHECKED = False


def cuda_refusal(cfg) -> str:
    """Why the CUDA backend cannot run this Gemma 4 config (one line), or "" where it can."""
    if CUDA_LAYER_CHECKED:
        return ""
    return ("Gemma 4 runs on the numpy backend only so far (libarc's kernels for its layer await their GPU "
            "tests): use --backend numpy")


def native_base(cfg):
    """The Gemma 3 layer under a Gemma 4 config: dense, every layer of the sliding layers' dims, no
    Gemma 4 field (native_fields gives libarc's, the experts among them)."""
    return dataclasses.replace(cfg, gemma4_layer=False, global_head_dim=0, global_n_kv_heads=0, global_rope_dim=0,
                               k_eq_v=False, final_softcap=0.0, ple_dim=0, ple_vocab=0, kv_shared_layers=0,
                               double_wide_mlp=False, n_experts=0, n_experts_used=0, expert_ffn_dim=0)


def native_fields(cfg) -> dict:
    """arc_model_config's Gemma 4 fields of cfg: the global layers' dims, v norms, layer scalars, the
    logits' cap, in a mixture of experts the experts beside the dense FFN (softmax over every
    expert, the top k renormalized, whatever the config's routing fields say), the per-layer
    embeddings, the layers sharing K/V and their FFN's width."""
    gh, gkv = global_dims(cfg)
    fields = dict(global_head_dim=gh, global_n_kv_heads=gkv, v_norm=1, layer_scalar=1,
                  final_softcap=float(cfg.final_softcap))
    if cfg.n_experts:
        fields.update(n_experts=cfg.n_experts, n_experts_used=cfg.n_experts_used, expert_ffn_dim=cfg.expert_ffn_dim,
                      experts_beside=1, routing=ROUTINGS.index("softmax_topk"), norm_topk=1)
    fields.update(ple_dim=cfg.ple_dim, ple_vocab=cfg.ple_vocab, kv_shared_layers=cfg.kv_shared_layers,
                  double_wide_ffn=int(cfg.double_wide_mlp))
    return fields


def shares_values(cfg, name: str) -> bool:
    """Whether tensor `name` is the k_proj of a layer whose v is its k's (uploaded as libarc's WV too)."""
    if not (cfg.k_eq_v and name.startswith("model.layers.") and name.endswith(".self_attn.k_proj.weight")):
        return False
    layer = name[len("model.layers."):].partition(".")[0]
    return layer.isdigit() and values_are_keys(cfg, int(layer))


def tensors(cfg, base):
    """A Gemma 4 config's tensors, (name, shape) in a fixed order, from `base`: libarc's table under
    the Hugging Face names (arcpy.model.native.iter_tensors), less the v_proj of a layer whose v is
    its k's, which its files do not hold (libarc is given its k_proj as WV)."""
    for name, shape in base:
        if name.endswith(".self_attn.v_proj.weight") and name.startswith("model.layers."):
            if values_are_keys(cfg, int(name.split(".")[2])):
                continue
        yield name, shape


def row_tables(cfg) -> tuple[str, ...]:
    """The tables a token reads one row of (besides the embedding): the per-layer embeddings'."""
    return (PLE_EMBED,) if cfg.ple_dim else ()


def embed_scales(cfg) -> tuple[float, float, float]:
    """(the per-layer embedding rows' factor, the projection's, the sum's): sqrt(ple_dim), dim^-1/2, 2^-1/2."""
    return math.sqrt(cfg.ple_dim), cfg.dim ** -0.5, 2 ** -0.5
