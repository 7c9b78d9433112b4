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

libarc's layer program and tensor table know neither the sinks nor the biases nor the clamped
GLU (arc.h): arcpy.model.native adds their tensors to such a config's table and puts the NumPy
reference's own ops in place of libarc's (OPS below), and the CUDA backend refuses such a model
in one line (cuda_refusal), as it does the hybrids (arcpy/model/hybrid.py).
"""

from __future__ import annotations

from arcpy.checks import is_finite_real, quoted, require
from arcpy.codes import OP_ATTEND, OP_ATTN_OUT, OP_MOE_IN, OP_MOE_OUT

SWIGLU_LIMIT, SWIGLU_ALPHA = 7.0, 1.702  # gpt-oss's clamped GLU (llama.cpp's files name neither)
# The NumPy reference's ops in place of libarc's (arc_layer_op numbers stop well below them):
# the attention with sinks, o_proj with its bias, and the experts with their biases and clamped GLU.
OP_ATTEND_SINKS, OP_ATTN_OUT_BIAS, OP_MOE_IN_OSS, OP_MOE_OUT_OSS = 101, 102, 103, 104
OP_NAMES = {OP_ATTEND_SINKS: "ATTEND_SINKS", OP_ATTN_OUT_BIAS: "ATTN_OUT_BIAS", OP_MOE_IN_OSS: "MOE_IN_OSS",
            OP_MOE_OUT_OSS: "MOE_OUT_OSS"}
_REPLACED = (OP_ATTEND, OP_ATTN_OUT, OP_MOE_IN, OP_MOE_OUT)  # libarc's ops that program() may replace
SINKS = "self_attn.sinks"  # a layer's sinks, by their Hugging Face name (no .weight)
# The tensors the experts' biases add, by the suffix of the stacked matrix each follows: expert e's
# values after expert e-1's, as the matrices stack their rows.
EXPERT_BIASES = {"mlp.experts.gate_proj.weight": "mlp.experts.gate_proj.bias",
                 "mlp.experts.up_proj.weight": "mlp.experts.up_proj.bias",
                 "mlp.experts.down_proj.weight": "mlp.experts.down_proj.bias"}


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


def tensors_after(cfg) -> dict[str, tuple[tuple[str, tuple[int, ...]], ...]]:
    """The tensors gpt-oss's fields add to a layer, by the suffix of the table's tensor each
    follows (where that one is present): (suffix, shape) each."""
    out: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {}
    attention = ((("self_attn.o_proj.bias", (cfg.dim,)),) if cfg.o_bias else ()) + (
        ((SINKS, (cfg.n_heads,)),) if cfg.attn_sinks else ())
    if attention:
        out["self_attn.o_proj.weight"] = attention
    if cfg.expert_bias:
        e = cfg.n_experts
        out["mlp.gate.weight"] = (("mlp.gate.bias", (e,)),)
        for matrix, bias in EXPERT_BIASES.items():
            out[matrix] = ((bias, (e * (cfg.dim if "down" in matrix else cfg.expert_ffn_dim),)),)
    return out


def program(ops: list[int], cfg) -> list[int]:
    """A layer's program with the reference's ops in place of libarc's where the config needs them."""
    swap = {}
    if cfg.attn_sinks:
        swap[OP_ATTEND] = OP_ATTEND_SINKS
    if cfg.o_bias:
        swap[OP_ATTN_OUT] = OP_ATTN_OUT_BIAS
    if _oss_experts(cfg):
        swap.update({OP_MOE_IN: OP_MOE_IN_OSS, OP_MOE_OUT: OP_MOE_OUT_OSS})
    return [swap.get(op, op) for op in ops]


def cuda_refusal(cfg) -> str:
    """The CUDA backend's one line for a config that needs the reference's ops, naming them."""
    needed = [op for op in program(list(_REPLACED), cfg) if op in OP_NAMES]
    return (f"gpt-oss's attention sinks, biases and clamped GLU need ops libarc lacks "
            f"({', '.join(OP_NAMES[op] for op in needed)}): they run on the numpy backend only so far: "
            "use --backend numpy")
