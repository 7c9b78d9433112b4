"""gpt-oss's layer: what it adds to the Llama layer with q/k/v biases, its tensors and ops, and
what the CUDA backend does not run yet.

A gpt-oss layer (transformers' GptOssDecoderLayer; llama.cpp's gpt-oss) is a Llama layer whose
- attention has biases on q, k, v and o (o_bias), and a learned sink per query head
  (self_attn.sinks, attn_sinks): a logit that joins the softmax's denominator and nothing else,
  so a head may give its positions less than all of its weight: p_j = exp(s_j) / (sum_i exp(s_i) +
  exp(sink));
- FFN is a mixture of experts on every layer: the router has a bias (mlp.gate.bias), routes by the
  top k logits and then their softmax ("topk_softmax"); each expert's gate, up and down have biases
  (expert_bias), and its GLU is clamped (swiglu_limit > 0): g = min(gate, limit), u = clamp(up,
  -limit, limit), out = g * sigmoid(swiglu_alpha * g) * (u + 1) (limit 7, alpha 1.702);
- layers alternate a window of 128 positions (even layers) and full attention (odd ones): the
  config's sliding_window and window_pattern 2; RoPE is YaRN (factor 32 over 4,096 positions),
  its ramp not truncated.
The checkpoints store the experts' matrices in MXFP4 (arcpy/model/mxfp4.py).

libarc's tensor table holds the sinks and the biases (arc_model.h: ARC_TENSOR_SINKS, BO and the
MOE_*_BIAS vectors, under the config's attn_sinks, o_bias and expert_bias) and names the clamped
GLU ARC_ACT_SWIGLU_LIMIT (limit 7, alpha 1.702 fixed); the layer program is Llama's MoE layer, each
op reading what the config adds, in the NumPy reference and in libarc's kernels alike. The CUDA
backend refuses a clamped GLU of other constants (cuda_refusal).
"""

from __future__ import annotations

from arcpy.checks import is_finite_real, quoted, require

SWIGLU_LIMIT, SWIGLU_ALPHA = 7.0, 1.702  # gpt-oss's clamped GLU (llama.cpp's files name neither)
SINKS = "self_attn.sinks"  # a layer's sinks, by their Hugging Face name (no .weight)


def uses_oss_ops(cfg) -> bool:
    """Whether the config has sinks, an o_proj bias, biased experts or the clamped GLU (what
    libarc does not run)."""
    return cfg.attn_sinks or cfg.o_bias or _oss_experts(cfg)


def _oss_experts(cfg) -> bool:
    return cfg.expert_bias or cfg.swiglu_limit > 0


def check_gpt_oss(cfg) -> None:
    """ModelConfig's checks of its gpt-oss fields (InvalidArgumentError, one line each)."""
    require(all(isinstance(getattr(cfg, f), bool) for f in ("attn_sinks", "o_bias", "expert_bias")),
            "attn_sinks, o_bias and expert_bias must be bool")
    for field in ("swiglu_limit", "swiglu_alpha"):
        v = getattr(cfg, field)
        require(is_finite_real(v) and v >= 0, f"{field} must be a finite number >= 0, got {quoted(v)}")
    require(not _oss_experts(cfg) or cfg.n_experts > 0, "expert_bias and swiglu_limit need n_experts > 0")
    require(cfg.swiglu_limit == 0 or cfg.swiglu_alpha > 0, "the clamped GLU (swiglu_limit > 0) needs swiglu_alpha > 0")


def cuda_refusal(cfg) -> str | None:
    """The CUDA backend's one line for a clamped GLU of other constants than libarc's
    (ARC_ACT_SWIGLU_LIMIT: gpt-oss's limit 7, alpha 1.702); None where libarc runs the config."""
    if cfg.swiglu_limit == 0 or (cfg.swiglu_limit, cfg.swiglu_alpha) == (SWIGLU_LIMIT, SWIGLU_ALPHA):
        return None
    return (f"libarc's clamped GLU is gpt-oss's (limit 7, alpha 1.702); this model's has limit {cfg.swiglu_limit:g} "
            f"and alpha {cfg.swiglu_alpha:g}: it runs on the numpy backend only: use --backend numpy")
