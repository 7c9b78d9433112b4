"""libarc's tensor table and layer program, answered in Python where this install has no libarc.so
(built with ARC_CUDA_ARCHS=none): the NumPy backend then still describes and runs models.

The tables are libarc's (arc_tensor_shape in libarc/model/forward/layer.cu over model.cu's table_shape,
arc_layer_program over layer_program); this is their reading for a CPU-only install, nothing more:
tests/test_table.py requires the same answers, and the same errors word for word, as libarc's over
every preset and a spread of configs, wherever libarc.so is built. `c` below is a config's
arc_model_config fields by name (native.config_values).
"""

from __future__ import annotations

from arcpy.codes import (OP_ATTEND, OP_ATTN_GATE, OP_ATTN_IN, OP_ATTN_OUT, OP_ATTN_OUT_NORM, OP_DN_IN, OP_DN_OUT,
                         OP_DN_STEP, OP_EXPERTS_BESIDE, OP_FFN_IN, OP_FFN_OUT, OP_FFN_OUT_NORM, OP_LAYER_SCALAR,
                         OP_MOE_IN, OP_MOE_OUT, OP_PER_LAYER_INPUT, OP_QK_NORM)
from arcpy.errors import InvalidArgumentError

# arc.h's arc_tensor, by id.
TENSORS = ("EMBED", "ATTN_NORM", "WQ", "WK", "WV", "BQ", "BK", "BV", "WO", "MLP_NORM", "W_GATE", "W_UP", "W_DOWN",
           "FINAL_NORM", "LM_HEAD", "ROPE_INV_FREQ", "Q_NORM", "K_NORM", "POST_ATTN_NORM", "POST_FFN_NORM",
           "MOE_ROUTER", "MOE_GATE", "MOE_UP", "MOE_DOWN", "SHARED_GATE", "SHARED_UP", "SHARED_DOWN",
           "SHARED_ROUTER", "WQ_GATE", "DN_QKV", "DN_Z", "DN_B", "DN_A", "DN_CONV", "DN_A_LOG", "DN_DT_BIAS",
           "DN_NORM", "DN_OUT", "SINKS", "BO", "MOE_ROUTER_BIAS", "MOE_GATE_BIAS", "MOE_UP_BIAS", "MOE_DOWN_BIAS",
           "LAYER_SCALAR", "MOE_NORM", "FFN_OUT_NORM", "MOE_OUT_NORM", "ROUTER_SCALE", "EXPERT_SCALE", "PLE_EMBED",
           "PLE_PROJECTION", "PLE_NORM", "PLE_GATE", "PLE_OUT", "PLE_POST_NORM")
# The tensors of the experts beside a dense FFN (Gemma 4: experts_beside).
_BESIDE = ("MOE_NORM", "FFN_OUT_NORM", "MOE_OUT_NORM", "ROUTER_SCALE", "EXPERT_SCALE")
# The attention's tensors, which a DeltaNet layer has none of.
_ATTENTION = ("WQ", "WK", "WV", "BQ", "BK", "BV", "WO", "Q_NORM", "K_NORM", "ROPE_INV_FREQ", "WQ_GATE", "SINKS", "BO")
_GLOBAL = ("EMBED", "FINAL_NORM", "LM_HEAD", "PLE_EMBED", "PLE_PROJECTION", "PLE_NORM")
ROUTE_SOFTMAX_TOPK, ROUTE_TOPK_SOFTMAX = 0, 1


def _require(ok: bool, who: str, message: str) -> None:
    if not ok:  # as libarc's ARC_REQUIRE reads through _lib.check
        raise InvalidArgumentError(f"invalid argument: {who}: {message}")


def _check_moe(c: dict, who: str) -> None:
    _require(c["n_experts"] >= 0, who, f"config.n_experts must not be negative, got {c['n_experts']}")
    _require(c["experts_beside"] in (0, 1), who, f"config.experts_beside must be 0 or 1, got {c['experts_beside']}")
    if c["n_experts"] == 0:
        return
    _require(1 <= c["n_experts_used"] <= c["n_experts"], who,
             f"config.n_experts_used must be in [1, n_experts {c['n_experts']}], got {c['n_experts_used']}")
    _require(c["expert_ffn_dim"] > 0, who, f"config.expert_ffn_dim must be positive, got {c['expert_ffn_dim']}")
    _require(c["routing"] in (ROUTE_SOFTMAX_TOPK, ROUTE_TOPK_SOFTMAX), who,
             f"config.routing must be an arc_routing (0 or 1), got {c['routing']}")
    _require(c["norm_topk"] in (0, 1), who, f"config.norm_topk must be 0 or 1, got {c['norm_topk']}")
    _require(c["shared_ffn_dim"] >= 0 and c["moe_every"] >= 0, who,
             "config.shared_ffn_dim and moe_every must not be negative, got "
             f"{c['shared_ffn_dim']} and {c['moe_every']}")
    _require(not c["post_norms"] or c["experts_beside"], who,
             "config: post_norms and mixture-of-experts layers do not combine")
    _require(not c["experts_beside"] or (c["post_norms"] and c["routing"] == ROUTE_SOFTMAX_TOPK and c["norm_topk"]
                                         and c["shared_ffn_dim"] == 0 and not c["expert_bias"]), who,
             "config: experts_beside takes post_norms, SOFTMAX_TOPK routing with norm_topk, no shared expert and "
             "no expert_bias")
    _require(c["expert_bias"] in (0, 1), who, f"config.expert_bias must be 0 or 1, got {c['expert_bias']}")
    _require(not (c["expert_bias"] and c["shared_ffn_dim"]), who, "config: expert_bias and a shared expert do not combine")


def _check_dn(c: dict, who: str) -> None:
    _require(c["attn_gate"] in (0, 1), who, f"config.attn_gate must be 0 or 1, got {c['attn_gate']}")
    _require(all(c[f] >= 0 for f in ("dn_k_heads", "dn_v_heads", "dn_head_dim", "dn_conv_kernel")), who,
             "config: dn_k_heads, dn_v_heads, dn_head_dim and dn_conv_kernel must not be negative")
    if not any(c["dn_layers"]):
        return
    for layer in range(c["n_layers"], 128):
        _require(not _layer_dn(c, layer), who,
                 f"config.dn_layers names layer {layer} of a model of {c['n_layers']} layers")
    _require(c["dn_k_heads"] > 0 and c["dn_v_heads"] > 0 and c["dn_head_dim"] > 0, who,
             "config: a DeltaNet layer needs dn_k_heads, dn_v_heads and dn_head_dim > 0")
    _require(c["dn_v_heads"] % c["dn_k_heads"] == 0, who,
             f"config.dn_v_heads ({c['dn_v_heads']}) must be a multiple of dn_k_heads ({c['dn_k_heads']})")
    _require(c["dn_conv_kernel"] >= 2, who, f"config.dn_conv_kernel must be 2 or more, got {c['dn_conv_kernel']}")
    _require(not c["post_norms"], who, "config: post_norms and DeltaNet layers do not combine")


def _check_gemma4(c: dict, who: str) -> None:
    _require(c["global_head_dim"] >= 0 and c["global_n_kv_heads"] >= 0, who,
             "config.global_head_dim and global_n_kv_heads must not be negative, got "
             f"{c['global_head_dim']} and {c['global_n_kv_heads']}")
    _require(c["v_norm"] in (0, 1) and c["layer_scalar"] in (0, 1), who,
             f"config.v_norm and layer_scalar must be 0 or 1, got {c['v_norm']} and {c['layer_scalar']}")
    cap = c["final_softcap"]
    _require(0.0 <= cap < 3.4e38, who, f"config.final_softcap must be a finite number >= 0, got {cap:g}")
    gh = c["global_head_dim"] or c["head_dim"]
    _require(gh % 2 == 0 and c["rope_dim"] <= min(gh, c["head_dim"]), who,
             f"config.global_head_dim must be even and rope_dim ({c['rope_dim']}) at most every layer's head_dim, "
             f"got {gh}")
    gkv = c["global_n_kv_heads"] or c["n_kv_heads"]
    _require(c["n_heads"] % gkv == 0, who,
             f"config.n_heads ({c['n_heads']}) must be a multiple of global_n_kv_heads ({gkv})")
    _require(c["ple_dim"] >= 0 and c["ple_vocab"] >= 0 and (c["ple_dim"] == 0) == (c["ple_vocab"] == 0), who,
             f"config.ple_dim and ple_vocab must be both positive or both 0, got {c['ple_dim']} and {c['ple_vocab']}")
    shared = c["kv_shared_layers"]
    _require(0 <= shared < c["n_layers"], who,
             f"config.kv_shared_layers must be in [0, n_layers {c['n_layers']}), got {shared}")
    for layer in range(c["n_layers"] - shared, c["n_layers"]):
        _require(_kv_source(c, layer) >= 0, who,
                 f"config: shared layer {layer} has no earlier layer of its kind to read the K/V of")
    _require(c["double_wide_ffn"] == 0 or (c["double_wide_ffn"] == 1 and shared > 0), who,
             f"config.double_wide_ffn must be 0, or 1 with kv_shared_layers, got {c['double_wide_ffn']}")


def _layer_global(c: dict, layer: int) -> bool:
    """A layer that attends every position (libarc's layer_global)."""
    n = c["window_pattern"]
    return c["sliding_window"] <= 0 or (n > 0 and layer % n == n - 1)


def _kv_source(c: dict, layer: int) -> int:
    """The layer whose cache layer `layer` attends (libarc's layer_kv_source; -1: none)."""
    first = c["n_layers"] - c["kv_shared_layers"]
    if layer < first:
        return layer
    return next((i for i in range(first - 1, -1, -1) if _layer_global(c, i) == _layer_global(c, layer)), -1)


def _layer_ffn(c: dict, layer: int) -> int:
    """The FFN's width of layer `layer` (libarc's layer_ffn)."""
    return 2 * c["ffn_dim"] if c["double_wide_ffn"] and _kv_source(c, layer) != layer else c["ffn_dim"]


def _layer_dims(c: dict, layer: int) -> tuple[int, int]:
    """(head_dim, kv heads) of layer `layer`'s attention (libarc's layer_dims)."""
    if _layer_global(c, layer):
        return c["global_head_dim"] or c["head_dim"], c["global_n_kv_heads"] or c["n_kv_heads"]
    return c["head_dim"], c["n_kv_heads"]


def _layer_dn(c: dict, layer: int) -> bool:
    return 0 <= layer < 128 and bool((c["dn_layers"][layer // 32] >> (layer % 32)) & 1)


def _layer_moe(c: dict, layer: int) -> bool:
    if c["n_experts"] <= 0:
        return False
    every = c["moe_every"] if c["moe_every"] > 0 else 1
    if (layer + 1) % every != 0:
        return False
    return not (layer < 128 and (c["dense_layers"][layer // 32] >> (layer % 32)) & 1)


def layer_program(c: dict, layer: int) -> list[int]:
    """arc_layer_program: the ops layer `layer` runs, in order."""
    who = "arc_layer_program"
    _require(c["qk_norm"] in (0, 1), who, f"config.qk_norm must be 0 or 1, got {c['qk_norm']}")
    _require(c["post_norms"] in (0, 1), who, f"config.post_norms must be 0 or 1, got {c['post_norms']}")
    _require(0 <= layer < c["n_layers"], who, f"layer must be in [0, {c['n_layers']}), got {layer}")
    _check_moe(c, who)
    _check_dn(c, who)
    _check_gemma4(c, who)
    if _layer_dn(c, layer):
        ops = [OP_DN_IN, OP_DN_STEP, OP_DN_OUT]
    else:
        ops = [OP_ATTN_IN] + ([OP_QK_NORM] if c["qk_norm"] else []) + [OP_ATTEND]
        ops += ([OP_ATTN_GATE] if c["attn_gate"] else []) + [OP_ATTN_OUT_NORM if c["post_norms"] else OP_ATTN_OUT]
    moe = _layer_moe(c, layer)
    if moe and not c["experts_beside"]:
        return ops + [OP_MOE_IN, OP_MOE_OUT]
    out = OP_EXPERTS_BESIDE if moe else OP_FFN_OUT_NORM if c["post_norms"] else OP_FFN_OUT
    return ops + [OP_FFN_IN, out] + ([OP_PER_LAYER_INPUT] if c["ple_dim"] else []) + \
        ([OP_LAYER_SCALAR] if c["layer_scalar"] else [])


def _moe_shape(c: dict, t: str, layer: int) -> tuple[int, int]:
    dim, experts, ffn, shared = c["dim"], c["n_experts"], c["expert_ffn_dim"], c["shared_ffn_dim"]
    r, k = {"MOE_ROUTER": (experts, dim), "MOE_GATE": (experts * ffn, dim), "MOE_UP": (experts * ffn, dim),
            "MOE_DOWN": (experts * dim, ffn), "SHARED_GATE": (shared, dim), "SHARED_UP": (shared, dim),
            "SHARED_DOWN": (dim if shared else 0, shared), "SHARED_ROUTER": (1 if shared else 0, dim),
            # gpt-oss's biases: vectors (rows 1) with expert_bias
            "MOE_ROUTER_BIAS": (1 if c["expert_bias"] else 0, experts),
            "MOE_GATE_BIAS": (1 if c["expert_bias"] else 0, experts * ffn),
            "MOE_UP_BIAS": (1 if c["expert_bias"] else 0, experts * ffn),
            "MOE_DOWN_BIAS": (1 if c["expert_bias"] else 0, experts * dim),
            # Gemma 4's experts beside the dense FFN: vectors (rows 1) with experts_beside
            **{name: (1 if c["experts_beside"] else 0, dim) for name in _BESIDE[:4]},
            "EXPERT_SCALE": (1 if c["experts_beside"] else 0, experts)}[t]
    return (r if _layer_moe(c, layer) else 0), k


def _dn_shape(c: dict, t: str, layer: int) -> tuple[int, int]:
    hd, nv = c["dn_head_dim"], c["dn_v_heads"]
    k, v = c["dn_k_heads"] * hd, nv * hd
    r, n = {"DN_QKV": (2 * k + v, c["dim"]), "DN_Z": (v, c["dim"]), "DN_B": (nv, c["dim"]), "DN_A": (nv, c["dim"]),
            "DN_CONV": (2 * k + v, c["dn_conv_kernel"]), "DN_A_LOG": (1, nv), "DN_DT_BIAS": (1, nv),
            "DN_NORM": (1, hd), "DN_OUT": (c["dim"], v)}[t]
    return (r if _layer_dn(c, layer) else 0), n


def _shape(c: dict, t: str, layer: int) -> tuple[int, int]:
    if t.startswith("DN_"):
        return _dn_shape(c, t, layer)
    if t.startswith(("MOE_", "SHARED_")) or t in _BESIDE:
        return _moe_shape(c, t, layer)
    dim, vocab, ple, layers = c["dim"], c["vocab"], c["ple_dim"], c["n_layers"]
    ffn = _layer_ffn(c, layer if t not in _GLOBAL else 0)
    shared = t not in _GLOBAL and _kv_source(c, layer) != layer  # no k or v of its own
    moe = t not in _GLOBAL and _layer_moe(c, layer) and not c["experts_beside"]  # no dense FFN
    hd, n_kv = _layer_dims(c, layer if t not in _GLOBAL else 0)
    q, kv = c["n_heads"] * hd, n_kv * hd
    rope = c["rope_dim"] or hd
    r, k, present = {
        "EMBED": (vocab, dim, True), "LM_HEAD": (vocab, dim, not c["tied_embeddings"]), "WQ": (q, dim, True),
        "WK": (kv, dim, not shared), "WV": (kv, dim, not shared), "BQ": (1, q, c["qkv_bias"]),
        "BK": (1, kv, c["qkv_bias"] and not shared), "BV": (1, kv, c["qkv_bias"] and not shared),
        "WO": (dim, q, True), "W_GATE": (ffn, dim, not moe),
        "W_UP": (ffn, dim, not moe), "W_DOWN": (dim, ffn, not moe), "ROPE_INV_FREQ": (1, rope // 2, True),
        "Q_NORM": (1, hd, c["qk_norm"]), "K_NORM": (1, hd, c["qk_norm"] and not shared),
        "POST_ATTN_NORM": (1, dim, c["post_norms"]), "POST_FFN_NORM": (1, dim, c["post_norms"]),
        "WQ_GATE": (q, dim, c["attn_gate"]), "SINKS": (1, c["n_heads"], c["attn_sinks"]), "BO": (1, dim, c["o_bias"]),
        "LAYER_SCALAR": (1, 1, c["layer_scalar"]),
        "PLE_EMBED": (c["ple_vocab"], layers * ple, ple > 0), "PLE_PROJECTION": (layers * ple, dim, ple > 0),
        "PLE_NORM": (1, ple, ple > 0), "PLE_GATE": (ple, dim, ple > 0), "PLE_OUT": (dim, ple, ple > 0),
        "PLE_POST_NORM": (1, dim, ple > 0),
    }.get(t, (1, dim, True))  # ATTN_NORM, MLP_NORM, FINAL_NORM: (dim)
    if t in _ATTENTION and _layer_dn(c, layer):
        present = False
    return (r if present else 0), k


def tensor_shape(c: dict, tensor: str, layer: int) -> tuple[int, int]:
    """arc_tensor_shape: (rows, cols) of tensor `tensor` (its arc.h name, ARC_TENSOR_...) of layer
    `layer`; rows 0 where the config has no such tensor there."""
    who = "arc_tensor_shape"
    t = tensor.removeprefix("ARC_TENSOR_")
    _require(all(c[f] > 0 for f in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab")),
             who, "config: dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim and vocab must be positive")
    _require(c["rope_dim"] >= 0 and c["rope_dim"] % 2 == 0 and c["rope_dim"] <= c["head_dim"], who,
             f"config.rope_dim must be even and in [0, head_dim {c['head_dim']}] (0: head_dim), got {c['rope_dim']}")
    _check_moe(c, who)
    _check_dn(c, who)
    _check_gemma4(c, who)
    if t in _GLOBAL:
        _require(layer == 0, who, f"ARC_TENSOR_{t} is a global tensor: layer must be 0, got {layer}")
    else:
        _require(0 <= layer < c["n_layers"], who, f"ARC_TENSOR_{t} is a per-layer tensor: layer must be in "
                                                  f"[0, {c['n_layers']}), got {layer}")
    return _shape(c, t, layer)
