"""The NumPy reference's Gemma 4 layer (arcpy/model/gemma4.py states what it computes): its weights,
the per-layer inputs, and its ops over rows, the reference's own for the attention and the ops libarc
has no form of."""

from __future__ import annotations

import numpy as np

from arcpy.codes import OP_EXPERTS_BESIDE, OP_LAYER_SCALAR, OP_PER_LAYER_INPUT
from arcpy.devices.reference_layer import Layer, norm_factors, weights_f32
from arcpy.devices.reference_ops import (
    GLUS,
    _exact,
    _RowOps,
    causal_attention,
    linear,
    rmsnorm,
    rope,
)
from arcpy.model import Model, rope_inv_freq
from arcpy.model import gemma4 as g4
from arcpy.model.moe import route
from arcpy.model.native import norm_names

F32 = np.float32


class Gemma4Layer(Layer):
    """A Gemma 4 layer's weights as float32: a shared layer's attention has no k or v, a global
    layer with k_eq_v no v; the dense GLU always, the experts and their router beside it in a
    mixture of experts; the per-layer input's, and the layer's scalar."""

    def _attention(self, model: Model, i: int, t, norm, bias: bool) -> None:
        c = model.config
        self.source = g4.kv_source(c, i)
        self.head_dim, self.kv_heads = g4.layer_dims(c, i)
        self.inv_freq = rope_inv_freq(c, i)
        self.q_norm = norm("self_attn.q_norm.weight")
        self.wq, self.wo = t("self_attn.q_proj.weight"), t("self_attn.o_proj.weight")
        self.wk = self.k_norm = None
        self.values_are_keys = g4.values_are_keys(c, i)
        if self.source == i:
            self.wk, self.k_norm = t("self_attn.k_proj.weight"), norm("self_attn.k_norm.weight")
            self.wv = None if self.values_are_keys else t("self_attn.v_proj.weight")

    def _ffn(self, model: Model, i: int, t, norm) -> None:
        c = model.config
        norms = norm_names(c)
        self.mlp_norm, self.post_attn_norm, self.post_ffn_norm = (norm(norms[k]) for k in ("ffn", "post_attn",
                                                                                           "post_ffn"))
        self.w_gate, self.w_up, self.w_down = (t(f"mlp.{p}_proj.weight") for p in ("gate", "up", "down"))
        if c.is_moe_layer(i):
            e, f = c.n_experts, c.expert_ffn_dim
            self.experts_norm, self.dense_out_norm, self.experts_out_norm = (norm(n) for n in g4.EXPERT_NORMS)
            self.router, self.router_scale, self.expert_scale = (t(n) for n in (g4.ROUTER, g4.ROUTER_SCALE,
                                                                                g4.EXPERT_SCALE))
            self.e_gate = t("mlp.experts.gate_proj.weight").reshape(e, f, c.dim)
            self.e_up = t("mlp.experts.up_proj.weight").reshape(e, f, c.dim)
            self.e_down = t("mlp.experts.down_proj.weight").reshape(e, c.dim, f)
        if c.ple_dim:
            self.ple_gate, self.ple_projection = t(g4.PLE_GATE), t(g4.PLE_LAYER_PROJECTION)
            self.ple_norm = norm(g4.PLE_POST_NORM)
        self.scalar = F32(t(g4.LAYER_SCALAR)[0])


class PerLayerInputs:
    """The per-layer embeddings' weights as float32, and each token's inputs to every layer."""

    def __init__(self, model: Model):
        c = model.config
        self.table = weights_f32(model.tensor(g4.PLE_EMBED))
        self.projection = weights_f32(model.tensor(g4.PLE_PROJECTION))
        self.norm = norm_factors(model, g4.PLE_NORM)
        self.shape = (c.n_layers, c.ple_dim)
        self.scales = tuple(F32(s) for s in g4.embed_scales(c))
        self.eps = c.rms_eps

    def rows(self, tokens: list[int], x: np.ndarray, r) -> np.ndarray:
        """Tokens and their scaled embeddings x (T, dim) -> their inputs (T, n_layers, ple_dim). `r`
        is applied to what enters the projection."""
        rows, projection, total = self.scales
        own = (self.table[tokens] * rows).reshape(len(tokens), *self.shape)
        seen = (linear(r(x), self.projection) * projection).reshape(len(tokens), *self.shape)
        return (rmsnorm(seen, self.norm, self.eps) + own) * total


class Gemma4Rows(_RowOps):
    """The reference's Gemma 4 ops over rows: the attention by each layer's dims and cache (its own,
    or the earlier layer's it shares), the experts beside the dense FFN, the per-layer input, the
    layer's scalar."""

    def __init__(self, m, tokens: list[int], start: int, r):
        super().__init__(m, tokens, start, r)
        self.ple = m.per_layer_inputs.rows(tokens, self.x, r) if m.per_layer_inputs is not None else None

    def _dispatch(self):
        own = {OP_EXPERTS_BESIDE: self.experts_beside, OP_PER_LAYER_INPUT: self.per_layer_input,
               OP_LAYER_SCALAR: self.layer_scalar}
        shared = super()._dispatch()

        def run(op: int, li: int, L: Gemma4Layer) -> None:
            if op in own:
                own[op](li, L)
            else:
                shared(op, li, L)
        return run

    def attn_in(self, li: int, L: Gemma4Layer) -> None:
        h = self.r(rmsnorm(self.x, L.attn_norm, self.cfg.rms_eps))
        self.q = linear(h, L.wq).reshape(self.t, self.cfg.n_heads, L.head_dim)
        if L.wk is not None:
            self.k = linear(h, L.wk).reshape(self.t, L.kv_heads, L.head_dim)
            self.v = self.k if L.values_are_keys else linear(h, L.wv).reshape(self.k.shape)

    def qk_norm(self, li: int, L: Gemma4Layer) -> None:
        eps = self.cfg.rms_eps
        self.q = rmsnorm(self.q, L.q_norm, eps)
        if L.wk is not None:
            self.k, self.v = rmsnorm(self.k, L.k_norm, eps), rmsnorm(self.v, F32(1.0), eps)

    def attend(self, li: int, L: Gemma4Layer) -> None:
        c, m, start, t = self.cfg, self.m, self.start, self.t
        q = self.r(rope(self.q, self.positions, L.inv_freq))
        kv, hd = L.kv_heads, L.head_dim
        if L.wk is not None:
            k = rope(self.k, self.positions, L.inv_freq)
            m.k_cache[li, :kv, start:start + t, :hd] = m.kv_round(k).transpose(1, 0, 2)
            m.v_cache[li, :kv, start:start + t, :hd] = m.kv_round(self.v).transpose(1, 0, 2)
        k_cache, v_cache = m.k_cache[L.source, :kv, :, :hd], m.v_cache[L.source, :kv, :, :hd]
        self.att = self.r(causal_attention(q, k_cache, v_cache, start, kv, self.r is not _exact, c.scores_scale,
                                           c.window(li)))

    def experts_beside(self, li: int, L: Gemma4Layer) -> None:
        """The FFN's output of a mixture-of-experts layer: the dense GLU's and the experts' each
        normed, summed, normed, added to the residual stream."""
        c, x = self.cfg, self.x
        dense = rmsnorm(linear(self.h, L.w_down), L.dense_out_norm, c.rms_eps)
        # dim^-1/2 after the product, as libarc applies it (the product's input rounded without it)
        logits = linear(self.r(rmsnorm(x, L.router_scale, c.rms_eps)), L.router) * F32(c.dim ** -0.5)
        self.chosen, self.weights = route(logits, c.n_experts_used, "softmax_topk", True)
        self.weights = self.weights * L.expert_scale[self.chosen]
        self.record_routing(li, logits)
        n = self.r(rmsnorm(x, L.experts_norm, c.rms_eps))
        h = np.empty(self.chosen.shape + (c.expert_ffn_dim,), F32)  # (T, k, expert_ffn_dim)
        for e, rows, slots in self._by_expert():  # the rows routed to each expert, together
            h[rows, slots] = GLUS[c.activation](linear(n[rows], L.e_gate[e]), linear(n[rows], L.e_up[e]))
        h = self.r(h)
        y = np.empty(self.chosen.shape + (c.dim,), F32)  # (T, k, dim)
        for e, rows, slots in self._by_expert():
            y[rows, slots] = linear(h[rows, slots], L.e_down[e])
        y *= self.weights[..., None]
        out = y[:, 0]
        for j in range(1, y.shape[1]):  # summed in order of choice, as one accumulator would
            out = out + y[:, j]
        experts = rmsnorm(out, L.experts_out_norm, c.rms_eps)
        self.x = x + rmsnorm(dense + experts, L.post_ffn_norm, c.rms_eps)

    def per_layer_input(self, li: int, L: Gemma4Layer) -> None:
        g = GLUS["gelu_tanh"](linear(self.r(self.x), L.ple_gate), self.ple[:, li])
        self.x = self.x + rmsnorm(linear(self.r(g), L.ple_projection), L.ple_norm, self.cfg.rms_eps)

    def layer_scalar(self, li: int, L: Gemma4Layer) -> None:
        self.x = self.x * L.scalar
