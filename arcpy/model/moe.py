"""Mixture-of-experts layers: the routing rule (libarc/arc.h's arc_routing, which every backend
follows) and the bytes of weights a token reads from them.

The routing of a token whose router logits are p (n_experts,) float32:
- "softmax_topk" (Qwen3-MoE, and Mixtral as transformers and llama.cpp compute it): q = softmax(p);
  the k largest q; their weights are those q, divided by their sum with norm_topk_prob.
- "topk_softmax" (Mixtral as its reference code states it): the k largest p; their weights are the
  softmax of those k logits. In exact arithmetic the same as softmax_topk with the sum divided out.
Ties: among equal values the lower expert index comes first (a stable sort of the values, largest
first). torch.topk leaves the order of ties unspecified, so a reference that must agree with the
device's kernels bit for bit fixes this rule rather than borrowing one.
"""

from __future__ import annotations

import math

import numpy as np

from arcpy.model.bf16 import bf16_to_f32

F32 = np.float32


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, float32, the maximum subtracted first."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(F32, copy=False)


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """(T, n) -> (T, k) indices of the k largest values of each row, largest first, ties to the
    lower index."""
    return np.argsort(-values, axis=-1, kind="stable")[..., :k]


def route(logits: np.ndarray, k: int, routing: str, norm_topk_prob: bool) -> tuple[np.ndarray, np.ndarray]:
    """Router logits (T, n_experts) float32 -> (experts (T, k) int64, weights (T, k) float32)."""
    logits = np.asarray(logits, dtype=F32)
    if routing == "topk_softmax":
        chosen = top_k(logits, k)
        return chosen, softmax(np.take_along_axis(logits, chosen, axis=-1))
    probs = softmax(logits)
    chosen = top_k(probs, k)
    weights = np.take_along_axis(probs, chosen, axis=-1)
    if norm_topk_prob:
        weights = (weights / weights.sum(axis=-1, keepdims=True)).astype(F32, copy=False)
    return chosen, weights


# The routed experts' tensors (a token reads only its k experts' share of each): their matrices, and
# gpt-oss's biases.
EXPERT_SUFFIXES = ("mlp.experts.gate_proj.weight", "mlp.experts.up_proj.weight", "mlp.experts.down_proj.weight",
                   "mlp.experts.gate_proj.bias", "mlp.experts.up_proj.bias", "mlp.experts.down_proj.bias")


def expert_bytes(model) -> int:
    """Bytes of every layer's routed experts as the model holds them (each expert's share equal)."""
    return sum(t.nbytes for name, t in model.tensors.items() if name.endswith(EXPERT_SUFFIXES))


def distinct_experts(chosen: np.ndarray) -> int:
    """Experts a step reads for one layer: the distinct ids among its rows' choices (T, k)."""
    return len(np.unique(chosen))


def active_bytes(model, experts_read: float) -> int:
    """Bytes of weights a step streams when it reads `experts_read` experts of every MoE layer
    (on average): Model.weight_bytes with the routed experts counted at that share."""
    cfg = model.config
    dense = model.full_weight_bytes - expert_bytes(model)
    return dense + int(round(expert_bytes(model) * experts_read / cfg.n_experts))


def step_bytes(model, rows: int = 1, steps: int = 64, seed: int = 0) -> tuple[int, int]:
    """(average, worst case) bytes of weights a step of `rows` tokens (1: the decode; k + 1: a
    speculative verify) streams, counting only the experts it reads. The average routes `steps`
    steps of random rows (unit normal, as a normed residual stream is) by the model's own router
    weights (random in a preset), every MoE layer; the worst case reads min(n_experts, rows * k)
    experts of every layer. A dense model gives its weight_bytes twice."""
    cfg = model.config
    if cfg.n_experts == 0:
        return model.weight_bytes, model.weight_bytes
    k, worst = cfg.n_experts_used, min(cfg.n_experts, rows * cfg.n_experts_used)
    if rows == 1:  # one token reads exactly its k experts, whatever the routing
        return active_bytes(model, k), active_bytes(model, k)
    rng = np.random.default_rng(seed)
    layers = [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]
    routers = [bf16_to_f32(model.tensors[f"model.layers.{i}.mlp.gate.weight"]) for i in layers]
    biases = [bf16_to_f32(model.tensors[f"model.layers.{i}.mlp.gate.bias"]) if cfg.expert_bias else F32(0)
              for i in layers]  # gpt-oss's routers have biases
    reads = []
    for _ in range(steps):
        x = rng.standard_normal((rows, cfg.dim), dtype=F32)
        reads.append(np.mean([distinct_experts(route(x @ w.T + b, k, cfg.routing, cfg.norm_topk_prob)[0])
                              for w, b in zip(routers, biases)]))
    return active_bytes(model, float(np.mean(reads))), active_bytes(model, worst)


def expected_distinct(n_experts: int, picks: int, rows: int) -> float:
    """Distinct experts `rows` independent uniform choices of `picks` distinct experts each touch,
    on average: n (1 - (1 - picks / n)^rows). What step_bytes' average tends to when the router
    spreads tokens evenly (a check on it, and a figure where no weights exist)."""
    return n_experts * (1.0 - math.pow(1.0 - picks / n_experts, rows))
