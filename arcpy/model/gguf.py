"""GGUF checkpoints (llama.cpp's one-file format): a decoder and its vocabulary, from one file.

    gguf_file   the container: header, metadata, tensor table, dequantization
    gguf_vocab  the tokenizer metadata, as a plain Vocabulary (arcpy.text builds the tokenizer)
    gguf        (here) the config, the tensors under Hugging Face names: open_gguf

Architectures: "llama" (Llama 2/3, Mistral, SmolLM), "qwen2" (q/k/v biases), "qwen3" (q/k norms),
"smollm3" (every 4th layer without RoPE), "mistral3" (the text model of Mistral Small 3.x) and
"phi3" (Phi-3, Phi-4: partial rotary, LongRoPE, q/k/v in one tensor and gate/up in ffn_up, split
into their parts on open); the metadata keys carry the architecture's name as their prefix. RoPE
scalings: Llama 3 (below), linear, YaRN and LongRoPE (its factors stored as tensors).

The projections and the output of types Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K stay quantized:
their blocks are repacked into arc.h's rows (quant_pack.from_gguf), the values unchanged. Every
other tensor is dequantized to float32 and rounded to bf16 words: the embedding always (a step reads
one row of it), the norms, and projections of other quantized types, which the model's notes list
in one line. With `quantized=False` every tensor is bf16. Every weight must be finite (a NaN scale
makes a block of NaN weights). A tied model whose token_embd is of a kept type gets an lm_head of
its own, the same blocks kept quantized beside the bf16 embedding, and an untied config.

Two things differ from a Hugging Face checkpoint. For "llama", "smollm3" and "mistral3", llama.cpp's
converter reorders the rows of each q and k head so that interleaved RoPE (pairs 2i, 2i+1) computes
what Hugging Face's rotate-half RoPE (pairs i, i + head_dim/2) does; the loader puts them back, bf16
or quantized rows alike (the others run rotate-half RoPE in llama.cpp too, and their rows are stored
as they are). Llama 3 frequency scaling travels as a tensor of per-pair divisors (rope_freqs), from
which the RopeScaling parameters are recovered and checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from arcpy.checks import is_int, quoted, require
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.model.bf16 import require_finite
from arcpy.model.config import (
    EMBED,
    FINAL_NORM,
    LM_HEAD,
    LinearScaling,
    LongRopeScaling,
    ModelConfig,
    RopeScaling,
    Scaling,
    YarnScaling,
    is_matrix,
    iter_tensors,
    rope_inv_freq,
)
from arcpy.model.gguf_file import GGUFFile, TensorInfo, read_gguf
from arcpy.model.gguf_vocab import read_vocabulary
from arcpy.model.quant import QuantTensor
from arcpy.model.quant_pack import GGUF_FORMATS, from_gguf
from arcpy.model.tensors import Model, Tensor
from arcpy.vocabulary import Vocabulary

GGUF_SUFFIX = ".gguf"
# Hugging Face names (arcpy.model) -> GGUF names.
_GLOBAL_NAMES = {EMBED: "token_embd.weight", FINAL_NORM: "output_norm.weight", LM_HEAD: "output.weight"}
_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_ROPE_FREQS = "rope_freqs.weight"
_ROPE_LONG, _ROPE_SHORT = "rope_factors_long.weight", "rope_factors_short.weight"
# qwen2: q/k/v biases; qwen3: q/k norms; smollm3: every 4th layer without RoPE; mistral3: the text
# model of Mistral Small 3.x; phi3 (Phi-3, Phi-4): partial rotary, LongRoPE, fused qkv and gate/up.
_ARCHITECTURES = ("llama", "qwen2", "qwen3", "smollm3", "mistral3", "phi3", "gemma3")
# gemma3's norms after attention: its own output norms, and the FFN's input norm as llama's.
_POST_NORM_NAMES = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                    "post_feedforward_layernorm": "post_ffw_norm"}
_GEMMA3_PATTERN, _GEMMA3_LOCAL_BASE = 6, 10000.0  # llama.cpp's defaults where the file names none
# Their converter reorders q/k rows for interleaved RoPE (module docstring); the others rotate halves.
_PERMUTED = ("llama", "smollm3", "mistral3")
_NO_ROPE_EVERY = 4  # smollm3: layers i with (i + 1) % 4 == 0 have no RoPE, as llama.cpp runs them
_LLAMA3_CONTEXT = 8192  # the converter's default original context for Llama 3 scaling
_READERS = 8  # threads reading tensors, at most
_UNQUANTIZED = ("F32", "F16", "BF16", "F64")  # types that are not a quantization (bf16 loses nothing worth a note)


@dataclass(frozen=True)
class GGUFCheckpoint:
    """An open GGUF file whose header and config have been read and checked; the weights are read
    by `model()`, the tokenizer metadata by `vocabulary()`. Every failure is one ModelFileError
    line naming the file; nothing is returned half-read."""

    file: GGUFFile
    config: ModelConfig         # the model's: untied where the lm_head is token_embd kept quantized
    quantized: bool = True      # keep the matrix tensors of the kept types quantized
    head_from_embedding: bool = False  # the file is tied; the model's lm_head is token_embd's blocks

    def vocabulary(self) -> Vocabulary:
        with _reading(self.file.path):
            return read_vocabulary(self.file.meta, self.config.vocab)

    def model(self, progress=None) -> Model:
        """The weights under their Hugging Face names: bf16 words, and QuantTensors where kept
        quantized (see the module's docstring); the model's notes say which quantized tensors
        were dequantized. `progress(done, total)`, when given, is called after each tensor is
        read (a large file takes seconds)."""
        with _reading(self.file.path):
            return _model(self, progress)


def open_gguf(path, max_seq: int | None = None, quantized: bool = True) -> GGUFCheckpoint:
    """Open a Llama-family GGUF file: its header, metadata and config, checked. `max_seq` caps the
    context, as in `load_model`; `quantized=False` asks for every tensor in bf16."""
    if "\0" in os.fspath(path):
        raise ModelFileError(f"{quoted(os.fspath(path))}: not a valid path")
    if max_seq is not None:
        require(is_int(max_seq) and max_seq > 0, f"max_seq must be a positive int, got {max_seq!r}")
    require(isinstance(quantized, bool), f"quantized must be True or False, got {quantized!r}")
    path = Path(path)
    with _reading(path):
        if not path.exists():
            raise ModelFileError(f"{path}: no such GGUF file")
        f = read_gguf(path)
        cfg = _config(f)
        f = dataclasses.replace(f, tensors=_unfused(f, cfg))
        if max_seq is not None:
            cfg = dataclasses.replace(cfg, max_seq=min(cfg.max_seq, max_seq))
        embed = f.tensors.get(_GLOBAL_NAMES[EMBED])
        head = quantized and cfg.tied_embeddings and embed is not None and embed.qtype in GGUF_FORMATS
        if head:
            cfg = dataclasses.replace(cfg, tied_embeddings=False)
        return GGUFCheckpoint(f, cfg, quantized, head)


def _unfused(f: GGUFFile, cfg: ModelConfig) -> dict[str, TensorInfo]:
    """The file's tensors with each fused projection (phi3: attn_qkv, and ffn_up holding gate and up)
    replaced by its parts: row ranges of the same bytes, named as the unfused files name them, so
    everything after reads them as if stored apart. A fused tensor of the wrong shape is one line."""
    if f.meta.text("general.architecture") != "phi3":
        return f.tensors
    out = dict(f.tensors)
    q, kv, ffn = cfg.q_dim, cfg.kv_dim, cfg.ffn_dim
    for i in range(cfg.n_layers):
        for fused, parts in ((f"blk.{i}.attn_qkv.weight", (("attn_q", q), ("attn_k", kv), ("attn_v", kv))),
                             (f"blk.{i}.ffn_up.weight", (("ffn_gate", ffn), ("ffn_up", ffn)))):
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


def load_gguf_model(path, max_seq: int | None = None, quantized: bool = True) -> Model:
    """The model of a GGUF file, without its vocabulary (what `load_model` returns for one)."""
    return open_gguf(path, max_seq, quantized).model()


@contextlib.contextmanager
def _reading(path: Path):
    try:
        yield
    except OSError as e:  # unreadable file, I/O error: still one line naming the file
        raise ModelFileError(f"{e.filename or path}: cannot read ({e.strerror or e})") from None


# ---------------------------------------------------------------------------------------------
# the config


def _config(f: GGUFFile) -> ModelConfig:
    m, path = f.meta, f.path
    arch = m.text("general.architecture")
    if arch not in _ARCHITECTURES:
        raise ModelFileError(f"{path}: unsupported architecture {quoted(arch)} "
                             f"(supported: {', '.join(_ARCHITECTURES)})")
    a = f"{arch}."  # every key below is the architecture's
    if m.integer(a + "expert_count", 0) > 0:
        raise ModelFileError(f"{path}: mixture-of-experts models are not supported")
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
    window = m.integer(a + "attention.sliding_window", 0) if arch in ("phi3", "gemma3") else 0
    if window > 0 and arch == "phi3":  # Phi-3 windows every layer: a context no longer than the window is exact
        max_seq = min(max_seq, window)
    if m.number(a + "final_logit_softcapping", 0.0) != 0.0:
        raise ModelFileError(f"{path}: {a}final_logit_softcapping is not supported")
    tokens = m.values.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if isinstance(tokens, list) else m.integer(a + "vocab_size")
    stated = m.integer(a + "vocab_size", vocab)
    if stated != vocab:
        raise ModelFileError(f"{path}: {a}vocab_size {stated} differs from the {vocab} tokens listed")
    try:
        cfg = ModelConfig(
            dim=dim, n_layers=m.integer(a + "block_count"), n_heads=n_heads,
            n_kv_heads=m.integer(a + "attention.head_count_kv", n_heads), head_dim=head_dim,
            ffn_dim=m.integer(a + "feed_forward_length"), vocab=vocab,
            max_seq=max_seq,
            rms_eps=m.number(a + "attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta=m.number(a + "rope.freq_base", 10000.0),
            rope_scaling=_scaling(f, a, rope_dim),
            tied_embeddings=_GLOBAL_NAMES[LM_HEAD] not in f.tensors,
            qkv_bias=arch == "qwen2",
            qk_norm=arch in ("qwen3", "gemma3"),
            rope_dim=0 if rope_dim == head_dim else rope_dim,
            no_rope_layers=tuple(i for i in range(m.integer(a + "block_count")) if (i + 1) % _NO_ROPE_EVERY == 0)
            if arch == "smollm3" else (),
            **(_gemma3(m, a, dim, n_heads, head_dim, window) if arch == "gemma3" else {}),
        )
        if _ROPE_FREQS in f.tensors:
            orig = m.integer(a + "rope.scaling.original_context_length", _LLAMA3_CONTEXT)
            cfg = _with_rope_freqs(cfg, f, orig)
    except InvalidArgumentError as e:
        raise ModelFileError(f"{path}: {e}") from None
    return cfg


def _gemma3(m, a: str, dim: int, n_heads: int, head_dim: int, window: int) -> dict:
    """gemma3's fields as llama.cpp runs them: post-norms (the files store Gemma's norms with their
    1 added), GELU, the embedding scaled by sqrt(dim), the scores by 1/sqrt(head_dim) (by
    1/sqrt(dim / heads) for the 62-layer 27B), a window on all but every 6th layer (or the file's
    sliding_window_pattern), whose RoPE base is rope.freq_base_swa (10000 by default), unscaled."""
    big = m.integer(a + "block_count") == 62
    out = {"post_norms": True, "activation": "gelu_tanh", "embed_scale": math.sqrt(dim),
           "attn_scale": 1.0 / math.sqrt(dim // n_heads if big else head_dim)}
    if window > 0:
        out.update(sliding_window=window, window_pattern=m.integer(a + "attention.sliding_window_pattern",
                                                                   _GEMMA3_PATTERN),
                   rope_local_theta=m.number(a + "rope.freq_base_swa", _GEMMA3_LOCAL_BASE))
    return out


def _scaling(f: GGUFFile, a: str, rope_dim: int) -> Scaling | None:
    """The RoPE scaling the metadata names: linear, YaRN, LongRoPE (its factors stored as tensors),
    or none (Llama 3 scaling travels as rope_freqs, read by _with_rope_freqs)."""
    m, path = f.meta, f.path
    kind = m.text(a + "rope.scaling.type", "none")
    factor = m.number(a + "rope.scaling.factor", 1.0)
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
                           m.number(a + "rope.scaling.yarn_beta_slow", 1.0))
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


# ---------------------------------------------------------------------------------------------
# the tensors


def unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: (n_heads*head_dim, ...) rows back to rotate-half order.

    Within each head the converter moved row j*head_dim/2 + i (j = 0, 1) to row 2i + j, so that
    interleaved RoPE pairs the rows rotate-half RoPE pairs. Returns a C-contiguous copy.
    """
    rows = w.shape[0]
    require(n_heads > 0 and rows % (2 * n_heads) == 0,
            f"unpermute_rotary_rows: {rows} rows do not split into {n_heads} heads of even size")
    return np.ascontiguousarray(w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
                                .swapaxes(1, 2).reshape(w.shape))


def _gguf_name(hf_name: str, post_norms: bool = False) -> str:
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.N.<module>.weight (or .bias)
    module, kind = rest.rsplit(".", 1)
    names = {**_LAYER_NAMES, **_POST_NORM_NAMES} if post_norms else _LAYER_NAMES
    return f"blk.{layer}.{names[module]}.{kind}"


def _model(ckpt: GGUFCheckpoint, progress=None) -> Model:
    """Match the file's tensors to the config, then read each under its HF name."""
    f, cfg = ckpt.file, ckpt.config
    file_cfg = dataclasses.replace(cfg, tied_embeddings=True) if ckpt.head_from_embedding else cfg
    wanted: dict[str, TensorInfo] = {}
    # iter_tensors stops at the first tensor the file lacks: a claimed billion layers costs nothing.
    for hf_name, shape in iter_tensors(file_cfg):
        name = _gguf_name(hf_name, cfg.post_norms)
        info = f.tensors.get(name)
        if info is None:
            raise ModelFileError(f"{f.path}: missing tensor {quoted(name)}")
        if info.shape != shape:
            raise ModelFileError(f"{f.path}: tensor {quoted(name)} has shape {quoted(list(info.shape))}, "
                                 f"config expects {list(shape)}")
        wanted[hf_name] = info
    extra = sorted(set(f.tensors) - {info.name for info in wanted.values()} - {_ROPE_FREQS, _ROPE_LONG, _ROPE_SHORT})
    if extra:
        raise ModelFileError(f"{f.path}: unexpected tensor {quoted(extra[0])} (not part of this config)")
    f.check_types(wanted.values())
    # llama's q/k rows are reordered for interleaved RoPE; qwen2's are stored as they are.
    permuted = f.meta.text("general.architecture") in _PERMUTED
    dequantized = [info for hf_name, info in wanted.items()  # quantized tensors of types not kept, made bf16
                   if ckpt.quantized and info.qtype.name not in _UNQUANTIZED and not _kept(ckpt, hf_name, info)
                   and (is_matrix(hf_name) or (hf_name == EMBED and cfg.tied_embeddings))]

    def read(hf_name: str, info: TensorInfo) -> Tensor:
        where = f"{f.path}: tensor {quoted(info.name)}"
        if _kept(ckpt, hf_name, info):
            t = from_gguf(info.qtype, info.shape, f.raw(info), where)  # refuses a NaN or infinite scale
        else:
            t = f.words(info)
            require_finite(t, where)  # stored, or made by a block's scales
        if permuted and hf_name.endswith("q_proj.weight"):
            return _unpermute(t, cfg.n_heads)
        if permuted and hf_name.endswith("k_proj.weight"):
            return _unpermute(t, cfg.n_kv_heads)
        return t

    # Tensors are read in threads (NumPy lets go of the GIL in its loops), handed back in order.
    tensors: dict[str, Tensor] = {}
    total = len(wanted) + ckpt.head_from_embedding
    pool = ThreadPoolExecutor(max_workers=min(_READERS, os.cpu_count() or 1))
    try:
        for done, (hf_name, t) in enumerate(zip(wanted, pool.map(read, wanted, wanted.values())), 1):
            tensors[hf_name] = t
            if progress is not None:
                progress(done, total)
    finally:
        pool.shutdown(cancel_futures=True)  # after a failure, read nothing more
    if ckpt.head_from_embedding:
        info = wanted[EMBED]
        tensors[LM_HEAD] = from_gguf(info.qtype, info.shape, f.raw(info), f"{f.path}: tensor {quoted(info.name)}")
        if progress is not None:
            progress(total, total)
    notes = [_dequantized_note(f.path, dequantized, ckpt)] if dequantized else []
    return Model(cfg, tensors, name=f.path.stem, source=str(f.path), notes=notes)


_PAIRED = {"mlp.gate_proj.weight": "mlp.up_proj.weight", "mlp.up_proj.weight": "mlp.gate_proj.weight"}


def _partner(hf_name: str) -> str | None:
    """The other half of a layer's [gate; up] matrix, which the GPU reads as one, in one format."""
    head, _, tail = hf_name.partition(".mlp.")
    other = _PAIRED.get("mlp." + tail)
    return f"{head}.{other}" if other and tail else None


def _kept(ckpt: GGUFCheckpoint, hf_name: str, info: TensorInfo) -> bool:
    """Whether a tensor stays quantized: a matrix of a kept type, unless all-bf16 was asked for,
    or (gate, up) it is the half of a layer's [gate; up] whose other half is of another type."""
    if not (ckpt.quantized and is_matrix(hf_name) and info.qtype in GGUF_FORMATS):
        return False
    partner = _partner(hf_name)
    return partner is None or ckpt.file.tensors[_gguf_name(partner)].qtype == info.qtype


def _unpermute(t: Tensor, n_heads: int) -> Tensor:
    if isinstance(t, QuantTensor):
        return t.with_data(unpermute_rotary_rows(t.data, n_heads))
    return unpermute_rotary_rows(t, n_heads)


def _dequantized_note(path: Path, infos: list[TensorInfo], ckpt: GGUFCheckpoint) -> str:
    """One line: which quantized tensors were made bf16, by type, layers as ranges, and why."""
    groups: dict[tuple[str, str], list[int]] = {}
    for info in infos:
        parts = info.name.split(".")
        if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit():
            groups.setdefault((info.qtype.name, ".".join(parts[2:])), []).append(int(parts[1]))
        else:
            groups.setdefault((info.qtype.name, info.name), [])
    listed = "; ".join(f"{qtype} {name}" + (f" (blk {_ranges(layers)})" if layers else "")
                       for (qtype, name), layers in groups.items())
    kept = ", ".join(t.name for t in GGUF_FORMATS)
    mixed = sorted({int(info.name.split(".")[1]) for info in infos
                    if info.qtype in GGUF_FORMATS and info.name.split(".")[-2] == "ffn_gate"})
    why = f"the GPU keeps {kept} quantized" + (
        f", and reads a layer's ffn_gate and ffn_up as one matrix of one type (of two types in blk "
        f"{_ranges(mixed)})" if mixed else "")
    return (f"{path.name}: {len(infos)} quantized tensor{'s' if len(infos) != 1 else ''} dequantized to bf16 "
            f"({why}): {listed}")


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(f"{start}-{n}" if n != start else f"{n}")
            start = None
    return ", ".join(out)
