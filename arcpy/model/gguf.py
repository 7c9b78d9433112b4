"""GGUF checkpoints (llama.cpp's one-file format): a decoder and its vocabulary, from one file.

    gguf_file   the container: header, metadata, tensor table, dequantization
    gguf_config the config from the metadata, and fused tensors split into their parts
    gguf_vocab  the tokenizer metadata, as a plain Vocabulary (arcpy.text builds the tokenizer)
    gguf        (here) the config, the tensors under Hugging Face names: open_gguf

Architectures and their configs: gguf_config.py, and each family's module in arcpy.model.families.

The projections and the output of the types quant_pack.GGUF_FORMATS lists (Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4) stay quantized:
their blocks are repacked into arc.h's rows (quant_pack.from_gguf), the values unchanged. Every
other tensor is dequantized to float32 and rounded to bf16 words: the embedding always (a step reads
one row of it), the norms, and projections of other quantized types, which the model's notes list
in one line. With `quantized=False` every tensor is bf16. Every weight must be finite (a NaN scale
makes a block of NaN weights). A tied model whose token_embd is of a kept type gets an lm_head of
its own, the same blocks kept quantized beside the bf16 embedding, and an untied config.

Two things differ from a Hugging Face checkpoint. For "llama", "smollm3" and "mistral3" (the
families whose gguf_permuted is set), llama.cpp's converter reorders the rows of each q and k head
so that interleaved RoPE (pairs 2i, 2i+1) computes what Hugging Face's rotate-half RoPE (pairs i,
i + head_dim/2) does; the loader puts them back, bf16 or quantized rows alike (the others run
rotate-half RoPE in llama.cpp too, and their rows are stored as they are). Llama 3 frequency scaling travels as a tensor of per-pair divisors (rope_freqs), from
which the RopeScaling parameters are recovered and checked.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from arcpy.checks import is_int, quoted, require
from arcpy.errors import ModelFileError
from arcpy.files import reading
from arcpy.model.bf16 import require_finite
from arcpy.model.config import ModelConfig
from arcpy.model.families import Family, gguf_family
from arcpy.model.families.family import GGUF_GLOBAL_NAMES
from arcpy.model.gguf_config import ROPE_TENSORS, gguf_config, unfused, unread_layers
from arcpy.model.gguf_file import GGUFFile, TensorInfo, read_gguf
from arcpy.model.gguf_vocab import read_vocabulary
from arcpy.model import mtp
from arcpy.model.native import EMBED, FINAL_NORM, LM_HEAD, is_matrix, iter_tensors, layer_prefix
from arcpy.model.quant import QuantTensor
from arcpy.model.quant_pack import GGUF_FORMATS, from_gguf
from arcpy.model.tensors import Model, Tensor, require_nonzero
from arcpy.vocabulary import Vocabulary

GGUF_SUFFIX = ".gguf"
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

    @property
    def family(self) -> Family:
        """The family the file's general.architecture names."""
        return gguf_family(self.file.meta.text("general.architecture"), self.file.path)

    def vocabulary(self) -> Vocabulary:
        with reading(self.file.path):
            return read_vocabulary(self.file.meta, self.config.vocab)

    def model(self, progress=None) -> Model:
        """The weights under their Hugging Face names: bf16 words, and QuantTensors where kept
        quantized (see the module's docstring); the model's notes say which quantized tensors
        were dequantized. `progress(done, total)`, when given, is called after each tensor is
        read (a large file takes seconds)."""
        with reading(self.file.path):
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
    with reading(path):
        if not path.exists():
            raise ModelFileError(f"{path}: no such GGUF file")
        f = read_gguf(path)
        cfg = gguf_config(f)
        f = dataclasses.replace(f, tensors=unfused(f, cfg, gguf_family(f.meta.text("general.architecture"), path)))
        if max_seq is not None:
            cfg = dataclasses.replace(cfg, max_seq=min(cfg.max_seq, max_seq))
        embed = f.tensors.get(GGUF_GLOBAL_NAMES[EMBED])
        head = quantized and cfg.tied_embeddings and embed is not None and embed.qtype in GGUF_FORMATS
        if head:
            cfg = dataclasses.replace(cfg, tied_embeddings=False)
        return GGUFCheckpoint(f, cfg, quantized, head)


def load_gguf_model(path, max_seq: int | None = None, quantized: bool = True) -> Model:
    """The model of a GGUF file, without its vocabulary (what `load_model` returns for one)."""
    return open_gguf(path, max_seq, quantized).model()


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


def _gguf_name(hf_name: str, family: Family) -> str:
    """A tensor's name in the family's GGUF files."""
    if hf_name in GGUF_GLOBAL_NAMES:
        return GGUF_GLOBAL_NAMES[hf_name]
    if hf_name in family.gguf_global_names:
        return family.gguf_global_names[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.N.<module>.weight (or .bias)
    if rest in family.gguf_names:  # a tensor the family names whole
        return f"blk.{layer}.{family.gguf_names[rest]}"
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{family.gguf_names[module]}.{kind}"


# Newer converters may write an expert layer's gate and up matrices (and their biases) as one
# tensor, ffn_gate_up_exps: each expert's gate rows, then its up rows. Either form is read.
_FUSED_EXPERTS = {"ffn_gate_exps": 0, "ffn_up_exps": 1}


def _file_name(f: GGUFFile, hf_name: str, family: Family) -> tuple[str, int | None]:
    """A tensor's name in the file `f`, and which half it is (0 gate, 1 up) where the file holds it
    in a fused ffn_gate_up_exps (None: the tensor is whole)."""
    name = _gguf_name(hf_name, family)
    blk, layer, module, kind = (name.split(".", 3) + ["", "", ""])[:4]
    if module == "ffn_gate_up_exps":  # a family whose files always fuse them (Gemma 4)
        return name, 0 if ".experts.gate_proj." in hf_name else 1
    fused = f"blk.{layer}.ffn_gate_up_exps.{kind}"
    if name not in f.tensors and blk == "blk" and module in _FUSED_EXPERTS and fused in f.tensors:
        return fused, _FUSED_EXPERTS[module]
    return name, None


def _expert_half(t, cfg: ModelConfig, half: int):
    """The gate (half 0) or up (1) rows of each expert of a fused ffn_gate_up_exps tensor: bf16
    words, a bias, or quantized rows alike."""
    rows = t.data if isinstance(t, QuantTensor) else t
    e, f = cfg.n_experts, cfg.expert_ffn_dim
    part = np.ascontiguousarray(rows.reshape(e, 2, f, -1)[:, half].reshape(e * f, -1))
    if isinstance(t, QuantTensor):
        return QuantTensor(t.format, (part.shape[0], t.cols), part)
    return part.reshape(e * f) if rows.ndim == 1 else part


def _model(ckpt: GGUFCheckpoint, progress=None, held: dict[str, Tensor] | None = None) -> Model:
    """Match the file's tensors to the config, then read each under its HF name."""
    f, cfg, family = ckpt.file, ckpt.config, ckpt.family
    file_cfg = dataclasses.replace(cfg, tied_embeddings=True) if ckpt.head_from_embedding else cfg
    wanted: dict[str, TensorInfo] = {}
    halves: dict[str, int] = {}  # the tensors read as half of a fused ffn_gate_up_exps
    # iter_tensors stops at the first tensor the file lacks: a claimed billion layers costs nothing.
    for hf_name, shape in iter_tensors(file_cfg):
        name, half = _file_name(f, hf_name, family)
        info = f.tensors.get(name)
        if info is None:
            fused = " (or the experts' fused ffn_gate_up_exps)" if name.split(".")[2:3] in (["ffn_gate_exps"],
                                                                                         ["ffn_up_exps"]) else ""
            raise ModelFileError(f"{f.path}: missing tensor {quoted(name)}{fused}")
        shape = family.gguf_shape(hf_name, shape)
        if half is not None:
            halves[hf_name], shape = half, (2 * shape[0], *shape[1:])
        if info.shape != shape:
            raise ModelFileError(f"{f.path}: tensor {quoted(name)} has shape {quoted(list(info.shape))}, "
                                 f"config expects {list(shape)}")
        wanted[hf_name] = info
    extra = sorted(set(f.tensors) - {info.name for info in wanted.values()} - set(ROPE_TENSORS)
                   - set(unread_layers(f, cfg)))
    if extra:
        raise ModelFileError(f"{f.path}: unexpected tensor {quoted(extra[0])} (not part of this config)")
    f.check_types(wanted.values())
    # llama's q/k rows are reordered for interleaved RoPE; qwen2's are stored as they are.
    permuted = family.gguf_permuted
    dequantized = list({info.name: info for hf_name, info in wanted.items()  # quantized, not kept: made bf16
                        if ckpt.quantized and info.qtype.name not in _UNQUANTIZED and not _kept(ckpt, hf_name, info)
                        and (is_matrix(hf_name) or (hf_name == EMBED and cfg.tied_embeddings))}.values())

    def read(hf_name: str, info: TensorInfo) -> Tensor:
        where = f"{f.path}: tensor {quoted(info.name)}"
        if _kept(ckpt, hf_name, info):
            t = from_gguf(info.qtype, info.shape, f.raw(info), where)  # refuses a NaN or infinite scale
        elif hf_name.endswith(family.gguf_float):  # transformed in float32 by the family, then rounded once
            t = f.values(info)
            if not np.all(np.isfinite(t)):
                raise ModelFileError(f"{where} holds a NaN or infinite value")
        else:
            t = f.words(info)
            require_finite(t, where)  # stored, or made by a block's scales
        if hf_name in halves:
            t = _expert_half(t, cfg, halves[hf_name])
        if permuted and hf_name.endswith("q_proj.weight"):
            return _unpermute(t, cfg.n_heads)
        if permuted and hf_name.endswith("k_proj.weight"):
            return _unpermute(t, cfg.n_kv_heads)
        return family.gguf_tensor(hf_name, t, cfg)

    # Tensors are read in threads (NumPy lets go of the GIL in its loops), handed back in order.
    # `held`: tensors read already (a sub-model's: the MTP layer's embedding and head), not read again.
    tensors: dict[str, Tensor] = dict(held or {})
    reading = {n: info for n, info in wanted.items() if n not in tensors}
    total = len(reading) + ckpt.head_from_embedding
    pool = ThreadPoolExecutor(max_workers=min(_READERS, os.cpu_count() or 1))
    try:
        for done, (hf_name, t) in enumerate(zip(reading, pool.map(read, reading, reading.values())), 1):
            tensors[hf_name] = t
            if progress is not None:
                progress(done, total)
    finally:
        pool.shutdown(cancel_futures=True)  # after a failure, read nothing more
    if ckpt.head_from_embedding and LM_HEAD not in tensors:
        info = wanted[EMBED]
        tensors[LM_HEAD] = from_gguf(info.qtype, info.shape, f.raw(info), f"{f.path}: tensor {quoted(info.name)}")
        if progress is not None:
            progress(total, total)
    notes = [_dequantized_note(f.path, dequantized, ckpt)] if dequantized else []
    layer, mtp_notes = _mtp_tensors(ckpt, tensors) if held is None else ({}, [])
    model = Model(cfg, tensors, name=f.path.stem, source=str(f.path), notes=notes + mtp_notes, mtp=layer)
    require_nonzero(model)
    return model


def _mtp_tensors(ckpt: GGUFCheckpoint, tensors: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """Qwen3.5's multi-token prediction layer (arcpy.model.mtp), block N = the model's layer count,
    where the metadata's nextn_predict_layers says the file holds one: its decoder layer read as
    the one layer of a model of it (block N as block 0, nextn.shared_head_norm as the final norm,
    token_embd and output the model's `tensors`, not read again), and nextn's eh_proj, enorm and hnorm
    as bf16 words -> (its tensors, no notes); none -> ({}, []); malformed or incomplete -> ({}, a note
    saying why)."""
    f, cfg = ckpt.file, ckpt.config
    a = f.meta.text("general.architecture") + "."
    if not cfg.layer_types or f.meta.integer(a + "nextn_predict_layers", 0) < 1:
        return {}, []
    block = f"blk.{cfg.n_layers}."
    renamed = {"blk.0." + n[len(block):]: info for n, info in f.tensors.items()
               if n.startswith(block) and not n.startswith(block + "nextn.")}
    shared = (GGUF_GLOBAL_NAMES[EMBED], GGUF_GLOBAL_NAMES[LM_HEAD])  # the model's: held, not read again
    renamed.update({n: f.tensors[n] for n in shared if n in f.tensors})
    head_norm = f.tensors.get(block + mtp.GGUF_NAMES[mtp.NORM])
    if head_norm is not None:
        renamed[GGUF_GLOBAL_NAMES[FINAL_NORM]] = head_norm
    try:
        sub = _model(dataclasses.replace(ckpt, config=mtp.mtp_config(cfg), file=dataclasses.replace(
            f, tensors={n: dataclasses.replace(info, name=n) for n, info in renamed.items()})),
                     held={n: tensors[n] for n in (EMBED, LM_HEAD) if n in tensors})
        out = {mtp.LAYER + n[len(layer_prefix(0)):]: t for n, t in sub.tensors.items() if n.startswith(layer_prefix(0))}
        out[mtp.NORM] = sub.tensors[FINAL_NORM]
        for name in (mtp.FC, mtp.NORM_EMBEDDING, mtp.NORM_HIDDEN):
            info = f.tensors.get(block + mtp.GGUF_NAMES[name])
            shape = mtp.mtp_shapes(cfg)[name]
            if info is None or info.shape != shape:
                raise ModelFileError(f"tensor {quoted(block + mtp.GGUF_NAMES[name])} is missing or not {list(shape)}")
            f.check_types([info])
            out[name] = f.words(info)
            require_finite(out[name], f"{f.path}: tensor {quoted(info.name)}")
        return out, []
    except ModelFileError as e:
        return {}, [f"{f.path}: the multi-token prediction layer ({block}*, read as blk.0) is not read: {e}"]


_PAIRED = {f"mlp.{m}gate_proj.weight": f"mlp.{m}up_proj.weight" for m in ("", "experts.", "shared_expert.")}
_PAIRED.update({up: gate for gate, up in _PAIRED.items()})


def _partner(hf_name: str) -> str | None:
    """The other half of a layer's [gate; up] matrix, which the GPU reads as one, in one format."""
    head, _, tail = hf_name.partition(".mlp.")
    other = _PAIRED.get("mlp." + tail)
    return f"{head}.{other}" if other and tail else None


def _kept(ckpt: GGUFCheckpoint, hf_name: str, info: TensorInfo) -> bool:
    """Whether a tensor stays quantized: a matrix of a kept type, unless all-bf16 was asked for,
    or (gate, up) it is the half of a layer's [gate; up] whose other half is of another type."""
    if not (ckpt.quantized and is_matrix(hf_name) and info.qtype in GGUF_FORMATS
            and not hf_name.endswith(ckpt.family.gguf_unpacked)):
        return False
    partner = _partner(hf_name)
    return partner is None or ckpt.file.tensors[_file_name(ckpt.file, partner, ckpt.family)[0]].qtype == info.qtype


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
