"""The config of a GGUF file, from its metadata (and, for some scalings, tensors), as llama.cpp
reads it for each architecture arcpy runs; and its fused tensors split into their parts.

The keys every architecture shares are read here, each family's own by its module
(arcpy.model.families, looked up by general.architecture: "llama", "qwen2", "qwen3", "smollm3",
"mistral3", "phi3", "gemma3", "qwen3moe"). The mixtures of experts ("qwen3moe", and "llama" with
expert_count > 0: Mixtral) hold their experts' matrices as 3-D tensors (ffn_gate_exps, ffn_up_exps,
ffn_down_exps: one matrix per expert), read as the stacked matrices of the tensor table. The
metadata keys carry the architecture's name as their prefix.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from arcpy.checks import quoted
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.model.config import LinearScaling, LongRopeScaling, ModelConfig, RopeScaling, Scaling, YarnScaling, rope_inv_freq
from arcpy.model.families import Family, gguf_experts, gguf_family
from arcpy.model.families.family import EVERY_LAYER, GGUF_OUTPUT, NO_WINDOW
from arcpy.model.gguf_file import GGUFFile, TensorInfo

_ROPE_FREQS = "rope_freqs.weight"
_ROPE_LONG, _ROPE_SHORT = "rope_factors_long.weight", "rope_factors_short.weight"
ROPE_TENSORS = (_ROPE_FREQS, _ROPE_LONG, _ROPE_SHORT)  # read into the config, not the weights
_EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps")
_LLAMA3_CONTEXT = 8192  # the converter's default original context for Llama 3 scaling


def gguf_config(f: GGUFFile) -> ModelConfig:
    """The file's config, checked; every failure is one ModelFileError line naming the file."""
    m, path = f.meta, f.path
    arch = m.text("general.architecture")
    family = gguf_family(arch, path)
    a = f"{arch}."  # every key below is the architecture's
    experts = gguf_experts(family, m, a, path)
    own = family.gguf_config(f, a, _vocab(f, a), experts)  # a family that reads every key itself (Gemma 4)
    if own is not None:
        return own
    dim = m.integer(a + "embedding_length")
    n_heads = m.integer(a + "attention.head_count")
    if n_heads <= 0:
        raise ModelFileError(f"{path}: metadata {quoted(a + 'attention.head_count')} must be positive, got {n_heads}")
    head_dim = m.integer(a + "attention.key_length", dim // n_heads)
    value_dim = m.integer(a + "attention.value_length", head_dim)
    rope_dim = m.integer(a + "rope.dimension_count", head_dim)
    if value_dim != head_dim or not (0 < rope_dim <= head_dim and rope_dim % 2 == 0):
        raise ModelFileError(f"{path}: heads with key size {head_dim}, value size {value_dim} and {rope_dim} "
                             "rotated dims are not supported (key and value sizes must match, the rotated dims "
                             "be even and at most the key size)")
    for key in ("attention.temperature_scale", "rope.scaling.yarn_log_multiplier"):
        if m.number(a + key, 0.0) != 0.0:
            raise ModelFileError(f"{path}: {a}{key} is not supported")
    max_seq = m.integer(a + "context_length")
    window = m.integer(a + "attention.sliding_window", 0) if family.window != NO_WINDOW else 0
    if window > 0 and family.window == EVERY_LAYER:  # a context no longer than the window is exact
        max_seq = min(max_seq, window)
    if m.number(a + "final_logit_softcapping", 0.0) != 0.0:
        raise ModelFileError(f"{path}: {a}final_logit_softcapping is not supported")
    vocab = _vocab(f, a)
    try:
        ffn = m.integer(a + "feed_forward_length") if family.gguf_dense_ffn else experts.get("expert_ffn_dim", 0)
        cfg = ModelConfig(
            dim=dim, n_layers=m.integer(a + "block_count") - m.integer(a + "nextn_predict_layers", 0),
            n_heads=n_heads, n_kv_heads=m.integer(a + "attention.head_count_kv", n_heads), head_dim=head_dim,
            ffn_dim=ffn, vocab=vocab,
            max_seq=max_seq,
            rms_eps=m.number(a + "attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta=m.number(a + "rope.freq_base", 10000.0),
            rope_scaling=_scaling(f, a, rope_dim, family.gguf_yarn_truncate),
            tied_embeddings=GGUF_OUTPUT not in f.tensors,
            qkv_bias=family.qkv_bias,
            qk_norm=family.qk_norm,
            rope_dim=0 if rope_dim == head_dim else rope_dim,
            **family.gguf_fields(m, a, (dim, n_heads, head_dim), window),
            **experts,
        )
        if _ROPE_FREQS in f.tensors:
            orig = m.integer(a + "rope.scaling.original_context_length", _LLAMA3_CONTEXT)
            cfg = _with_rope_freqs(cfg, f, orig)
    except InvalidArgumentError as e:
        raise ModelFileError(f"{path}: {e}") from None
    return cfg


def _vocab(f: GGUFFile, a: str) -> int:
    """The tokens the file lists (else its vocab_size), checked against its vocab_size."""
    m = f.meta
    tokens = m.values.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if isinstance(tokens, list) else m.integer(a + "vocab_size")
    stated = m.integer(a + "vocab_size", vocab)
    if stated != vocab:
        raise ModelFileError(f"{f.path}: {a}vocab_size {stated} differs from the {vocab} tokens listed")
    return vocab


def _scaling(f: GGUFFile, a: str, rope_dim: int, truncate: bool) -> Scaling | None:
    """The RoPE scaling the metadata names: linear, YaRN (its ramp truncated or not, as the family
    says), LongRoPE (its factors stored as tensors), or none (Llama 3 scaling travels as rope_freqs,
    read by _with_rope_freqs)."""
    m, path = f.meta, f.path
    kind = m.text(a + "rope.scaling.type", "none")
    factor = m.number(a + "rope.scaling.factor", 1.0)
    if kind == "none" and _ROPE_LONG in f.tensors:
        kind = "longrope"  # phi3's converter writes the factors' tensors and no type: llama.cpp reads them
    if kind in ("none", "linear") and factor == 1.0:
        return None  # a factor of 1 scales nothing
    if kind == "linear":
        return LinearScaling(factor)
    orig = m.integer(a + "rope.scaling.original_context_length", 0)
    if kind == "yarn":
        # llama.cpp's YaRN: cos and sin times yarn_attn_factor and 0.1 ln(factor) + 1.
        mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        return YarnScaling(factor, orig, m.number(a + "rope.scaling.yarn_attn_factor", 1.0) * mscale,
                           m.number(a + "rope.scaling.yarn_beta_fast", 32.0),
                           m.number(a + "rope.scaling.yarn_beta_slow", 1.0), truncate)
    if kind == "longrope":
        factors = []
        for name in (_ROPE_SHORT, _ROPE_LONG):
            info = f.tensors.get(name)
            if info is None or info.shape != (rope_dim // 2,):
                raise ModelFileError(f"{path}: LongRoPE scaling needs tensor {quoted(name)} of shape [{rope_dim // 2}]")
            f.check_types([info])
            factors.append(tuple(float(v) for v in f.values(info)))
        return LongRopeScaling(factors[0], factors[1], orig, m.number(a + "rope.scaling.attn_factor", 1.0))
    raise ModelFileError(f"{path}: unsupported rope scaling type {quoted(kind)} "
                         "(supported: linear, yarn, longrope, Llama 3 scaling stored as rope_freqs)")


def _with_rope_freqs(cfg: ModelConfig, f: GGUFFile, orig: int) -> ModelConfig:
    """The config with the Llama 3 scaling whose per-pair frequency divisors rope_freqs holds.

    The converter stores, per pair, 1 for short wavelengths, the scale factor F for long ones and
    1 / ((1 - s)/F + s) between, where s = (orig/wavelength - low) / (high - low) is linear in
    orig/wavelength. Two pairs in the blend fix low and high; with fewer, the band's edges do. The
    result must reproduce every divisor, else the table is not Llama 3 scaling and is refused.
    """
    info = f.tensors[_ROPE_FREQS]
    where = f"{f.path}: tensor {quoted(info.name)}"
    if info.shape != (cfg.head_dim // 2,):
        raise ModelFileError(f"{where} has shape {quoted(list(info.shape))}, config expects [{cfg.head_dim // 2}]")
    f.check_types([info])
    div = f.values(info).astype(np.float64)
    if not (np.all(np.isfinite(div)) and div.min() >= 1.0 - 1e-6):
        raise ModelFileError(f"{where}: rope frequency divisors must be finite and at least 1")
    top = div.max()
    if top <= 1.0 + 1e-6:
        return cfg
    freq = float(cfg.rope_theta) ** (-np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    x = orig * freq / (2.0 * math.pi)  # orig / wavelength, falling along the head
    one, full = np.isclose(div, 1.0, rtol=1e-5), np.isclose(div, top, rtol=1e-5)
    mid = np.flatnonzero(~(one | full))
    s = (1.0 / div - 1.0 / top) / (1.0 - 1.0 / top)
    low = high = math.nan
    if len(mid) >= 2 and s[mid[0]] != s[mid[-1]]:
        i, j = mid[0], mid[-1]
        span = (x[i] - x[j]) / (s[i] - s[j])
        low = x[i] - s[i] * span
        high = low + span
    elif len(mid) < 2 and full.any() and one.any():
        low, high = x[full].max(), x[one].min()
        if len(mid) == 1:
            high = low + (x[mid[0]] - low) / s[mid[0]]
    try:
        scaled = dataclasses.replace(cfg, rope_scaling=RopeScaling(float(top), float(low), float(high), orig))
        ok = np.allclose(rope_inv_freq(scaled), freq / div, rtol=1e-4, atol=0)
    except InvalidArgumentError:
        ok = False
    if not ok:
        raise ModelFileError(f"{where} does not hold a Llama 3 frequency scaling (the only kind supported)")
    return scaled


def unfused(f: GGUFFile, cfg: ModelConfig, family: Family) -> dict[str, TensorInfo]:
    """The file's tensors with each fused projection of the family (phi3: attn_qkv, and ffn_up
    holding gate and up) replaced by its parts: row ranges of the same bytes, named as the unfused
    files name them, so everything after reads them as if stored apart. A fused tensor of the
    wrong shape is one line."""
    if cfg.n_experts:
        return _flat_experts(f)
    fused_parts = family.gguf_fused(cfg)
    if not fused_parts:
        return f.tensors
    out = dict(f.tensors)
    for i in range(cfg.n_layers):
        for name, parts in fused_parts.items():
            fused = f"blk.{i}.{name}.weight"
            info = f.tensors.get(fused)
            if info is None:
                continue
            rows = sum(n for _, n in parts)
            if info.shape != (rows, cfg.dim):
                raise ModelFileError(f"{f.path}: tensor {quoted(fused)} has shape {quoted(list(info.shape))}, config "
                                     f"expects {[rows, cfg.dim]} (the parts {' + '.join(str(n) for _, n in parts)})")
            del out[fused]
            row_bytes, at = info.nbytes // rows, info.start
            for part, n in parts:
                name = f"blk.{i}.{part}.weight"
                out[name] = dataclasses.replace(info, name=name, dims=(cfg.dim, n), start=at, nbytes=n * row_bytes)
                at += n * row_bytes
    return out


def _flat_experts(f: GGUFFile) -> dict[str, TensorInfo]:
    """The file's tensors with each 3-D expert tensor (ne: [cols, rows, experts]) read as one
    matrix of experts * rows rows, expert e's after expert e-1's, and each experts' bias (gpt-oss's;
    ne: [cols, experts]) as one vector, expert e's after expert e-1's: the same bytes."""
    out = dict(f.tensors)
    for name, info in f.tensors.items():
        if name.split(".")[-2] in _EXPERT_TENSORS and len(info.dims) == 3:
            cols, rows, experts = info.dims
            out[name] = dataclasses.replace(info, dims=(cols, rows * experts))
        elif name.split(".")[-2] in _EXPERT_TENSORS and name.endswith(".bias") and len(info.dims) == 2:
            out[name] = dataclasses.replace(info, dims=(info.dims[0] * info.dims[1],))
    return out


def unread_layers(f: GGUFFile, cfg: ModelConfig) -> list[str]:
    """The file's tensors of layers past the config's: a multi-token prediction layer's, which
    llama.cpp's converter appends (nextn_predict_layers of them) and arcpy does not read; and the
    k and v tensors a Gemma 4 layer sharing K/V may hold, which it does not read."""
    shared = [f"blk.{i}.{name}.weight" for i in range(cfg.n_layers - cfg.kv_shared_layers, cfg.n_layers)
              for name in ("attn_k", "attn_v", "attn_k_norm")]
    if not f.meta.integer(f.meta.text("general.architecture") + ".nextn_predict_layers", 0):
        return shared
    return shared + [name for name in f.tensors if name.startswith("blk.") and name.split(".")[1].isdigit()
                     and int(name.split(".")[1]) >= cfg.n_layers]
