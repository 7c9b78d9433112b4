"""Qwen3.5 and Qwen3.6 (dense and MoE): hybrids of three gated DeltaNet layers to one of attention
(arcpy/model/hybrid.py describes the DeltaNet layer); the attention has q/k norms, a sigmoid gate on
its output and RoPE over a quarter of each head (head_dim 256); norms scale by 1 + w. The MoE form
routes every layer's FFN (softmax, top k, renormalized) and adds a shared expert with its sigmoid
gate. The checkpoints of the conditional-generation classes hold the text model's config under
text_config and its weights under model.language_model (the readers take the text model alone).
The multi-token prediction layer (mtp.*) is read apart (arcpy/model/mtp.py). Text positions rotate every RoPE section
alike, so the multi-section (interleaved) RoPE is the plain one here."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from arcpy.checks import quoted
from arcpy.errors import ModelFileError
from arcpy.model.bf16 import f32_to_bf16
from arcpy.model.config import ModelConfig
from arcpy.model.families.family import GGUF_LAYER_NAMES, Family, nested_text_config
from arcpy.model.families.hf_values import flag, integer
from arcpy.model.hybrid import FULL, LAYER_KINDS, LINEAR, key_dim
from arcpy.model.quant import QuantTensor

_INTERVAL = 4  # full_attention_interval where config.json does not list layer_types
# llama.cpp's names of a layer's modules (its qwen35 and qwen35moe): the FFN's input norm is its
# post_attention_norm; the DeltaNet's tensors, A_log and dt_bias named whole (no .weight).
_GGUF_NAMES = {**GGUF_LAYER_NAMES, "post_attention_layernorm": "post_attention_norm",
               "linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate",
               "linear_attn.in_proj_a": "ssm_alpha", "linear_attn.in_proj_b": "ssm_beta",
               "linear_attn.conv1d": "ssm_conv1d", "linear_attn.norm": "ssm_norm", "linear_attn.out_proj": "ssm_out",
               "linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt.bias"}
# The DeltaNet's tensors whose value heads llama.cpp's converter reorders, and how: (axis, the rows
# or columns of a head; 0: the channels after q and k, heads of v_head_dim).
_TILED = {"in_proj_qkv.weight": (0, 0), "conv1d.weight": (0, 0), "in_proj_z.weight": (0, -1),
          "in_proj_a.weight": (0, 1), "in_proj_b.weight": (0, 1), "A_log": (0, 1), "dt_bias": (0, 1),
          "out_proj.weight": (1, -1)}


class Qwen35(Family):
    name = "qwen3_5"
    hf_classes = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
    gguf_arch = "qwen35"
    qk_norm = True
    norms_less_one = True
    hf_constants = {"attention_bias": False}

    gguf_names = _GGUF_NAMES
    gguf_float = ("linear_attn.A_log",)  # -exp(A_log) in the files: its log taken in float32
    # out_proj's value heads are its columns, which a quantized row's blocks do not let move: it is
    # read as bf16 (the other DeltaNet matrices move whole rows, packed or not).
    gguf_unpacked = ("linear_attn.out_proj.weight",)

    def holds(self, cfg: ModelConfig) -> bool:
        return bool(cfg.layer_types) and cfg.n_experts == 0

    def text_config(self, d: Mapping) -> Mapping:
        """The text model's keys: text_config's where config.json has one (the outer file's
        architectures and tie_word_embeddings kept)."""
        return nested_text_config(d)

    def hf_fields(self, d: Mapping, source: str, n_layers: int, head_dim: int) -> dict:
        kinds = d.get("layer_types")
        if kinds is None:
            every = integer(d, "full_attention_interval", source, _INTERVAL)
            if every <= 0:
                raise ModelFileError(f"{source}: key 'full_attention_interval' must be positive, got {every}")
            kinds = [FULL if (i + 1) % every == 0 else LINEAR for i in range(n_layers)]
        if not isinstance(kinds, list) or len(kinds) != n_layers or not set(kinds) <= set(LAYER_KINDS):
            raise ModelFileError(f"{source}: key 'layer_types' must name full_attention or linear_attention for "
                                 f"each of the {n_layers} layers, got {quoted(kinds)}")
        if not flag(d, "attn_output_gate", source, True):
            raise ModelFileError(f"{source}: attn_output_gate=false is not supported (Qwen3.5's attention is gated)")
        return {"layer_types": tuple(kinds), "attn_output_gate": True, "norm_plus_one": True,
                "linear_n_k_heads": integer(d, "linear_num_key_heads", source, 16),
                "linear_n_v_heads": integer(d, "linear_num_value_heads", source, 32),
                "linear_k_head_dim": integer(d, "linear_key_head_dim", source, 128),
                "linear_v_head_dim": integer(d, "linear_value_head_dim", source, 128),
                "linear_conv_kernel": integer(d, "linear_conv_kernel_dim", source, 4)}

    def to_hf(self, cfg: ModelConfig, d: dict) -> None:
        d.update(layer_types=list(cfg.layer_types), linear_num_key_heads=cfg.linear_n_k_heads,
                 linear_num_value_heads=cfg.linear_n_v_heads, linear_key_head_dim=cfg.linear_k_head_dim,
                 linear_value_head_dim=cfg.linear_v_head_dim, linear_conv_kernel_dim=cfg.linear_conv_kernel)


    def gguf_fields(self, m, a: str, dims: tuple[int, int, int], window: int) -> dict:
        """As llama.cpp's converter writes them: every full_attention_interval-th layer attends;
        ssm.group_count key heads of ssm.state_size, ssm.time_step_rank value heads filling
        ssm.inner_size; the norms' factors whole (norm_plus_one false). The layers after
        block_count - nextn_predict_layers are the MTP layer's, read apart (arcpy/model/gguf.py)."""
        n = m.integer(a + "block_count") - m.integer(a + "nextn_predict_layers", 0)
        every = m.integer(a + "full_attention_interval", _INTERVAL)
        if every <= 0:
            raise ModelFileError(f"{m.path}: metadata {quoted(a + 'full_attention_interval')} must be positive, "
                                 f"got {every}")
        n_v = m.integer(a + "ssm.time_step_rank")
        inner = m.integer(a + "ssm.inner_size")
        if n_v <= 0 or inner % n_v:
            raise ModelFileError(f"{m.path}: metadata {quoted(a + 'ssm.inner_size')} ({inner}) must split into "
                                 f"{a}ssm.time_step_rank ({n_v}) value heads")
        return {"layer_types": tuple(FULL if (i + 1) % every == 0 else LINEAR for i in range(n)),
                "attn_output_gate": True, "linear_n_k_heads": m.integer(a + "ssm.group_count"),
                "linear_n_v_heads": n_v, "linear_k_head_dim": m.integer(a + "ssm.state_size"),
                "linear_v_head_dim": inner // n_v, "linear_conv_kernel": m.integer(a + "ssm.conv_kernel")}

    def gguf_shape(self, hf_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The convolution's weights as llama.cpp stores them: (channels, kernel)."""
        return (shape[0], shape[2]) if hf_name.endswith("linear_attn.conv1d.weight") else shape

    def gguf_tensor(self, hf_name: str, words: np.ndarray, cfg: ModelConfig) -> np.ndarray:
        """A tensor of llama.cpp's file as the Hugging Face files hold it: the value heads back
        from the converter's tiled order (head j of key group g at j * key heads + g) to grouped
        (at g * heads a group + j), A_log from -exp(A_log), the convolution (channels, 1, kernel)."""
        _, _, name = hf_name.partition(".linear_attn.")
        if name not in _TILED:
            return words
        if name == "A_log":
            words = f32_to_bf16(np.log(-words.astype(np.float32)))
        axis, head = _TILED[name]
        n_k, group = cfg.linear_n_k_heads, cfg.linear_n_v_heads // cfg.linear_n_k_heads
        head = cfg.linear_v_head_dim if head == -1 else head
        if group > 1 and isinstance(words, QuantTensor):  # rows of packed blocks move whole (axis 0)
            return words.with_data(self._untiled(words.data, 0, head, n_k, group, cfg))
        if group > 1:
            words = self._untiled(words, axis, head, n_k, group, cfg)
        return words.reshape(words.shape[0], 1, -1) if name == "conv1d.weight" else words

    @staticmethod
    def _untiled(words: np.ndarray, axis: int, head: int, n_k: int, group: int, cfg: ModelConfig) -> np.ndarray:
        """The value heads along `axis` from the converter's tiled order back to grouped."""
        x = np.moveaxis(words, axis, 0)
        at = 2 * key_dim(cfg) if head == 0 else 0
        v = x[at:]
        size = head or cfg.linear_v_head_dim
        v = v.reshape(group, n_k, size, *v.shape[1:]).swapaxes(0, 1).reshape(v.shape)
        return np.ascontiguousarray(np.moveaxis(np.concatenate([x[:at], v]), 0, axis))


class Qwen35Moe(Qwen35):
    name = "qwen3_5_moe"
    hf_classes = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
    gguf_arch = "qwen35moe"
    gguf_dense_ffn = False  # the files name no dense FFN width: the experts' stands in

    def holds(self, cfg: ModelConfig) -> bool:
        return bool(cfg.layer_types) and cfg.n_experts > 0

    def text_config(self, d: Mapping) -> Mapping:
        """As Qwen3.5's; every layer's FFN is the experts', so config.json may name no dense
        width: the experts' stands in (no layer holds a dense FFN)."""
        out = dict(super().text_config(d))
        if "intermediate_size" not in out and "moe_intermediate_size" in out:
            out["intermediate_size"] = out["moe_intermediate_size"]
        return out

    def hf_fields(self, d: Mapping, source: str, n_layers: int, head_dim: int) -> dict:
        return {**super().hf_fields(d, source, n_layers, head_dim),
                "n_experts": integer(d, "num_experts", source),
                "n_experts_used": integer(d, "num_experts_per_tok", source),
                "expert_ffn_dim": integer(d, "moe_intermediate_size", source),
                "shared_expert_ffn_dim": integer(d, "shared_expert_intermediate_size", source),
                "norm_topk_prob": True}

    def to_hf(self, cfg: ModelConfig, d: dict) -> None:
        super().to_hf(cfg, d)
        d.update(num_experts=cfg.n_experts, num_experts_per_tok=cfg.n_experts_used,
                 moe_intermediate_size=cfg.expert_ffn_dim, shared_expert_intermediate_size=cfg.shared_expert_ffn_dim)

    def gguf_experts(self, m, a: str, n: int) -> dict:
        return {"n_experts": n, "n_experts_used": m.integer(a + "expert_used_count"),
                "expert_ffn_dim": m.integer(a + "expert_feed_forward_length"), "routing": "softmax_topk",
                "norm_topk_prob": True,
                "shared_expert_ffn_dim": m.integer(a + "expert_shared_feed_forward_length")}


QWEN3_5 = Qwen35()
QWEN3_5_MOE = Qwen35Moe()
