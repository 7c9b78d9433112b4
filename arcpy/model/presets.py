"""Named model shapes with deterministic random weights (random_weights.py draws them): the embedded
default, the benchmark models, and quantized ones (their matrices in arc.h's quantized formats, mixed
as llama.cpp mixes them)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from arcpy.codes import (
    FORMAT_BF16,
    FORMAT_IQ4_NL,
    FORMAT_IQ4_XS,
    FORMAT_MXFP4,
    FORMAT_Q2_K,
    FORMAT_Q3_K,
    FORMAT_Q4_0,
    FORMAT_Q4_1,
    FORMAT_Q4_K,
    FORMAT_Q5_0,
    FORMAT_Q5_1,
    FORMAT_Q5_K,
    FORMAT_Q6_K,
    FORMAT_Q8_0,
)
from arcpy.errors import InvalidArgumentError
from arcpy.model.config import LinearScaling, LongRopeScaling, ModelConfig, RopeScaling, YarnScaling
from arcpy.model.native import LM_HEAD, expected_tensors, is_matrix
from arcpy.model.random_weights import random_model
from arcpy.model.tensors import Model

def _f32(values) -> tuple[float, ...]:
    """Values as float32 holds them: what a GGUF file stores of LongRoPE's factors."""
    return tuple(float(v) for v in np.array(list(values), dtype=np.float32))


SHAPES: dict[str, ModelConfig] = {
    # The llama2.c "stories" shapes, with random weights instead of the trained ones.
    "stories15M": ModelConfig(dim=288, n_layers=6, n_heads=6, n_kv_heads=6, head_dim=48, ffn_dim=768,
                              vocab=32000, max_seq=1024, tied_embeddings=True),
    "stories110M": ModelConfig(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, head_dim=64, ffn_dim=2048,
                               vocab=32000, max_seq=1024, tied_embeddings=True),
    # The SmolLM2-135M shape: deep and narrow, GQA 9/3, tied.
    "smollm2-135M": ModelConfig(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, ffn_dim=1536,
                                vocab=49152, max_seq=2048, rms_eps=1e-5, rope_theta=100000.0,
                                tied_embeddings=True),
    # Llama 3 style: grouped-query attention, large theta, frequency scaling, untied head.
    "gqa": ModelConfig(dim=2048, n_layers=2, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=5632,
                       vocab=32000, max_seq=4096, rope_theta=500000.0,
                       rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192)),
    # The Llama-3.2-1B shape (16 layers, GQA 32/8, vocab 128256, tied), for benchmarks.
    "llama1B": ModelConfig(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=8192,
                           vocab=128256, max_seq=4096, rope_theta=500000.0,
                           rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192), tied_embeddings=True),
    # The Llama-3-8B shape (32 layers, GQA 32/8, untied): 16 GB of bf16, for benchmarks.
    "llama8B": ModelConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=14336,
                           vocab=128256, max_seq=8192, rms_eps=1e-5, rope_theta=500000.0,
                           rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192)),
    # Qwen2 style: q/k/v biases, large theta; small enough for fast tests.
    "qwen-tiny": ModelConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=384,
                             vocab=512, max_seq=512, rms_eps=1e-6, rope_theta=1000000.0, qkv_bias=True),
    # The families' features in small models, every one active (tests): Qwen3's q/k norms with
    # YaRN past its original context; Phi-3's partial rotary (3/4 of a head) with LongRoPE's long
    # factors (the context exceeds the original); SmolLM3's layers without RoPE (every 4th).
    "qwen3-tiny": ModelConfig(dim=256, n_layers=3, n_heads=8, n_kv_heads=2, head_dim=64, ffn_dim=768, vocab=1024,
                              max_seq=4096, rms_eps=1e-6, rope_theta=1000000.0, tied_embeddings=True, qk_norm=True,
                              rope_scaling=YarnScaling(4.0, 1024, 0.1 * math.log(4.0) + 1.0)),
    "phi3-tiny": ModelConfig(dim=256, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=768, vocab=1024,
                             max_seq=4096, rope_theta=10000.0, tied_embeddings=True, rope_dim=48,
                             rope_scaling=LongRopeScaling(_f32(1.0 + 0.02 * i for i in range(24)),
                                                          _f32(1.0 + 0.5 * i for i in range(24)), 512,
                                                          math.sqrt(1 + math.log(8.0) / math.log(512)))),
    "smollm3-tiny": ModelConfig(dim=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=768, vocab=1024,
                                max_seq=4096, rope_theta=5000000.0, tied_embeddings=True, no_rope_layers=(3,)),
    # Gemma 3's: head_dim 256, q/k norms, post-norms whose factors are 1 + w, GELU, the embedding
    # scaled by sqrt(dim), its own scores' scale, a 32-position window on all but every 3rd layer
    # (Gemma 3's files: 6th), whose RoPE base is its own; linear scaling on the global layers.
    "gemma3-tiny": ModelConfig(dim=256, n_layers=6, n_heads=2, n_kv_heads=1, head_dim=256, ffn_dim=768, vocab=1024,
                               max_seq=4096, rms_eps=1e-6, rope_theta=1000000.0, tied_embeddings=True, qk_norm=True,
                               rope_scaling=LinearScaling(8.0), post_norms=True, activation="gelu_tanh",
                               embed_scale=16.0, attn_scale=1 / math.sqrt(192), sliding_window=32, window_pattern=3,
                               rope_local_theta=10000.0, norm_plus_one=True),
    # The real dims of Qwen3-8B, Phi-4-mini and Gemma-3-4B (benchmarks).
    "gemma3-4B": ModelConfig(dim=2560, n_layers=34, n_heads=8, n_kv_heads=4, head_dim=256, ffn_dim=10240,
                             vocab=262208, max_seq=8192, rms_eps=1e-6, rope_theta=1000000.0, tied_embeddings=True,
                             qk_norm=True, rope_scaling=LinearScaling(8.0), post_norms=True, activation="gelu_tanh",
                             embed_scale=math.sqrt(2560), attn_scale=1 / 16.0, sliding_window=1024, window_pattern=6,
                             rope_local_theta=10000.0, norm_plus_one=True),
    "qwen3-8B": ModelConfig(dim=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=12288,
                            vocab=151936, max_seq=8192, rms_eps=1e-6, rope_theta=1000000.0, qk_norm=True),
    "phi4-mini": ModelConfig(dim=3072, n_layers=32, n_heads=24, n_kv_heads=8, head_dim=128, ffn_dim=8192,
                             vocab=200064, max_seq=8192, rope_theta=10000.0, tied_embeddings=True, rope_dim=96,
                             rope_scaling=LongRopeScaling((1.0,) * 48, _f32(1.0 + 0.6 * i for i in range(48)), 4096,
                                                          math.sqrt(1 + math.log(32.0) / math.log(4096)))),
}
# Mixtures of experts: Qwen3-MoE's (softmax, then the top 8 of 16, renormalized; q/k norms; layer 1
# dense, as mlp_only_layers makes it) and Mixtral's (the top 2 of 8 logits, then their softmax).
SHAPES.update({
    "qwen3moe-tiny": ModelConfig(dim=256, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=512, vocab=1024,
                                 max_seq=1024, rms_eps=1e-6, rope_theta=1000000.0, qk_norm=True, n_experts=16,
                                 n_experts_used=8, expert_ffn_dim=256, norm_topk_prob=True, mlp_only_layers=(1,)),
    "mixtral-tiny": ModelConfig(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=512, vocab=1024,
                                max_seq=1024, rope_theta=1000000.0, n_experts=8, n_experts_used=2, expert_ffn_dim=512,
                                routing="topk_softmax"),
    # Qwen2-MoE's: a shared expert under its sigmoid gate, every second layer sparse.
    "qwen2moe-tiny": ModelConfig(dim=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=512, vocab=1024,
                                 max_seq=1024, rms_eps=1e-6, rope_theta=1000000.0, qkv_bias=True, n_experts=8,
                                 n_experts_used=4, expert_ffn_dim=256, shared_expert_ffn_dim=512, moe_every=2),
})
# Qwen3.5 / Qwen3.6 hybrids (gated DeltaNet layers, three to each attention layer; gated attention
# over a quarter-rotated head of 256; norms of 1 + w): small ones with every feature for tests (the
# NumPy backend alone runs them), and the real dims of Qwen3.6-27B and Qwen3.6-35B-A3B for benches.
_Q35 = dict(rms_eps=1e-6, rope_theta=10000000.0, qk_norm=True, norm_plus_one=True, attn_output_gate=True,
            linear_conv_kernel=4)


def _qwen35(n_layers: int, **fields) -> ModelConfig:
    kinds = tuple("full_attention" if i % 4 == 3 else "linear_attention" for i in range(n_layers))
    return ModelConfig(n_layers=n_layers, layer_types=kinds, **_Q35, **fields)


SHAPES.update({
    "qwen3.5-tiny": _qwen35(8, dim=128, n_heads=4, n_kv_heads=2, head_dim=64, rope_dim=16, ffn_dim=256, vocab=1024,
                            max_seq=1024, linear_n_k_heads=1, linear_n_v_heads=2, linear_k_head_dim=128,
                            linear_v_head_dim=128),
    "qwen3.5moe-tiny": _qwen35(4, dim=128, n_heads=4, n_kv_heads=2, head_dim=64, rope_dim=16, ffn_dim=64, vocab=1024,
                               max_seq=1024, linear_n_k_heads=1, linear_n_v_heads=2, linear_k_head_dim=128,
                               linear_v_head_dim=128, n_experts=16, n_experts_used=4, expert_ffn_dim=64,
                               shared_expert_ffn_dim=64, norm_topk_prob=True),
    "qwen3.6-27B": _qwen35(64, dim=5120, n_heads=24, n_kv_heads=4, head_dim=256, rope_dim=64, ffn_dim=17408,
                           vocab=248320, max_seq=8192, linear_n_k_heads=16, linear_n_v_heads=48,
                           linear_k_head_dim=128, linear_v_head_dim=128),
    "qwen3.6-35B-A3B": _qwen35(40, dim=2048, n_heads=16, n_kv_heads=2, head_dim=256, rope_dim=64, ffn_dim=512,
                               vocab=248320, max_seq=8192, linear_n_k_heads=16, linear_n_v_heads=32,
                               linear_k_head_dim=128, linear_v_head_dim=128, n_experts=256, n_experts_used=8,
                               expert_ffn_dim=512, shared_expert_ffn_dim=512, norm_topk_prob=True),
})
# gpt-oss's (arcpy/model/gpt_oss.py): sinks, biases on q/k/v/o, the router and the experts, the
# clamped GLU, the top 4 logits' softmax, a window of 128 on even layers, YaRN (32 over 4,096, its
# ramp not truncated): a small one for tests (the NumPy backend alone runs it), and the real dims
# of gpt-oss-20b (24 layers, 32 experts of width 2,880; about 21B weights, 3.6B a token).
_OSS = dict(rms_eps=1e-5, rope_theta=150000.0, qkv_bias=True, o_bias=True, attn_sinks=True, expert_bias=True,
            swiglu_limit=7.0, swiglu_alpha=1.702, routing="topk_softmax", window_pattern=2,
            rope_scaling=YarnScaling(32.0, 4096, 0.1 * math.log(32.0) + 1.0, truncate=False))
SHAPES.update({
    "gpt-oss-tiny": ModelConfig(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=128, vocab=1024,
                                max_seq=1024, n_experts=8, n_experts_used=4, expert_ffn_dim=128, sliding_window=16,
                                **_OSS),
    "gpt-oss-20b": ModelConfig(dim=2880, n_layers=24, n_heads=64, n_kv_heads=8, head_dim=64, ffn_dim=2880,
                               vocab=201088, max_seq=8192, n_experts=32, n_experts_used=4, expert_ffn_dim=2880,
                               sliding_window=128, **_OSS),
})
# gpt-oss-test (the GPU tests'): gpt-oss-tiny with a window of 8 and its weights drawn at other
# scales (random_model's `scales`), so that its logits move with a rounding no further than another
# mixture's, not ten times as far (tests/test_gemv_inputs.py measures it and says why): q and k at
# unit scale (YaRN's factor sharpens the scores to a std of 1.8 alone, 7 with the q/k gain of 2); the sinks
# at a std of 2 (a seventh of a softmax); the experts' gate and up at a std of 4 (4% and 8% of them
# past the clamp), their down at 0.5/4^2 (the GLU grows as the square); the routers' logits at 0.5.
SHAPES["gpt-oss-test"] = dataclasses.replace(SHAPES["gpt-oss-tiny"], sliding_window=8)
_OSS_TEST_SCALES = {"self_attn.q_proj.weight": 0.5, "self_attn.k_proj.weight": 0.5, "self_attn.sinks": 4.0,
                    "mlp.gate.weight": 0.5, "mlp.experts.gate_proj.weight": 4.0, "mlp.experts.up_proj.weight": 4.0,
                    "mlp.experts.down_proj.weight": 0.5 / 4.0 ** 2}
# Gemma 4 (arcpy/model/gemma4.py; the NumPy backend alone runs it): a small one with every feature
# for tests (the full-attention layers' own head width, one kv head, k = v, proportional RoPE over a
# quarter of their heads; the experts beside the dense FFN; per-layer embeddings; the last two
# layers sharing K/V, their FFN twice as wide), and the real dims of Gemma-4-31B and Gemma-4-26B-A4B:
# sliding layers of head 256 with a window of 1,024, every 6th layer full attention with heads of
# 512, 25% of them turned at base 1M, the logits capped at 30.
_G4 = dict(rms_eps=1e-6, rope_theta=1000000.0, rope_local_theta=10000.0, tied_embeddings=True, qk_norm=True,
           post_norms=True, activation="gelu_tanh", attn_scale=1.0, gemma4_layer=True, k_eq_v=True, final_softcap=30.0)


def _gemma4(dim: int, head_dim: int, global_head_dim: int, **fields) -> ModelConfig:
    return ModelConfig(dim=dim, embed_scale=math.sqrt(dim), head_dim=head_dim, global_head_dim=global_head_dim,
                       global_rope_dim=global_head_dim // 4, **_G4, **fields)


SHAPES.update({
    "gemma4-tiny": _gemma4(128, 32, 64, n_layers=6, n_heads=4, n_kv_heads=2, global_n_kv_heads=1, ffn_dim=128,
                           vocab=1024, max_seq=1024, sliding_window=16, window_pattern=2, n_experts=8,
                           n_experts_used=2, expert_ffn_dim=32, norm_topk_prob=True, ple_dim=16, ple_vocab=1024,
                           kv_shared_layers=2, double_wide_mlp=True),
    # The dense layer alone: gemma4-tiny's attention and FFN, and a shape whose
    # global layers have heads of 512 (libarc's widest), 8 query heads over one kv head.
    "gemma4-dense-tiny": _gemma4(128, 32, 64, n_layers=6, n_heads=4, n_kv_heads=2, global_n_kv_heads=1, ffn_dim=128,
                                 vocab=1024, max_seq=2048, sliding_window=16, window_pattern=2),
    # The experts beside the dense FFN (libarc's mixture-of-experts layer) over gemma4-dense-tiny.
    "gemma4-moe-tiny": _gemma4(128, 32, 64, n_layers=6, n_heads=4, n_kv_heads=2, global_n_kv_heads=1, ffn_dim=128,
                               vocab=1024, max_seq=2048, sliding_window=16, window_pattern=2, n_experts=8,
                               n_experts_used=2, expert_ffn_dim=32, norm_topk_prob=True),
    # The E2B/E4B's forms over gemma4-dense-tiny: per-layer embeddings of 16, the last two layers
    # sharing K/V (one of each kind), their FFN twice as wide.
    "gemma4-ple-tiny": _gemma4(128, 32, 64, n_layers=6, n_heads=4, n_kv_heads=2, global_n_kv_heads=1, ffn_dim=128,
                               vocab=1024, max_seq=2048, sliding_window=16, window_pattern=2, ple_dim=16, ple_vocab=1024,
                               kv_shared_layers=2, double_wide_mlp=True),
    "gemma4-wide-test": _gemma4(128, 32, 512, n_layers=4, n_heads=8, n_kv_heads=4, global_n_kv_heads=1, ffn_dim=128,
                                vocab=1024, max_seq=4096, sliding_window=16, window_pattern=2),
    "gemma4-31B": _gemma4(5376, 256, 512, n_layers=60, n_heads=32, n_kv_heads=16, global_n_kv_heads=4,
                          ffn_dim=21504, vocab=262144, max_seq=8192, sliding_window=1024, window_pattern=6),
    "gemma4-26B-A4B": _gemma4(2816, 256, 512, n_layers=30, n_heads=16, n_kv_heads=8, global_n_kv_heads=2,
                              ffn_dim=2112, vocab=262144, max_seq=8192, sliding_window=1024, window_pattern=6,
                              n_experts=128, n_experts_used=8, expert_ffn_dim=704, norm_topk_prob=True),
})
# The bench's mixtures: Qwen3-30B-A3B (48 layers, 128 experts, top 8 of expert ffn 768) and
# Mixtral-8x7B (32 layers, 8 experts, top 2 of expert ffn 14336), quantized only.
_QWEN3_30B = ModelConfig(dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128, ffn_dim=6144, vocab=151936,
                         max_seq=8192, rms_eps=1e-6, rope_theta=1000000.0, qk_norm=True, n_experts=128,
                         n_experts_used=8, expert_ffn_dim=768, norm_topk_prob=True)
_MIXTRAL_8X7B = ModelConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=14336,
                            vocab=32000, max_seq=8192, rms_eps=1e-5, rope_theta=1000000.0, n_experts=8,
                            n_experts_used=2, expert_ffn_dim=14336, routing="topk_softmax")
# The Llama-3-70B shape (80 layers, GQA 64/8, untied): quantized only (141 GB of bf16 fit no GPU).
_LLAMA70B = ModelConfig(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128, ffn_dim=28672,
                        vocab=128256, max_seq=8192, rms_eps=1e-5, rope_theta=500000.0,
                        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192))
# A quantized mixture of experts: top 4 of 16 and a shared expert, each layer's experts in other
# formats (moe_tiny_mix).
_MOE_TINY_QUANT = ModelConfig(dim=256, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=512, vocab=512,
                              max_seq=512, rms_eps=1e-6, rope_theta=1000000.0, qk_norm=True, n_experts=16,
                              n_experts_used=4, expert_ffn_dim=256, norm_topk_prob=True, shared_expert_ffn_dim=256)
# Every quantized format in two small models, tiny-quant and tiny-quant-more, of this shape (the
# 256-weight blocks of the K formats and IQ4_XS fit every row).
_TINY_QUANT = ModelConfig(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=768, vocab=512,
                          max_seq=512, rope_theta=500000.0)


def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits(i_layer, n_layers): the layers its Q4_K_M mix gives Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _q4_k_m(name: str, layer: int, n_layers: int, n_experts: int = 0) -> int:
    """llama.cpp's Q4_K_M mix: Q4_K, Q6_K for the output and for attn_v and ffn_down (an MoE layer's
    ffn_down_exps too) where use_more_bits holds; in an 80-layer (70B) model the other attn_v are
    Q5_K (its rule for 70B); with 8 experts (Mixtral) attn_k and attn_v are Q8_0, attn_output Q5_K."""
    if name == LM_HEAD:
        return FORMAT_Q6_K
    if n_experts == 8 and name.endswith(("k_proj.weight", "v_proj.weight")):
        return FORMAT_Q8_0
    if n_experts == 8 and name.endswith("o_proj.weight"):
        return FORMAT_Q5_K
    if name.endswith(("v_proj.weight", "down_proj.weight")) and _use_more_bits(layer, n_layers):
        return FORMAT_Q6_K
    return FORMAT_Q5_K if n_layers == 80 and name.endswith("v_proj.weight") else FORMAT_Q4_K


def _gemma4_moe_q4km(name: str, layer: int, n_layers: int) -> int:
    """llama.cpp's Q4_K_M mix on Gemma-4-26B-A4B: its down matrices' rows (2,112 and 704 weights) are
    no whole number of 256-weight super-blocks, so they take its fallbacks, Q5_0 for Q4_K and Q8_0
    for Q6_K."""
    fmt = _q4_k_m(name, layer, n_layers)
    if name.endswith("down_proj.weight"):
        return {FORMAT_Q4_K: FORMAT_Q5_0, FORMAT_Q6_K: FORMAT_Q8_0}[fmt]
    return fmt


# tiny-quant's matrices by layer: q, k and v of layer 0 in three formats (the forward cannot fuse
# its QKV product), layer 1's in one; o, gate/up and down spread over the rest, one bf16.
_TINY_MIX = [
    {"q_proj": FORMAT_Q4_K, "k_proj": FORMAT_Q6_K, "v_proj": FORMAT_Q8_0, "o_proj": FORMAT_Q4_0,
     "gate_proj": FORMAT_Q5_K, "up_proj": FORMAT_Q5_K, "down_proj": FORMAT_Q4_1},
    {"q_proj": FORMAT_Q8_0, "k_proj": FORMAT_Q8_0, "v_proj": FORMAT_Q8_0, "o_proj": FORMAT_BF16,
     "gate_proj": FORMAT_Q4_0, "up_proj": FORMAT_Q4_0, "down_proj": FORMAT_Q4_K},
]


def _tiny_mix(name: str, layer: int, n_layers: int) -> int:
    return FORMAT_Q6_K if name == LM_HEAD else _TINY_MIX[layer][name.split(".")[-2]]


# tiny-quant-more: tiny-quant's shape in the formats tiny-quant does not hold, laid out alike.
_TINY_MORE_MIX = [
    {"q_proj": FORMAT_MXFP4, "k_proj": FORMAT_IQ4_NL, "v_proj": FORMAT_IQ4_XS, "o_proj": FORMAT_Q5_0,
     "gate_proj": FORMAT_Q5_1, "up_proj": FORMAT_Q5_1, "down_proj": FORMAT_Q3_K},
    {"q_proj": FORMAT_IQ4_NL, "k_proj": FORMAT_IQ4_NL, "v_proj": FORMAT_IQ4_NL, "o_proj": FORMAT_IQ4_XS,
     "gate_proj": FORMAT_Q2_K, "up_proj": FORMAT_Q2_K, "down_proj": FORMAT_Q5_0},
]


def _tiny_more_mix(name: str, layer: int, n_layers: int) -> int:
    return FORMAT_IQ4_XS if name == LM_HEAD else _TINY_MORE_MIX[layer][name.split(".")[-2]]


# moe-tiny-quant's matrices by layer: the experts' gate/up and down, the shared expert's; attention
# Q8_0, the lm_head Q6_K.
_MOE_TINY_MIX = [
    {"experts.gate_proj": FORMAT_Q4_K, "experts.up_proj": FORMAT_Q4_K, "experts.down_proj": FORMAT_Q6_K,
     "shared_expert.gate_proj": FORMAT_Q8_0, "shared_expert.up_proj": FORMAT_Q8_0, "shared_expert.down_proj": FORMAT_Q4_0},
    {"experts.gate_proj": FORMAT_Q8_0, "experts.up_proj": FORMAT_Q8_0, "experts.down_proj": FORMAT_Q4_1,
     "shared_expert.gate_proj": FORMAT_Q4_K, "shared_expert.up_proj": FORMAT_Q4_K, "shared_expert.down_proj": FORMAT_BF16},
    {"experts.gate_proj": FORMAT_Q5_K, "experts.up_proj": FORMAT_Q5_K, "experts.down_proj": FORMAT_Q4_0,
     "shared_expert.gate_proj": FORMAT_BF16, "shared_expert.up_proj": FORMAT_BF16, "shared_expert.down_proj": FORMAT_Q6_K},
]


def _moe_tiny_mix(name: str, layer: int, n_layers: int) -> int:
    if name == LM_HEAD:
        return FORMAT_Q6_K
    parts = name.split(".")
    return _MOE_TINY_MIX[layer].get(".".join(parts[-3:-1]), FORMAT_Q8_0)


# qwen3.5-tiny-quant's matrices: the DeltaNet's input product in two runs of two formats, its out
# projection in a third; the gated attention's q_proj (its gate's rows with it) and the rest Q8_0.
_Q35_TINY_MIX = {"in_proj_qkv": FORMAT_Q8_0, "in_proj_z": FORMAT_Q8_0, "in_proj_b": FORMAT_Q4_1,
                 "in_proj_a": FORMAT_Q4_1, "out_proj": FORMAT_Q4_0, "gate_proj": FORMAT_Q4_0, "up_proj": FORMAT_Q4_0,
                 "down_proj": FORMAT_Q4_1}


def _q35_tiny_mix(name: str, layer: int, n_layers: int) -> int:
    return FORMAT_Q8_0 if name == LM_HEAD else _Q35_TINY_MIX.get(name.split(".")[-2], FORMAT_Q8_0)
# moe-tiny-quant-more: moe-tiny-quant's shape with its experts in the formats moe-tiny-quant does
# not hold (layer 0's in MXFP4, as gpt-oss holds them); attention Q8_0, the lm_head MXFP4.
_MOE_TINY_MORE_MIX = [
    {"experts.gate_proj": FORMAT_MXFP4, "experts.up_proj": FORMAT_MXFP4, "experts.down_proj": FORMAT_MXFP4,
     "shared_expert.gate_proj": FORMAT_IQ4_XS, "shared_expert.up_proj": FORMAT_IQ4_XS, "shared_expert.down_proj": FORMAT_Q5_1},
    {"experts.gate_proj": FORMAT_IQ4_NL, "experts.up_proj": FORMAT_IQ4_NL, "experts.down_proj": FORMAT_Q5_0,
     "shared_expert.gate_proj": FORMAT_Q5_0, "shared_expert.up_proj": FORMAT_Q5_0, "shared_expert.down_proj": FORMAT_IQ4_NL},
    {"experts.gate_proj": FORMAT_Q2_K, "experts.up_proj": FORMAT_Q2_K, "experts.down_proj": FORMAT_Q3_K,
     "shared_expert.gate_proj": FORMAT_BF16, "shared_expert.up_proj": FORMAT_BF16, "shared_expert.down_proj": FORMAT_MXFP4},
]


def _moe_tiny_more_mix(name: str, layer: int, n_layers: int) -> int:
    if name == LM_HEAD:
        return FORMAT_MXFP4
    parts = name.split(".")
    return _MOE_TINY_MORE_MIX[layer].get(".".join(parts[-3:-1]), FORMAT_Q8_0)


def _oss_mix(name: str, layer: int, n_layers: int) -> int:
    """gpt-oss's experts in MXFP4, as its checkpoints store them; every other matrix Q8_0."""
    return FORMAT_MXFP4 if ".experts." in name else FORMAT_Q8_0


# Quantized presets: (the config, the format of each matrix tensor). A tied Llama-3.2-1B file's
# Q4_K_M quantizes token_embd as its output (Q6_K); loaded, it is a bf16 embedding and a
# quantized lm_head, untied, and so is the preset.
_QUANTIZED = {
    "llama1B-q4km": (dataclasses.replace(SHAPES["llama1B"], tied_embeddings=False), _q4_k_m),
    "llama8B-q4km": (SHAPES["llama8B"], _q4_k_m),
    "llama8B-q8": (SHAPES["llama8B"], lambda name, layer, n_layers: FORMAT_Q8_0),
    "qwen3-8B-q4km": (SHAPES["qwen3-8B"], _q4_k_m),
    # Qwen3-8B stretched to 131,072 positions as its model card says: YaRN, factor 4 over 32,768.
    "qwen3-8B-yarn-q4km": (dataclasses.replace(SHAPES["qwen3-8B"], max_seq=131072,
                                               rope_scaling=YarnScaling(4.0, 32768, 0.1 * math.log(4.0) + 1.0)),
                           _q4_k_m),
    "phi4-mini-q4km": (dataclasses.replace(SHAPES["phi4-mini"], tied_embeddings=False), _q4_k_m),
    "gemma3-4B-q4km": (dataclasses.replace(SHAPES["gemma3-4B"], tied_embeddings=False), _q4_k_m),
    "llama70B-q4km": (_LLAMA70B, _q4_k_m),
    "qwen3-30B-A3B-q4km": (_QWEN3_30B, _q4_k_m),
    "mixtral-8x7B-q4km": (_MIXTRAL_8X7B, lambda name, layer, n_layers: _q4_k_m(name, layer, n_layers, 8)),
    "qwen3.6-27B-q4km": (SHAPES["qwen3.6-27B"], _q4_k_m),
    "qwen3.6-35B-A3B-q4km": (SHAPES["qwen3.6-35B-A3B"], _q4_k_m),
    # Gemma-4-31B's dims (tied: its Q6_K token_embd loads as a bf16 embedding and a Q6_K lm_head, as
    # a tied Llama-3.2-1B file's does), in llama.cpp's Q4_K_M mix and in IQ4_XS throughout.
    "gemma4-31B-q4km": (dataclasses.replace(SHAPES["gemma4-31B"], tied_embeddings=False), _q4_k_m),
    "gemma4-31B-iq4xs": (dataclasses.replace(SHAPES["gemma4-31B"], tied_embeddings=False),
                         lambda name, layer, n_layers: FORMAT_Q6_K if name == LM_HEAD else FORMAT_IQ4_XS),
    "gemma4-26B-A4B-q4km": (dataclasses.replace(SHAPES["gemma4-26B-A4B"], tied_embeddings=False), _gemma4_moe_q4km),
    "qwen3.5-tiny-quant": (SHAPES["qwen3.5-tiny"], _q35_tiny_mix),
    "tiny-quant": (_TINY_QUANT, _tiny_mix),
    "moe-tiny-quant": (_MOE_TINY_QUANT, _moe_tiny_mix),
    "tiny-quant-more": (_TINY_QUANT, _tiny_more_mix),
    "moe-tiny-quant-more": (_MOE_TINY_QUANT, _moe_tiny_more_mix),
    "tiny-quant-tied": (dataclasses.replace(_TINY_QUANT, tied_embeddings=True), _tiny_mix),  # head: the bf16 embedding
    "gpt-oss-tiny-mxfp4": (SHAPES["gpt-oss-tiny"], _oss_mix),
    "gpt-oss-20b-mxfp4": (SHAPES["gpt-oss-20b"], _oss_mix),
    "gpt-oss-test-mxfp4": (SHAPES["gpt-oss-test"], _oss_mix),
}
SHAPES.update({name: cfg for name, (cfg, _) in _QUANTIZED.items()})
_SCALES = {"gpt-oss-test": _OSS_TEST_SCALES, "gpt-oss-test-mxfp4": _OSS_TEST_SCALES}  # preset_scales


def preset_formats(shape: str) -> dict[str, int]:
    """The arc_format of each matrix tensor of a preset (FORMAT_BF16 throughout for the bf16 ones)."""
    if shape not in SHAPES:
        raise InvalidArgumentError(f"unknown synthetic shape {shape!r} (choose from {', '.join(SHAPES)})")
    cfg = SHAPES[shape]
    mix = _QUANTIZED[shape][1] if shape in _QUANTIZED else (lambda name, layer, n_layers: FORMAT_BF16)
    return {name: mix(name, _layer_of(name), cfg.n_layers) for name in expected_tensors(cfg) if is_matrix(name)}


def preset_scales(shape: str) -> dict[str, float]:
    """The factors a preset's weights are drawn at (random_model's `scales`; empty for most presets)."""
    preset_formats(shape)  # refuses an unknown shape
    return dict(_SCALES.get(shape, {}))


def _layer_of(name: str) -> int:
    return int(name.split(".")[2]) if name.startswith("model.layers.") else 0

def synthetic_model(shape: str = "stories15M", seed: int = 0, max_seq: int | None = None) -> Model:
    """A preset of SHAPES with random weights, built in memory (the embedded default is stories15M;
    the matrices in the formats preset_formats gives, at the scales preset_scales gives)."""
    formats = preset_formats(shape)  # refuses an unknown shape
    cfg = SHAPES[shape]
    if max_seq is not None:
        cfg = dataclasses.replace(cfg, max_seq=max_seq)
    return random_model(cfg, seed=seed, name=shape, formats=formats, scales=preset_scales(shape))
