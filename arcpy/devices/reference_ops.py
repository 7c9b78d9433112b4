"""The NumPy reference's arithmetic: its functions (norms, RoPE, attention, the GLUs, bf16
rounding) and _RowOps, the ops of the layer program over rows of one pass (reference.py states the
numerics both follow; ReferenceModel runs them)."""

from __future__ import annotations

import math

import numpy as np

from arcpy.codes import (
    OP_ATTEND,
    OP_ATTN_GATE,
    OP_ATTN_IN,
    OP_ATTN_OUT,
    OP_ATTN_OUT_NORM,
    OP_DN_IN,
    OP_DN_OUT,
    OP_DN_STEP,
    OP_FFN_IN,
    OP_FFN_OUT,
    OP_FFN_OUT_NORM,
    OP_MOE_IN,
    OP_MOE_OUT,
    OP_QK_NORM,
)
from arcpy.devices.reference_layer import Layer
from arcpy.model import bf16_to_f32, f32_to_bf16
from arcpy.model.moe import route

F32 = np.float32


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x (..., dim) f32, w (dim,) f32 -> (..., dim) f32: each row x * (1/sqrt(mean(x^2) + eps)) * w."""
    inv = F32(1.0) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True, dtype=F32) + F32(eps))
    return (x * inv * w).astype(F32, copy=False)


def gemv(W: np.ndarray, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """W (out, in) f32 @ x (in,) f32 [+ bias (out,)] -> (out,) f32."""
    y = W @ x
    return y + bias if bias is not None else y


def rope(x_heads: np.ndarray, pos, inv_freq: np.ndarray, factor: float = 1.0) -> np.ndarray:
    """x_heads (n, head_dim) f32 rotated for position `pos` -> new (n, head_dim) f32 array; or
    x_heads (T, n, head_dim) with pos (T,), row t rotated for position pos[t].

    Rotate-half pairing over the first 2 * len(inv_freq) elements: (x[i], x[i + half]) for i < half,
    angle pos * inv_freq[i], cos and sin each times `factor` (float32); the elements past them pass
    unrotated (partial rotary).
    """
    half = inv_freq.shape[-1]
    p = np.asarray(pos, dtype=F32)
    angle = (p[:, None, None] if p.ndim else p) * inv_freq.astype(F32, copy=False)
    cos, sin = np.cos(angle) * F32(factor), np.sin(angle) * F32(factor)
    x1, x2, rest = x_heads[..., :half], x_heads[..., half:2 * half], x_heads[..., 2 * half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos: int, n_kv_heads: int) -> np.ndarray:
    """One token's attention over cached positions 0..pos.

    q (n_heads, head_dim) f32; k_cache, v_cache (n_kv_heads, >pos, head_dim) f32 -> (n_heads, head_dim) f32.
    """
    n_heads, head_dim = q.shape
    group = n_heads // n_kv_heads
    # Query heads sharing a kv head are consecutive, so a reshape groups them without copying k/v.
    qg = q.reshape(n_kv_heads, group, head_dim)
    k = k_cache[:, : pos + 1]
    v = v_cache[:, : pos + 1]
    scores = np.matmul(qg, k.transpose(0, 2, 1)) * F32(1.0 / math.sqrt(head_dim))  # (kv, group, pos+1)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    return np.matmul(probs, v).reshape(n_heads, head_dim)


def causal_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, start: int,
                     n_kv_heads: int, round_probs: bool = False, scale: float | None = None,
                     window: int = 0, sinks: np.ndarray | None = None) -> np.ndarray:
    """The attention of T tokens at positions start..start+T-1, each over cached positions 0..its own.

    q (T, n_heads, head_dim) f32; k_cache, v_cache (n_kv_heads, >= start+T, head_dim) f32
    -> (T, n_heads, head_dim) f32. round_probs: the unnormalized probabilities are rounded to bf16
    for the product with v and the sum divided out after it, as libarc's prefill does. scale: the
    scores' factor (default 1/sqrt(head_dim)); window > 0: the query at p attends p - window + 1..p.
    """
    t, n_heads, head_dim = q.shape
    group, seen = n_heads // n_kv_heads, start + t
    qg = q.reshape(t, n_kv_heads, group, head_dim).transpose(1, 2, 0, 3)  # (kv, group, T, hd)
    k = k_cache[:, None, :seen]
    v = v_cache[:, None, :seen]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    scores = np.matmul(qg, k.transpose(0, 1, 3, 2)) * F32(scale)  # (kv, group, T, seen)
    future = np.arange(seen)[None, :] > (start + np.arange(t))[:, None]
    if window > 0:
        future |= np.arange(seen)[None, :] <= (start + np.arange(t))[:, None] - window
    scores = np.where(future, F32(-np.inf), scores)
    top = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        sink = sinks.astype(F32).reshape(n_kv_heads, group, 1, 1)
        top = np.maximum(top, sink)
    scores = np.exp(scores - top)
    total = scores.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(sink - top)
    if round_probs:
        out = np.matmul(round_bf16(scores), v) / total
    else:
        out = np.matmul(scores / total, v)
    return out.transpose(2, 0, 1, 3).reshape(t, n_heads, head_dim)


def linear(x: np.ndarray, W: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x (T, in) f32 @ W (out, in)^T [+ bias (out,)] -> (T, out) f32: gemv for every row."""
    y = x @ W.T
    return y + bias if bias is not None else y


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gate, up (ffn,) f32 -> silu(gate) * up (ffn,) f32."""
    with np.errstate(over="ignore"):  # exp(-g) overflows to inf for very negative g; g/inf -> 0 is right
        return gate / (F32(1.0) + np.exp(-gate)) * up


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gate, up f32 -> gelu_tanh(gate) * up f32: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))."""
    inner = F32(0.7978845608028654) * (gate + F32(0.044715) * gate * gate * gate)
    return F32(0.5) * gate * (F32(1.0) + np.tanh(inner)) * up


GLUS = {"silu": swiglu, "gelu_tanh": geglu}


def clamped_swiglu(gate: np.ndarray, up: np.ndarray, limit: float, alpha: float) -> np.ndarray:
    """gpt-oss's GLU: g = min(gate, limit), u = clamp(up, -limit, limit) -> g * sigmoid(alpha g) * (u + 1)."""
    g = np.minimum(gate, F32(limit))
    u = np.clip(up, F32(-limit), F32(limit))
    with np.errstate(over="ignore"):  # exp overflows to inf for very negative g; g/inf -> 0 is right
        return g / (F32(1.0) + np.exp(-F32(alpha) * g)) * (u + F32(1.0))


def embedding(table: np.ndarray, token: int) -> np.ndarray:
    """table (vocab, dim) f32, token id -> a copy of row `token` (dim,) f32."""
    return table[token].copy()


def argmax(logits: np.ndarray) -> int:
    """Index of the largest logit; ties go to the lowest index (as the device sampler)."""
    return int(np.argmax(logits))


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values -> the nearest bf16 values (ties to even), as float32: what the KV cache holds."""
    return bf16_to_f32(f32_to_bf16(x))


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _exact(a: np.ndarray) -> np.ndarray:
    return a


class _RowOps:
    """The reference's form of each op of the layer program (arc.h: arc_layer_op), over T rows at
    positions start..start+T-1: one row for the decode and the verify, a chunk for the prefill."""

    def __init__(self, m, tokens: list[int], start: int, r):  # m: a ReferenceModel
        self.m, self.cfg, self.start, self.r, self.t = m, m.config, start, r, len(tokens)
        self.positions = start + np.arange(self.t)
        self.x = m.embed[tokens] * F32(m.config.embed_scale)  # (T, dim), a copy
        self.run = self._dispatch()

    def _dispatch(self):
        table = {OP_ATTN_IN: self.attn_in, OP_QK_NORM: self.qk_norm, OP_ATTEND: self.attend,
                 OP_ATTN_OUT: self.attn_out, OP_FFN_IN: self.ffn_in, OP_FFN_OUT: self.ffn_out,
                 OP_ATTN_OUT_NORM: self.attn_out_norm, OP_FFN_OUT_NORM: self.ffn_out_norm,
                 OP_MOE_IN: self.moe_in, OP_MOE_OUT: self.moe_out, OP_ATTN_GATE: self.attn_gate,
                 OP_DN_IN: self.dn_in, OP_DN_STEP: self.dn_step, OP_DN_OUT: self.dn_out}

        def run(op: int, li: int, L: Layer) -> None:
            table[op](li, L)
        return run

    def attn_in(self, li: int, L: Layer) -> None:
        h = self.r(rmsnorm(self.x, L.attn_norm, self.cfg.rms_eps))
        c, t, hd = self.cfg, self.t, self.cfg.head_dim
        self.q = linear(h, L.wq, L.bq).reshape(t, c.n_heads, hd)
        self.k = linear(h, L.wk, L.bk).reshape(t, c.n_kv_heads, hd)
        self.v = linear(h, L.wv, L.bv).reshape(t, c.n_kv_heads, hd)
        if c.attn_output_gate:
            self.gate = linear(h, L.w_attn_gate)

    def dn_in(self, li: int, L: Layer) -> None:
        """A gated DeltaNet layer (arcpy.model.hybrid): its projections of the normed rows."""
        self.projected = L.deltanet.project(self.r(rmsnorm(self.x, L.attn_norm, self.cfg.rms_eps)))

    def dn_step(self, li: int, L: Layer) -> None:
        """The rows one after another through the layer's recurrent state -> att."""
        self.att = self.r(L.deltanet.step_rows(self.projected, self.m.deltanet_state[li], self.positions))

    def dn_out(self, li: int, L: Layer) -> None:
        self.x = self.x + linear(self.att, L.deltanet.w_out)

    def attn_gate(self, li: int, L: Layer) -> None:
        att = self.att.reshape(self.t, -1)
        self.att = self.r(att * (F32(1.0) / (F32(1.0) + np.exp(-self.gate))))

    def qk_norm(self, li: int, L: Layer) -> None:
        self.q = rmsnorm(self.q, L.q_norm, self.cfg.rms_eps)
        self.k = rmsnorm(self.k, L.k_norm, self.cfg.rms_eps)

    def attend(self, li: int, L: Layer) -> None:
        """RoPE, the cache's rows, the attention (with gpt-oss's sinks where the layer has them)."""
        c, m, start, t = self.cfg, self.m, self.start, self.t
        factor = c.rope_attention_factor
        q = self.r(rope(self.q, self.positions, L.inv_freq, factor))
        k = rope(self.k, self.positions, L.inv_freq, factor)
        m.k_cache[li, :, start:start + t] = m.kv_round(k).transpose(1, 0, 2)
        m.v_cache[li, :, start:start + t] = m.kv_round(self.v).transpose(1, 0, 2)
        rounded = self.r is not _exact
        self.att = self.r(causal_attention(q, m.k_cache[li], m.v_cache[li], start, c.n_kv_heads, rounded,
                                           c.scores_scale, c.window(li), L.sinks))

    def attn_out(self, li: int, L: Layer) -> None:
        self.x = self.x + linear(self.att.reshape(self.t, -1), L.wo, L.bo)

    def glu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """The model's GLU: gpt-oss's clamped one where swiglu_limit is set (libarc's
        ARC_ACT_SWIGLU_LIMIT), else its activation's."""
        c = self.cfg
        if c.swiglu_limit:
            return clamped_swiglu(gate, up, c.swiglu_limit, c.swiglu_alpha)
        return GLUS[c.activation](gate, up)

    def ffn_in(self, li: int, L: Layer) -> None:
        h = self.r(rmsnorm(self.x, L.mlp_norm, self.cfg.rms_eps))
        self.h = self.r(self.glu(linear(h, L.w_gate), linear(h, L.w_up)))

    def ffn_out(self, li: int, L: Layer) -> None:
        self.x = self.x + linear(self.h, L.w_down)

    def moe_in(self, li: int, L: Layer) -> None:
        """The router and the chosen experts' GLU, with gpt-oss's router and expert biases where the
        layer has them (L.expert_bias gives None elsewhere)."""
        c = self.cfg
        n = self.r(rmsnorm(self.x, L.mlp_norm, c.rms_eps))
        logits = linear(n, L.router, L.expert_bias("router"))
        self.chosen, self.weights = route(logits, c.n_experts_used, c.routing, c.norm_topk_prob)
        self.record_routing(li, logits)
        h = np.empty(self.chosen.shape + (c.expert_ffn_dim,), F32)  # (T, k, expert_ffn_dim)
        for e, rows, slots in self._by_expert():  # the rows routed to each expert, together
            h[rows, slots] = self.glu(linear(n[rows], L.e_gate[e], L.expert_bias("gate", e)),
                                      linear(n[rows], L.e_up[e], L.expert_bias("up", e)))
        self.h = self.r(h)
        if c.shared_expert_ffn_dim:
            self.shared_h = self.r(self.glu(linear(n, L.s_gate), linear(n, L.s_up)))
            self.shared_w = F32(1.0) / (F32(1.0) + np.exp(-linear(n, L.s_router)))  # (T, 1)

    def record_routing(self, li: int, logits: np.ndarray) -> None:
        """Layer li's choices (self.chosen), and the smallest lead of the k-th router logit over the
        next among its rows (inf where every expert is chosen)."""
        self.m.routing[li] = self.chosen
        ranked = -np.sort(-logits, axis=-1)
        k = self.cfg.n_experts_used
        self.m.route_gap[li] = float(np.min(ranked[:, k - 1] - ranked[:, k])) if k < self.cfg.n_experts else math.inf

    def _by_expert(self):
        """(expert, its rows, their slots among the k) for every expert some row chose."""
        for e in np.unique(self.chosen):
            rows, slots = np.nonzero(self.chosen == e)
            yield int(e), rows, slots

    def moe_out(self, li: int, L: Layer) -> None:
        y = np.empty(self.chosen.shape + (self.cfg.dim,), F32)  # (T, k, dim)
        for e, rows, slots in self._by_expert():
            y[rows, slots] = linear(self.h[rows, slots], L.e_down[e], L.expert_bias("down", e))
        y *= self.weights[..., None]
        out = y[:, 0]
        for j in range(1, y.shape[1]):  # summed in order of choice, as one accumulator would
            out = out + y[:, j]
        if self.cfg.shared_expert_ffn_dim:
            out = out + self.shared_w * linear(self.shared_h, L.s_down)
        self.x = self.x + out

    def attn_out_norm(self, li: int, L: Layer) -> None:
        t = linear(self.att.reshape(self.t, -1), L.wo)
        self.x = self.x + rmsnorm(t, L.post_attn_norm, self.cfg.rms_eps)

    def ffn_out_norm(self, li: int, L: Layer) -> None:
        self.x = self.x + rmsnorm(linear(self.h, L.w_down), L.post_ffn_norm, self.cfg.rms_eps)
