"""gpt-oss (arcpy/model/gpt_oss.py describes its layer): attention with q/k/v/o biases and sinks,
a window on every other layer, YaRN whose ramp is not truncated, and on every layer a mixture of
experts with biases and a clamped GLU, routed by the top k logits' softmax.

Its Hugging Face files name the router mlp.router and store each layer's experts fused: either
mlp.experts.gate_up_proj (experts, dim, 2 x width), gate and up interleaved on the last axis
(column 2j is gate row j, 2j + 1 up row j), and mlp.experts.down_proj (experts, width, dim), each
expert's matrices transposed; or, as the published checkpoints do, both in MXFP4
(arcpy/model/mxfp4.py): <name>_blocks and <name>_scales whose rows are the model's (gate and up
rows interleaved, down's dim rows), unmoved. gate_up_proj_bias (experts, 2 x width) interleaves
as the matrix does; down_proj_bias is (experts, dim). The readers here take either form into the
table's stacked matrices (bf16 words; MXFP4's values are exact in bf16).

llama.cpp's files ("gpt-oss") split gate and up apart (ffn_gate_exps, ffn_up_exps and their
.bias) and name the sinks attn_sinks.weight, the FFN's input norm post_attention_norm. Their
MXFP4 experts (ggml type 39) are read as the GGUF loader reads any type it decodes.
"""

from __future__ import annotations

from functools import partial
from typing import Mapping

import numpy as np

from arcpy.checks import quoted
from arcpy.errors import ModelFileError
from arcpy.model.bf16 import f32_to_bf16
from arcpy.model.config import ModelConfig
from arcpy.model.families.family import BY_LAYER, GGUF_LAYER_NAMES, Family, Made
from arcpy.model.families.hf_values import flag, full_attention_every, integer, number, size
from arcpy.model.gpt_oss import SINKS, SWIGLU_ALPHA, SWIGLU_LIMIT, uses_oss_ops
from arcpy.model.mxfp4 import BLOCK, BLOCK_BYTES, decode
from arcpy.model.safetensors import READABLE, TensorEntry, entry_bytes, read_bf16_words

_EVERY = 2  # the layers' kinds where config.json lists none: sliding, full, sliding, ...
_GGUF_NAMES = {**GGUF_LAYER_NAMES, "post_attention_layernorm": "post_attention_norm", SINKS: "attn_sinks.weight"}


class GptOss(Family):
    name = "gpt_oss"
    hf_classes = ("GptOssForCausalLM",)
    gguf_arch = "gpt-oss"
    qkv_bias = True
    window = BY_LAYER
    hf_constants = {"attention_bias": True}
    gguf_names = _GGUF_NAMES
    gguf_dense_ffn = False  # no dense FFN: the experts' width stands in
    gguf_yarn_truncate = False  # the model's YaRN, as config.json states it (llama.cpp's truncates)

    def holds(self, cfg: ModelConfig) -> bool:
        return uses_oss_ops(cfg)  # no other family's files hold any of them

    def hf_fields(self, d: Mapping, source: str, n_layers: int, head_dim: int) -> dict:
        """Sinks, every bias, the clamped GLU (swiglu_limit, swiglu_alpha), the experts (their width
        is intermediate_size), and the window on the layers layer_types names sliding. Checkpoints
        quantized otherwise than in MXFP4 are refused."""
        if not flag(d, "attention_bias", source, True):
            raise ModelFileError(f"{source}: attention_bias=false is not supported (gpt-oss's attention has biases)")
        quant = d.get("quantization_config")
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        if quant is not None and method != "mxfp4":
            raise ModelFileError(f"{source}: quantization_config {quoted(method)} is not supported (mxfp4 only)")
        out = {"n_experts": integer(d, "num_local_experts", source),
               "n_experts_used": integer(d, "num_experts_per_tok", source),
               "expert_ffn_dim": integer(d, "intermediate_size", source), "routing": "topk_softmax",
               "attn_sinks": True, "o_bias": True, "expert_bias": True,
               "swiglu_limit": number(d, "swiglu_limit", source, SWIGLU_LIMIT),
               "swiglu_alpha": number(d, "swiglu_alpha", source, SWIGLU_ALPHA)}
        every = full_attention_every(d, source, n_layers, _EVERY)
        if every != 1:
            out.update(sliding_window=size(d, "sliding_window", source), window_pattern=every)
        return out

    def to_hf(self, cfg: ModelConfig, d: dict) -> None:
        d.update(num_local_experts=cfg.n_experts, num_experts_per_tok=cfg.n_experts_used,
                 intermediate_size=cfg.expert_ffn_dim, sliding_window=cfg.sliding_window or None,
                 layer_types=["sliding_attention" if cfg.window(i) else "full_attention" for i in range(cfg.n_layers)],
                 swiglu_limit=cfg.swiglu_limit, swiglu_alpha=cfg.swiglu_alpha)

    def hf_tensors(self, entries: dict[str, TensorEntry], cfg: ModelConfig) -> tuple[dict, dict[str, Made]]:
        """Each layer's router under the table's name (mlp.gate), and its fused experts, bf16 or
        MXFP4, as the table's stacked matrices and biases."""
        out, made = dict(entries), {}
        for i in range(cfg.n_layers):
            p = f"model.layers.{i}."
            for part in ("weight", "bias"):
                if p + "mlp.router." + part in out:
                    out[p + "mlp.gate." + part] = out.pop(p + "mlp.router." + part)
            made.update(_layer_experts(out, p, cfg))
        return out, made

    def hf_written(self, tensors: Mapping, cfg: ModelConfig) -> dict:
        """The router as mlp.router, and each layer's experts fused as transformers writes them
        (bf16): gate and up interleaved into gate_up_proj (experts, dim, 2 x width), down_proj
        (experts, width, dim), and their biases beside them."""
        e, f, d = cfg.n_experts, cfg.expert_ffn_dim, cfg.dim
        out = {}
        for name, t in tensors.items():
            head, _, tail = name.partition(".mlp.")
            if tail.startswith("gate."):
                out[f"{head}.mlp.router.{tail[len('gate.'):]}"] = t
            elif tail.startswith("experts.gate_proj."):  # gate's rows, then up's, interleaved
                kind = tail.rsplit(".", 1)[1]
                up = tensors[f"{head}.mlp.experts.up_proj.{kind}"]
                fused = np.empty((e, 2 * f, *t.shape[1:]), np.uint16)
                fused[:, 0::2], fused[:, 1::2] = t.reshape(e, f, *t.shape[1:]), up.reshape(e, f, *t.shape[1:])
                out[f"{head}.mlp.experts.gate_up_proj" + ("_bias" if kind == "bias" else "")] = (
                    fused if kind == "bias" else np.ascontiguousarray(fused.transpose(0, 2, 1)))
            elif tail.startswith("experts.down_proj."):
                kind = tail.rsplit(".", 1)[1]
                split = t.reshape(e, d, *t.shape[1:])
                out[f"{head}.mlp.experts.down_proj" + ("_bias" if kind == "bias" else "")] = (
                    split if kind == "bias" else np.ascontiguousarray(split.transpose(0, 2, 1)))
            elif not tail.startswith("experts.up_proj."):  # up is written in gate_up_proj
                out[name] = t
        return out

    def gguf_experts(self, m, a: str, n: int) -> dict:
        """As llama.cpp runs them: the top k logits' softmax, biases, the clamped GLU of limit 7
        and alpha 1.702 (its files name neither)."""
        return {"n_experts": n, "n_experts_used": m.integer(a + "expert_used_count"),
                "expert_ffn_dim": m.integer(a + "expert_feed_forward_length"), "routing": "topk_softmax",
                "expert_bias": True, "swiglu_limit": SWIGLU_LIMIT, "swiglu_alpha": SWIGLU_ALPHA}

    def gguf_fields(self, m, a: str, dims: tuple[int, int, int], window: int) -> dict:
        """Sinks and the o_proj bias; a window on all but every 2nd layer (or the file's
        sliding_window_pattern), as llama.cpp runs it."""
        out = {"attn_sinks": True, "o_bias": True}
        if window > 0:
            out.update(sliding_window=window,
                       window_pattern=m.integer(a + "attention.sliding_window_pattern", _EVERY))
        return out


def _layer_experts(entries: dict[str, TensorEntry], p: str, cfg: ModelConfig) -> dict[str, Made]:
    """Layer `p`'s fused experts taken out of `entries` -> the table's stacked matrices and
    biases, each made by its reader; a fused tensor of the wrong shape or dtype, half of an MXFP4
    pair, or a matrix stored both in bf16 and MXFP4, is one line."""
    e, f, d = cfg.n_experts, cfg.expert_ffn_dim, cfg.dim
    made = {}
    for fused, (rows, cols), parts in (("gate_up_proj", (2 * f, d), ("gate", "up")), ("down_proj", (d, f), ("down",))):
        name = p + "mlp.experts." + fused
        plain, blocks, scales, bias = (entries.pop(name + s, None) for s in ("", "_blocks", "_scales", "_bias"))
        n = len(parts)
        if plain is not None and (blocks is not None or scales is not None):
            raise ModelFileError(f"{plain.file}: tensor {quoted(name)} is stored both in bf16 and in MXFP4")
        if plain is not None:
            _check(plain, name, (e, cols, rows), READABLE)
            readers = [partial(_read_transposed, plain, name, j, n) for j in range(n)]
        elif blocks is not None or scales is not None:
            if blocks is None or scales is None:
                have, lack = ("_blocks", "_scales") if blocks is not None else ("_scales", "_blocks")
                raise ModelFileError(f"{(blocks or scales).file}: tensor {quoted(name + lack)} is missing beside "
                                     f"{quoted(name + have)}")
            if cols % BLOCK:
                raise ModelFileError(f"{blocks.file}: tensor {quoted(name + '_blocks')}: rows of {cols} values do "
                                     f"not split into MXFP4 blocks of {BLOCK}")
            _check(blocks, name + "_blocks", (e, rows, cols // BLOCK, BLOCK_BYTES), ("U8",))
            _check(scales, name + "_scales", (e, rows, cols // BLOCK), ("U8",))
            readers = [partial(_read_mxfp4, blocks, scales, name, j, n) for j in range(n)]
        else:
            continue  # the table's check names the missing matrix
        for part, read in zip(parts, readers):
            made[f"{p}mlp.experts.{part}_proj.weight"] = Made((e * rows // n, cols), read)
        if bias is not None:
            _check(bias, name + "_bias", (e, rows), READABLE)
            for j, part in enumerate(parts):
                made[f"{p}mlp.experts.{part}_proj.bias"] = Made((e * rows // n,),
                                                                 partial(_read_bias, bias, name + "_bias", j, n))
    return made


def _check(entry: TensorEntry, name: str, shape: tuple[int, ...], dtypes) -> None:
    if entry.dtype not in dtypes:
        raise ModelFileError(f"{entry.file}: tensor {quoted(name)} has unsupported dtype {quoted(entry.dtype)} "
                             f"({', '.join(dtypes)})")
    if entry.shape != shape:
        raise ModelFileError(f"{entry.file}: tensor {quoted(name)} has shape {quoted(list(entry.shape))}, "
                             f"config expects {list(shape)}")


def _read_transposed(entry: TensorEntry, name: str, j: int, n: int, maps: dict) -> np.ndarray:
    """Rows j, j + n, ... of each expert's matrix stored transposed (experts, cols, rows), stacked."""
    part = read_bf16_words(name, entry, maps)[:, :, j::n].transpose(0, 2, 1)
    return np.ascontiguousarray(part).reshape(-1, part.shape[2])


def _read_mxfp4(blocks: TensorEntry, scales: TensorEntry, name: str, j: int, n: int, maps: dict) -> np.ndarray:
    """Rows j, j + n, ... of each expert's MXFP4 matrix (experts, rows, blocks), decoded, stacked."""
    b = entry_bytes(blocks, maps).reshape(blocks.shape)[:, j::n]
    s = entry_bytes(scales, maps).reshape(scales.shape)[:, j::n]
    values = decode(b, s, f"{blocks.file}: tensor {quoted(name + '_blocks')}")
    return f32_to_bf16(values.reshape(-1, values.shape[-1]))


def _read_bias(entry: TensorEntry, name: str, j: int, n: int, maps: dict) -> np.ndarray:
    """Values j, j + n, ... of each expert's bias (experts, rows), stacked."""
    return np.ascontiguousarray(read_bf16_words(name, entry, maps)[:, j::n]).reshape(-1)


GPT_OSS = GptOss()
