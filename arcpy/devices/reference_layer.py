"""The NumPy reference's weights of a decoder layer (reference.py's Layer): as float32, converted
or dequantized once, under the names of the layer program's ops."""

from __future__ import annotations

import numpy as np

from arcpy.devices.deltanet import DeltaNet
from arcpy.model import Model, QuantTensor, bf16_to_f32, dequantize, layer_prefix, norm_names, rope_inv_freq
from arcpy.model.gpt_oss import SINKS
from arcpy.model.hybrid import split_gate

F32 = np.float32


def weights_f32(t) -> np.ndarray:
    """A tensor's weights as float32: bf16 words converted, a QuantTensor dequantized (both exact)."""
    return dequantize(t) if isinstance(t, QuantTensor) else bf16_to_f32(t)


def norm_factors(model: Model, name: str) -> np.ndarray:
    """A norm's factors as float32: its bf16 weights, plus one where the config stores them less one
    (norm_plus_one), added in float32 as libarc's kernels add it."""
    return bf16_to_f32(model.tensor(name)) + F32(model.config.norm_add)


class Layer:
    """One decoder layer's weights as float32 (converted, or dequantized, once)."""

    def __init__(self, model: Model, i: int):
        t = lambda n: weights_f32(model.tensor(layer_prefix(i) + n))  # noqa: E731
        norm = lambda n: norm_factors(model, layer_prefix(i) + n)  # noqa: E731
        bias = model.config.qkv_bias
        self.attn_norm = norm("input_layernorm.weight")
        self.biases: dict[str, np.ndarray] = {}  # gpt-oss's experts' biases (expert_bias)
        self.deltanet = DeltaNet(model.config, lambda n: t("linear_attn." + n)) if model.config.is_linear_layer(i) else None
        self._attention(model, i, t, norm, bias)
        self._ffn(model, i, t, norm)

    def _attention(self, model: Model, i: int, t, norm, bias: bool) -> None:
        if self.deltanet is not None:
            return
        qk_norm = model.config.qk_norm
        self.q_norm, self.k_norm = ((norm(f"self_attn.{p}_norm.weight") if qk_norm else None) for p in "qk")
        self.inv_freq = rope_inv_freq(model.config, i)
        self.wq, self.wk, self.wv = (t(f"self_attn.{p}_proj.weight") for p in "qkv")
        self.bq, self.bk, self.bv = ((t(f"self_attn.{p}_proj.bias") if bias else None) for p in "qkv")
        self.wo = t("self_attn.o_proj.weight")
        self.bo = t("self_attn.o_proj.bias") if model.config.o_bias else None
        self.sinks = t(SINKS) if model.config.attn_sinks else None
        if model.config.attn_output_gate:  # q_proj: each head's query rows, then its gate's
            self.wq, self.w_attn_gate = split_gate(self.wq, model.config.n_heads, model.config.head_dim)

    def _ffn(self, model: Model, i: int, t, norm) -> None:
        norms = norm_names(model.config)
        self.mlp_norm = norm(norms["ffn"])
        self.post_attn_norm = norm(norms["post_attn"]) if "post_attn" in norms else None
        self.post_ffn_norm = norm(norms["post_ffn"]) if "post_ffn" in norms else None
        c = model.config
        if not c.is_moe_layer(i):
            self.w_gate = t("mlp.gate_proj.weight")
            self.w_up = t("mlp.up_proj.weight")
            self.w_down = t("mlp.down_proj.weight")
            return
        # The experts: expert e's (expert_ffn_dim, dim) gate and up, (dim, expert_ffn_dim) down.
        e, f = c.n_experts, c.expert_ffn_dim
        self.router = t("mlp.gate.weight")
        # gpt-oss's biases: the router's (e,), and each expert's of gate and up (e, f) and down (e, dim).
        if c.expert_bias:
            self.biases = {"router": t("mlp.gate.bias"),
                           **{p: t(f"mlp.experts.{p}_proj.bias").reshape(e, -1) for p in ("gate", "up", "down")}}
        self.e_gate = t("mlp.experts.gate_proj.weight").reshape(e, f, c.dim)
        self.e_up = t("mlp.experts.up_proj.weight").reshape(e, f, c.dim)
        self.e_down = t("mlp.experts.down_proj.weight").reshape(e, c.dim, f)
        if c.shared_expert_ffn_dim:
            self.s_router = t("mlp.shared_expert_gate.weight")
            self.s_gate, self.s_up, self.s_down = (t(f"mlp.shared_expert.{p}_proj.weight")
                                                   for p in ("gate", "up", "down"))

    def expert_bias(self, name: str, expert: int | None = None) -> np.ndarray | None:
        """A bias of gpt-oss's experts ("router", or expert `expert`'s "gate", "up" or "down"),
        None where the config has none."""
        b = self.biases.get(name)
        return b if b is None or expert is None else b[expert]


# What the prefill's products read of a layer, rounded to bf16 where the weights are quantized.
PRODUCT_WEIGHTS = ("wq", "w_attn_gate", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "e_gate", "e_up", "e_down",
                    "s_gate", "s_up", "s_down")
