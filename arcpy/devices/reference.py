"""The NumPy float32 forward: the oracle the CUDA kernels are tested against, and the CPU backend.

Numerics contract (libarc's kernels follow the same rules; differences are only summation order
and the last ulp of cos/sin/exp):
- Weights are bf16, converted exactly to float32, or quantized (arc.h's formats), dequantized once
  to float32 by arc.h's formulas (model.quant.dequantize). Activations stay float32: the residual
  stream, the normed input, q/k/v, scores and probabilities, the MLP and the logits. (libarc's
  quantized GEMVs also quantize their input to int8 per 32 values; model.quant.qgemv_reference
  computes that product alone. The forward here does not: compare with a tolerance.)
- The KV cache is bf16: k (after RoPE) and v are rounded to nearest even when stored and read back
  exactly as float32. Here it is held as float32 arrays of bf16-representable values.
- RMSNorm: y = x * (1 / sqrt(mean(x*x) + eps)) * w.
- RoPE, rotate-half convention (as Hugging Face Llama): element i of a head pairs with element
  i + head_dim/2, both rotated by angle = float32(pos) * inv_freq[i], cos and sin in float32.
- Attention: scores = q.k / sqrt(head_dim) over positions 0..pos inclusive, softmax (max
  subtracted), then the weighted sum of v. Query head h reads kv head h // (n_heads // n_kv_heads).
- Optional q/k/v biases are added after the projection, before RoPE.
- MLP: down(silu(gate(x)) * up(x)), silu(g) = g / (1 + exp(-g)).
- A mixture of experts' layer (arc.h: ARC_OP_MOE_IN, ARC_OP_MOE_OUT): router logits = router @ n,
  routed as model.moe.route says (the order of softmax and top-k, ties to the lower expert); each
  chosen expert's GLU down-projected, times its weight, summed over the k in order of choice; plus
  the shared expert's GLU times sigmoid(its router's logit) where the config has one.
- gpt-oss's ops (arcpy/model/gpt_oss.py): ATTEND_SINKS adds each query head's exp(sink) to its
  softmax's denominator (the maximum subtracted is the larger of the scores' and the sink);
  ATTN_OUT_BIAS adds o_proj's bias; MOE_IN_OSS and MOE_OUT_OSS add the router's and the experts'
  biases to their products and take the clamped GLU where swiglu_limit is set.
- logits = lm_head @ rmsnorm(x, final_norm); greedy picks the first index of the maximum.
- Prefill (a chunk of positions per pass, libarc's arc_model_prefill): the same per position, but
  every matrix product runs on bf16 inputs with float32 sums: the normed inputs, the rotated q,
  the attention probabilities (unnormalized; the sum is divided out after the product with v) and
  output, and the SwiGLU output are rounded to bf16 first; the residual stream stays float32.
  Quantized weights enter those products rounded to bf16 (what arc_op_dequantize gives them).
  ReferenceModel.prefill(..., bf16_products=True) computes exactly that.
- Gemma 4 (arcpy/model/gemma4.py states its layer): its rows' ops are arcpy/devices/gemma4.py's;
  its KV cache holds every layer at the larger of the two layer kinds' kv heads and head width;
  its logits soft-capped, cap * tanh(logits / cap).
"""

from __future__ import annotations

import copy
import math

import numpy as np

from arcpy.codes import (OP_ATTEND, OP_ATTN_GATE, OP_ATTN_IN, OP_ATTN_OUT, OP_ATTN_OUT_NORM, OP_DN_IN, OP_DN_OUT,
                         OP_DN_STEP, OP_FFN_IN, OP_FFN_OUT, OP_FFN_OUT_NORM, OP_MOE_IN, OP_MOE_OUT, OP_QK_NORM)
from arcpy.devices.deltanet import DeltaNetState
from arcpy.devices.reference_layer import PRODUCT_WEIGHTS, Layer, norm_factors, weights_f32
from arcpy.errors import InvalidArgumentError
from arcpy.model import EMBED, FINAL_NORM, Model, bf16_to_f32, f32_to_bf16
from arcpy.model.gemma4 import cache_dims
from arcpy.model.gpt_oss import OP_ATTEND_SINKS, OP_ATTN_OUT_BIAS, OP_MOE_IN_OSS, OP_MOE_OUT_OSS
from arcpy.model.moe import route
from arcpy.model.native import layer_program

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

    def __init__(self, m: "ReferenceModel", tokens: list[int], start: int, r):
        self.m, self.cfg, self.start, self.r, self.t = m, m.config, start, r, len(tokens)
        self.positions = start + np.arange(self.t)
        self.x = m.embed[tokens] * F32(m.config.embed_scale)  # (T, dim), a copy
        self.run = self._dispatch()

    def _dispatch(self):
        table = {OP_ATTN_IN: self.attn_in, OP_QK_NORM: self.qk_norm, OP_ATTEND: self.attend,
                 OP_ATTN_OUT: self.attn_out, OP_FFN_IN: self.ffn_in, OP_FFN_OUT: self.ffn_out,
                 OP_ATTN_OUT_NORM: self.attn_out_norm, OP_FFN_OUT_NORM: self.ffn_out_norm,
                 OP_MOE_IN: self.moe_in, OP_MOE_OUT: self.moe_out, OP_ATTN_GATE: self.attn_gate,
                 OP_DN_IN: self.dn_in, OP_DN_STEP: self.dn_step, OP_DN_OUT: self.dn_out,
                 OP_ATTEND_SINKS: self.attend_sinks, OP_ATTN_OUT_BIAS: self.attn_out_bias,
                 OP_MOE_IN_OSS: self.moe_in_oss, OP_MOE_OUT_OSS: self.moe_out_oss}

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

    def attend(self, li: int, L: Layer, sinks: np.ndarray | None = None) -> None:
        c, m, start, t = self.cfg, self.m, self.start, self.t
        factor = c.rope_attention_factor
        q = self.r(rope(self.q, self.positions, L.inv_freq, factor))
        k = rope(self.k, self.positions, L.inv_freq, factor)
        m.k_cache[li, :, start:start + t] = round_bf16(k).transpose(1, 0, 2)
        m.v_cache[li, :, start:start + t] = round_bf16(self.v).transpose(1, 0, 2)
        rounded = self.r is not _exact
        self.att = self.r(causal_attention(q, m.k_cache[li], m.v_cache[li], start, c.n_kv_heads, rounded,
                                           c.scores_scale, c.window(li), sinks))

    def attend_sinks(self, li: int, L: Layer) -> None:
        self.attend(li, L, L.sinks)

    def attn_out(self, li: int, L: Layer, bias: np.ndarray | None = None) -> None:
        self.x = self.x + linear(self.att.reshape(self.t, -1), L.wo, bias)

    def attn_out_bias(self, li: int, L: Layer) -> None:
        self.attn_out(li, L, L.bo)

    def ffn_in(self, li: int, L: Layer) -> None:
        h = self.r(rmsnorm(self.x, L.mlp_norm, self.cfg.rms_eps))
        self.h = self.r(GLUS[self.cfg.activation](linear(h, L.w_gate), linear(h, L.w_up)))

    def ffn_out(self, li: int, L: Layer) -> None:
        self.x = self.x + linear(self.h, L.w_down)

    def moe_in(self, li: int, L: Layer, oss: bool = False) -> None:
        """The router and the chosen experts' GLU; `oss`: gpt-oss's, with the router's and the
        experts' biases (where the config has them) and the clamped GLU (where swiglu_limit is set)."""
        c, glu = self.cfg, GLUS[self.cfg.activation]
        expert_glu = glu
        if oss and c.swiglu_limit:
            expert_glu = lambda g, u: clamped_swiglu(g, u, c.swiglu_limit, c.swiglu_alpha)  # noqa: E731
        bias = L.expert_bias if oss else (lambda name, e=None: None)
        n = self.r(rmsnorm(self.x, L.mlp_norm, c.rms_eps))
        logits = linear(n, L.router, bias("router"))
        self.chosen, self.weights = route(logits, c.n_experts_used, c.routing, c.norm_topk_prob)
        self.m.routing[li] = self.chosen
        ranked = -np.sort(-logits, axis=-1)  # the k-th logit's lead over the next (inf: all chosen)
        k = c.n_experts_used
        self.m.route_gap[li] = float(np.min(ranked[:, k - 1] - ranked[:, k])) if k < c.n_experts else math.inf
        h = np.empty(self.chosen.shape + (c.expert_ffn_dim,), F32)  # (T, k, expert_ffn_dim)
        for e, rows, slots in self._by_expert():  # the rows routed to each expert, together
            h[rows, slots] = expert_glu(linear(n[rows], L.e_gate[e], bias("gate", e)),
                                        linear(n[rows], L.e_up[e], bias("up", e)))
        self.h = self.r(h)
        if c.shared_expert_ffn_dim:
            self.shared_h = self.r(glu(linear(n, L.s_gate), linear(n, L.s_up)))
            self.shared_w = F32(1.0) / (F32(1.0) + np.exp(-linear(n, L.s_router)))  # (T, 1)

    def _by_expert(self):
        """(expert, its rows, their slots among the k) for every expert some row chose."""
        for e in np.unique(self.chosen):
            rows, slots = np.nonzero(self.chosen == e)
            yield int(e), rows, slots

    def moe_in_oss(self, li: int, L: Layer) -> None:
        self.moe_in(li, L, oss=True)

    def moe_out(self, li: int, L: Layer, oss: bool = False) -> None:
        y = np.empty(self.chosen.shape + (self.cfg.dim,), F32)  # (T, k, dim)
        for e, rows, slots in self._by_expert():
            y[rows, slots] = linear(self.h[rows, slots], L.e_down[e], L.expert_bias("down", e) if oss else None)
        y *= self.weights[..., None]
        out = y[:, 0]
        for j in range(1, y.shape[1]):  # summed in order of choice, as one accumulator would
            out = out + y[:, j]
        if self.cfg.shared_expert_ffn_dim:
            out = out + self.shared_w * linear(self.shared_h, L.s_down)
        self.x = self.x + out

    def moe_out_oss(self, li: int, L: Layer) -> None:
        self.moe_out(li, L, oss=True)

    def attn_out_norm(self, li: int, L: Layer) -> None:
        t = linear(self.att.reshape(self.t, -1), L.wo)
        self.x = self.x + rmsnorm(t, L.post_attn_norm, self.cfg.rms_eps)

    def ffn_out_norm(self, li: int, L: Layer) -> None:
        self.x = self.x + rmsnorm(linear(self.h, L.w_down), L.post_ffn_norm, self.cfg.rms_eps)


class ReferenceModel:
    """A Model ready to run on the CPU: float32 weights, a preallocated bf16-valued KV cache.

    `max_seq` may shorten the cache below the config's context; positions must stay below it.
    """

    def __init__(self, model: Model, max_seq: int | None = None):
        cfg = model.config
        if max_seq is not None and not (isinstance(max_seq, (int, np.integer)) and not isinstance(max_seq, bool)
                                        and 0 < max_seq <= cfg.max_seq):
            raise InvalidArgumentError(f"max_seq must be in 1..{cfg.max_seq}, got {max_seq!r}")
        self.config = cfg
        self.max_seq = int(max_seq or cfg.max_seq)
        self.embed = bf16_to_f32(model.tensor(EMBED))
        # A tied head is the same table: share the array rather than convert it twice.
        self.lm_head = self.embed if cfg.tied_embeddings else weights_f32(model.lm_head())
        self.final_norm = norm_factors(model, FINAL_NORM)
        layer, self._rows, self.per_layer_inputs = Layer, _RowOps, None
        if cfg.gemma4_layer:  # its layer's weights, ops and per-layer inputs (arcpy/devices/gemma4.py)
            from arcpy.devices.gemma4 import Gemma4Layer, Gemma4Rows, PerLayerInputs
            layer, self._rows = Gemma4Layer, Gemma4Rows
            self.per_layer_inputs = PerLayerInputs(model) if cfg.ple_dim else None
        self.layers = [layer(model, i) for i in range(cfg.n_layers)]
        self.programs = [layer_program(cfg, i) for i in range(cfg.n_layers)]
        self.routing: dict[int, np.ndarray] = {}  # MoE layer -> the last rows' chosen experts (T, k)
        self.route_gap: dict[int, float] = {}  # MoE layer -> its last rows' smallest lead of a choice
        self.quantized = model.quantized
        self._bf16_layers: list[Layer] | None = None  # quantized weights rounded to bf16, made on first use
        kv_heads, head_dim = cache_dims(cfg)  # a Gemma 4 layer's own dims fill what they need of it
        shape = (cfg.n_layers, kv_heads, self.max_seq, head_dim)
        self.k_cache = np.zeros(shape, dtype=F32)
        self.v_cache = np.zeros(shape, dtype=F32)
        # Each DeltaNet layer's recurrent state (arcpy.model.hybrid): the positions it has taken in.
        self.deltanet_state = {i: DeltaNetState(cfg) for i in range(cfg.n_layers) if cfg.is_linear_layer(i)}

    def reset(self) -> None:
        """Forget every cached position."""
        self.k_cache.fill(0.0)
        self.v_cache.fill(0.0)
        for state in self.deltanet_state.values():
            state.reset()

    def forward(self, token: int, pos: int, logits: bool = True) -> np.ndarray | None:
        """Run `token` at position `pos` -> logits (vocab,) f32. Writes k/v at `pos`; reads 0..pos.
        With logits=False only the KV cache is filled (a prompt position nobody samples)."""
        cfg = self.config
        self._check_token(token)
        if not _is_int(pos) or not 0 <= pos < self.max_seq:
            raise InvalidArgumentError(f"position {pos!r} out of range 0..{self.max_seq - 1}")
        x = self._run_rows([int(token)], int(pos), self.layers, _exact)[0]
        if not logits:
            return None
        return self._capped(gemv(self.lm_head, rmsnorm(x, self.final_norm, cfg.rms_eps)))

    def _capped(self, logits: np.ndarray) -> np.ndarray:
        """The logits, soft-capped where the config caps them: cap * tanh(logits / cap)."""
        cap = self.config.final_softcap
        return np.tanh(logits / F32(cap)) * F32(cap) if cap else logits

    def _check_token(self, token) -> None:
        if not _is_int(token) or not 0 <= token < self.config.vocab:
            raise InvalidArgumentError(f"token {token!r} out of range 0..{self.config.vocab - 1}")

    def prefill(self, tokens: list[int], start: int = 0, chunk: int | None = None,
                bf16_products: bool = False, every_row: bool = False, progress=None) -> np.ndarray:
        """Run `tokens` at positions start..start+len-1 -> the logits of the last (vocab,) f32, or
        with every_row those of every token (len, vocab), each as the last's.

        Writes k/v at every position, as forward() one token at a time would; the tokens of a chunk
        (`chunk` at a time, all at once by default) go through each layer together, each chunk
        attending to the cache the earlier ones wrote. Only summation order differs from forward().
        bf16_products: round what enters each matrix product to bf16 as libarc's tensor-core
        prefill does (the normed inputs, the rotated q, the attention probabilities and output,
        the SwiGLU output); the residual stream and every sum stay float32. `progress(done, total)`,
        where given, is called with the chunks done before the first and after each.
        """
        tokens = list(tokens)
        if not tokens:
            raise InvalidArgumentError("tokens must hold at least one token")
        for tok in tokens:
            self._check_token(tok)
        if not _is_int(start) or start < 0 or start + len(tokens) > self.max_seq:
            raise InvalidArgumentError(f"{len(tokens)} tokens from position {start!r} exceed max_seq {self.max_seq}")
        if chunk is not None and (not _is_int(chunk) or chunk < 1):
            raise InvalidArgumentError(f"chunk must be a positive integer, got {chunk!r}")
        step = int(chunk) if chunk is not None else len(tokens)
        offsets = range(0, len(tokens), step)
        xs = []
        for done, off in enumerate(offsets):
            if progress is not None:
                progress(done, len(offsets))
            xs.append(self._prefill_chunk([int(t) for t in tokens[off:off + step]], int(start) + off, bf16_products))
        if progress is not None:
            progress(len(offsets), len(offsets))
        rows = np.concatenate(xs) if every_row else xs[-1][-1:]
        logits = np.stack([self._capped(gemv(self.lm_head, rmsnorm(x, self.final_norm, self.config.rms_eps)))
                           for x in rows])
        return logits if every_row else logits[0]

    def _product_layers(self, bf16_products: bool) -> list[Layer]:
        """The layers whose weights the prefill's products read: with bf16 products, a quantized
        model's matrices rounded to bf16 (bf16 weights are already), made once."""
        if not (bf16_products and self.quantized):
            return self.layers
        if self._bf16_layers is None:
            self._bf16_layers = []
            for layer in self.layers:
                rounded = copy.copy(layer)
                for name in PRODUCT_WEIGHTS:
                    if hasattr(layer, name):
                        setattr(rounded, name, round_bf16(getattr(layer, name)))
                self._bf16_layers.append(rounded)
        return self._bf16_layers

    def _prefill_chunk(self, tokens: list[int], start: int, bf16_products: bool) -> np.ndarray:
        """The chunk's tokens through every layer -> their residual streams (T, dim) f32."""
        return self._run_rows(tokens, start, self._product_layers(bf16_products),
                              round_bf16 if bf16_products else _exact)

    def _run_rows(self, tokens: list[int], start: int, layers: list[Layer], r) -> np.ndarray:
        """Rows of tokens at positions start.. through every layer's program (libarc's
        arc_layer_program, the one the CUDA forwards run) -> their residual streams (T, dim) f32.
        `r` is applied to what enters a matrix product (bf16 rounding for the prefill's form)."""
        ops = self._rows(self, tokens, start, r)
        for li, L in enumerate(layers):
            for op in self.programs[li]:
                ops.run(op, li, L)
        return ops.x

    def greedy(self, prompt: list[int], n_new: int, start_pos: int = 0) -> list[int]:
        """Feed `prompt` from `start_pos`, then pick `n_new` tokens greedily; returns the new tokens."""
        if not prompt:
            raise InvalidArgumentError("prompt must hold at least one token")
        if n_new < 0 or start_pos + len(prompt) + max(n_new - 1, 0) > self.max_seq:
            raise InvalidArgumentError(f"prompt of {len(prompt)} + {n_new} new tokens from position "
                                       f"{start_pos} exceeds max_seq {self.max_seq}")
        pos = start_pos
        for tok in prompt:
            logits = self.forward(tok, pos)
            pos += 1
        out: list[int] = []
        for _ in range(n_new):
            out.append(argmax(logits))
            if len(out) < n_new:
                logits = self.forward(out[-1], pos)
                pos += 1
        return out
