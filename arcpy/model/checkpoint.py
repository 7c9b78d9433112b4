"""Model directories: config.json plus safetensors weights (one file, or shards named by an index).

Every check on the files happens before `load_model` returns, and every failure is one
ModelFileError line naming the file and tensor. Nothing a file claims is iterated over or
allocated for before it is bounded by what the files hold. Pickle checkpoints are never opened:
loading one runs arbitrary code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import numpy as np

from arcpy.checks import is_int, quoted, require
from arcpy.errors import ModelFileError
from arcpy.files import read_json_file, reading
from arcpy.model.config import ModelConfig
from arcpy.model.native import LM_HEAD, expected_tensors, iter_tensors, layer_prefix
from arcpy.model.config import one_layer as single_layer
from arcpy.model.gguf import GGUF_SUFFIX, load_gguf_model
from arcpy.model.bf16 import bf16_to_f32, f32_to_bf16
from arcpy.model.families import HF_EXPERT_BLOCKS, HF_FUSED, Family, family_for, hf_family
from arcpy.model.hf import config_from_hf, config_to_hf
from arcpy.model.gemma4 import shared_unread
from arcpy.model.hybrid import GATED_NORM
from arcpy.model import mtp
from arcpy.model.quant import QuantTensor
from arcpy.model.safetensors import (
    READABLE,
    TensorEntry,
    json_items,
    read_bf16_words,
    read_header,
    save_safetensors,
)
from arcpy.model.tensors import Model, require_nonzero

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
# Buffers some exporters save next to the weights; they are recomputed from the config.
_HARMLESS_SUFFIXES = ("rotary_emb.inv_freq",)
# A multimodal checkpoint's text model, under its own prefix; and the tensors the text model does not
# read: its vision tower, and a multi-token prediction layer (Qwen3.5's, read apart: _mtp_tensors);
# Gemma 4's vision and audio towers and their embedders.
_TEXT_PREFIX = "model.language_model."
_UNREAD_PREFIXES = ("model.visual.", "mtp.", "model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
                    "model.embed_audio.")
_MOST_UNREAD = 2048  # the most tensors of those a multimodal checkpoint may list (Qwen3.5's tower: about 400)


def _most_tensors(cfg: ModelConfig) -> int:
    """The most entries one file of a checkpoint of `cfg` may list: its table, an lm_head even when
    tied, and the buffers tolerated per layer. Counted from one layer's table, not listed: a config
    may claim a billion layers."""
    one_layer = expected_tensors(single_layer(cfg, tied_embeddings=False))
    per_layer = sum(name.startswith(layer_prefix(0)) for name in one_layer)
    outside = len(one_layer) - per_layer  # the embedding, the final norm, the lm_head
    experts = 3 * cfg.n_experts  # stored one tensor per expert and matrix
    # Qwen3.5's vision tower and MTP layer; Gemma 4's towers.
    unread = _MOST_UNREAD + 3 * cfg.n_experts if cfg.layer_types or cfg.gemma4_layer else 0
    return outside + cfg.n_layers * (per_layer + experts + len(_HARMLESS_SUFFIXES)) + unread


def _read_index(directory: Path, index: Path, max_tensors: int) -> dict[str, TensorEntry]:
    doc = read_json_file(index, "safetensors index", json_items(max_tensors))
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise ModelFileError(f"{index}: not a safetensors index (no 'weight_map' object)")
    headers: dict[str, dict[str, TensorEntry]] = {}
    entries = {}
    for name, shard in weight_map.items():
        # A shard must sit in the model directory: no paths, so an index cannot point elsewhere.
        # Printable, so the path can appear in messages as it is.
        if (not isinstance(shard, str) or not shard.isprintable() or Path(shard).name != shard
                or not shard.endswith(".safetensors")):
            raise ModelFileError(f"{index}: tensor {quoted(name)} maps to invalid shard name {quoted(shard)}")
        if shard not in headers:
            if not os.path.lexists(directory / shard):
                raise ModelFileError(f"{directory}: shard {quoted(shard)} listed in the index is missing")
            headers[shard] = read_header(directory / shard, max_tensors)
        if name not in headers[shard]:
            raise ModelFileError(f"{directory / shard}: tensor {quoted(name)} listed in the index is absent")
        entries[name] = headers[shard][name]
    return entries


def _weight_files(directory: Path, cfg: ModelConfig) -> dict[str, TensorEntry]:
    """Locate the safetensors file(s) in a model directory and return the tensor index."""
    # lexists: a dangling link is reported as unreadable, not as absent.
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if os.path.lexists(single):
        return read_header(single, _most_tensors(cfg))
    if os.path.lexists(index):
        return _read_index(directory, index, _most_tensors(cfg))
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ModelFileError(f"{directory}: refusing pickle checkpoint {quoted(pickles[0])} (pickle runs code on "
                             "load); convert it to safetensors")
    raise ModelFileError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def _text_model(entries: dict[str, TensorEntry], cfg: ModelConfig) -> dict[str, TensorEntry]:
    """The text model's tensors under arcpy's names: a multimodal checkpoint's language model
    taken from under its prefix, its vision tower and any multi-token prediction layer left out,
    and what a Gemma 4 layer that shares K/V holds of its own and does not read."""
    out = {("model." + name[len(_TEXT_PREFIX):] if name.startswith(_TEXT_PREFIX) else name): e
           for name, e in entries.items() if not name.startswith(_UNREAD_PREFIXES)}
    return {name: e for name, e in out.items() if not shared_unread(cfg, name)}


def _unfused(entries: dict[str, TensorEntry], cfg: ModelConfig) -> dict[str, TensorEntry]:
    """Each fused projection replaced by its parts: consecutive row ranges of the same bytes, so
    nothing is copied. A fused tensor whose rows do not add up to its parts' is one error line."""
    expected = expected_tensors(single_layer(cfg))
    out = dict(entries)
    for name, e in entries.items():
        if not name.startswith("model.layers."):
            continue
        layer, _, suffix = name[len("model.layers."):].partition(".")
        parts = HF_FUSED.get(suffix)
        if parts is None:
            continue
        rows = [expected[layer_prefix(0) + part][0] for part in parts]
        cols = expected[layer_prefix(0) + parts[0]][1]
        if e.shape != (sum(rows), cols):
            raise ModelFileError(f"{e.file}: tensor {quoted(name)} has shape {quoted(list(e.shape))}, config expects "
                                 f"{[sum(rows), cols]} ({' + '.join(map(str, rows))} rows)")
        row_bytes, at = e.nbytes // sum(rows), e.start
        del out[name]
        for part, n in zip(parts, rows):
            part_name = f"model.layers.{layer}.{part}"
            if part_name in entries:
                raise ModelFileError(f"{e.file}: tensor {quoted(part_name)} is stored both alone and in {quoted(name)}")
            out[part_name] = dataclasses.replace(e, shape=(n, cols), start=at, nbytes=n * row_bytes)
            at += n * row_bytes
    return out


# An expert's matrix as the files store it, one tensor per expert (model.layers.N.<block>.experts.E.<name>,
# each family's block and names: arcpy.model.families), and a router of a block other than mlp.
_BLOCKS = "|".join(HF_EXPERT_BLOCKS)
_EXPERT = re.compile(rf"model\.layers\.(\d+)\.({_BLOCKS})\.experts\.(\d+)\.(\w+)\.weight")
_ROUTER = re.compile(rf"model\.layers\.(\d+)\.({_BLOCKS})\.gate\.weight")


_PACKED = re.compile(r"model\.layers\.(\d+)\.(?:mlp\.)?experts\.(gate_up_proj|down_proj)")


def _packed_experts(entries: dict[str, TensorEntry], cfg: ModelConfig) -> dict[str, TensorEntry]:
    """Experts packed in 3-D tensors (Qwen3.5-MoE's files: mlp.experts.gate_up_proj (experts,
    2 x width, dim), each expert's gate rows then its up rows; mlp.experts.down_proj (experts, dim,
    width); Gemma 4's the same without "mlp.") as one entry per expert and matrix, the files' bytes
    unmoved: stacked like any."""
    out = {}
    for name, e in entries.items():
        m = _PACKED.fullmatch(name)
        parts = ("gate_proj", "up_proj") if m and m.group(2) == "gate_up_proj" else ("down_proj",)
        if not m or len(e.shape) != 3 or e.shape[0] != cfg.n_experts or e.shape[1] % len(parts):
            out[name] = e  # not packed experts of this config: the table's checks name it
            continue
        layer = m.group(1)
        rows = e.shape[1] // len(parts)
        size = e.nbytes // (e.shape[0] * len(parts))
        for expert in range(e.shape[0]):
            for j, part in enumerate(parts):
                out[f"model.layers.{layer}.mlp.experts.{expert}.{part}.weight"] = dataclasses.replace(
                    e, shape=(rows, e.shape[2]), start=e.start + (expert * len(parts) + j) * size, nbytes=size)
    return out


def _stacked_experts(entries: dict[str, TensorEntry], cfg: ModelConfig) -> tuple[dict[str, TensorEntry],
                                                                               dict[str, list[TensorEntry]]]:
    """The files' per-expert tensors grouped into the model's stacked ones (expert e's rows after
    expert e-1's): (the entries with each group under its stacked name, its shape the stack's;
    the parts of each stacked name, in expert order). Nothing is read here."""
    out: dict[str, TensorEntry] = {}
    groups: dict[str, dict[int, tuple[str, TensorEntry]]] = {}
    templates: dict[str, str] = {}  # a stacked name -> its experts' names in the files, {} the expert
    for name, e in entries.items():
        m, router = _EXPERT.fullmatch(name), _ROUTER.fullmatch(name)
        if router:
            name = f"model.layers.{router.group(1)}.mlp.gate.weight"
        if not m:
            out[name] = e
            continue
        layer, kind, expert, proj = m.groups()
        proj = HF_EXPERT_BLOCKS[kind].get(proj)
        if proj not in ("gate_proj", "up_proj", "down_proj") or int(expert) >= cfg.n_experts:
            raise ModelFileError(f"{e.file}: unexpected tensor {quoted(name)} (not part of this config)")
        groups.setdefault(f"model.layers.{layer}.mlp.experts.{proj}.weight", {})[int(expert)] = (name, e)
        templates[f"model.layers.{layer}.mlp.experts.{proj}.weight"] = (
            f"model.layers.{layer}.{kind}.experts.{{}}.{m.group(4)}.weight")
    parts = {}
    for stacked, experts in groups.items():
        missing = next((i for i in range(cfg.n_experts) if i not in experts), None)
        first = experts[min(experts)][1]
        if missing is not None:
            raise ModelFileError(f"{first.file.parent}: missing tensor {quoted(templates[stacked].format(missing))}")
        for name, e in experts.values():
            if e.shape != first.shape or e.dtype != first.dtype or len(e.shape) != 2:
                raise ModelFileError(f"{e.file}: tensor {quoted(name)} has shape {quoted(list(e.shape))} and dtype "
                                     f"{quoted(e.dtype)}; expert 0's are {list(first.shape)} and {first.dtype}")
        parts[stacked] = [experts[i][1] for i in range(cfg.n_experts)]
        out[stacked] = dataclasses.replace(first, shape=(cfg.n_experts * first.shape[0], first.shape[1]),
                                           nbytes=cfg.n_experts * first.nbytes)
    return out, parts


def _check_tensors(cfg: ModelConfig, entries: dict[str, TensorEntry], directory: Path,
                   made: dict) -> dict[str, tuple]:
    """Match the files' tensors, and those the family makes (`made`), against the config -> the
    expected table, name -> shape."""
    # iter_tensors stops at the first tensor the files lack, so a config claiming far more
    # layers than the files hold costs at most one step per stored tensor.
    for name, shape in iter_tensors(cfg):
        if name in made:  # the family checked what it makes it of against the config
            continue
        e = entries.get(name)
        if e is None:
            raise ModelFileError(f"{directory}: missing tensor {quoted(name)}")
        if e.dtype not in READABLE:
            raise ModelFileError(f"{e.file}: tensor {quoted(name)} has unsupported dtype {quoted(e.dtype)} "
                                 "(BF16, F16, F32)")
        if e.shape != shape:
            raise ModelFileError(f"{e.file}: tensor {quoted(name)} has shape {quoted(list(e.shape))}, "
                                 f"config expects {list(shape)}")
    expected = expected_tensors(cfg)
    for name, e in entries.items():
        harmless = name.endswith(_HARMLESS_SUFFIXES) or (name == LM_HEAD and cfg.tied_embeddings)
        if name not in expected and not harmless:
            raise ModelFileError(f"{e.file}: unexpected tensor {quoted(name)} (not part of this config)")
    return expected


def load_model(path, max_seq: int | None = None) -> Model:
    """Read a Hugging Face style directory (config.json + safetensors), or a .gguf file, into a Model.

    BF16 tensors stay memory-mapped words; F16/F32 are rounded to bf16. `max_seq` caps the context
    (a 128k context's KV cache may not fit where the model does). Tensors the config does not
    expect are an error, except buffers that are recomputed anyway (rotary inv_freq) and an
    lm_head.weight next to tied embeddings (tying means the embedding is used).
    """
    if "\0" in os.fspath(path):
        raise ModelFileError(f"{quoted(os.fspath(path))}: not a valid path")
    with reading(path):
        return _load_model(Path(path), max_seq)


def _load_model(directory: Path, max_seq: int | None) -> Model:
    if not directory.exists():
        raise ModelFileError(f"{directory}: no such model directory")
    if not directory.is_dir():
        if directory.suffix == GGUF_SUFFIX:
            return load_gguf_model(directory, max_seq)
        if directory.suffix in PICKLE_SUFFIXES:
            raise ModelFileError(f"{directory}: refusing pickle checkpoint (pickle runs code on load); "
                                 "convert it to safetensors")
        raise ModelFileError(f"{directory}: expected a model directory with config.json and safetensors")
    cfg_path = directory / "config.json"
    if not os.path.lexists(cfg_path):
        raise ModelFileError(f"{cfg_path}: missing config.json")
    doc = read_json_file(cfg_path, "config")
    cfg = config_from_hf(doc, str(cfg_path))
    if max_seq is not None:
        require(is_int(max_seq) and max_seq > 0, f"max_seq must be a positive int, got {max_seq!r}")
        cfg = dataclasses.replace(cfg, max_seq=min(cfg.max_seq, max_seq))

    # The family's own tensors (gpt-oss's fused experts) made first; the rest read as they are.
    files = _weight_files(directory, cfg)
    entries, made = hf_family(doc, str(cfg_path)).hf_tensors(_text_model(files, cfg), cfg)
    entries = _unfused(_packed_experts(entries, cfg), cfg)
    entries, experts = _stacked_experts(entries, cfg)
    expected = _check_tensors(cfg, entries, directory, made)
    maps: dict[Path, np.ndarray] = {}

    def read(name: str) -> np.ndarray:
        if name in made:  # each reader checks its words are finite
            return made[name].read(maps)
        if name not in experts:
            return read_bf16_words(name, entries[name], maps)
        return np.concatenate([read_bf16_words(name, e, maps) for e in experts[name]])
    tensors = {name: read(name) for name in expected}
    layer, notes = _mtp_tensors(files, cfg, maps)
    model = Model(cfg, tensors, name=directory.resolve().name, source=str(directory), notes=notes, mtp=layer)
    require_nonzero(model)
    return model


def _mtp_tensors(files: dict[str, TensorEntry], cfg: ModelConfig, maps: dict) -> tuple[dict, list[str]]:
    """Qwen3.5's multi-token prediction layer (arcpy.model.mtp), read where the files hold it whole,
    its decoder layer through the same steps as the model's layers (unfused, experts unpacked and
    stacked) -> (its tensors, no notes); none -> ({}, []); malformed or incomplete -> ({}, a note
    saying why): the layer is optional, the model runs without it."""
    own = {name: e for name, e in files.items() if name.startswith(mtp.PREFIX)}
    if not own or not cfg.layer_types:
        return {}, []
    mcfg = mtp.mtp_config(cfg)
    layer = {layer_prefix(0) + n[len(mtp.LAYER):]: e for n, e in own.items() if n.startswith(mtp.LAYER)}
    try:
        layer, experts = _stacked_experts(_unfused(_packed_experts(layer, mcfg), mcfg), mcfg)
        found = {**layer, **{n: e for n, e in own.items() if not n.startswith(mtp.LAYER)}}
        shapes = {n: s for n, s in mtp.mtp_shapes(cfg).items() if not n.startswith(mtp.LAYER)}
        shapes.update(mtp.layer_shapes(cfg))
        for name, shape in shapes.items():
            e = found.get(name)
            if e is None or e.dtype not in READABLE or e.shape != shape:
                raise ModelFileError(f"tensor {quoted(name)} is missing, or not {list(shape)} of BF16, F16 or F32")
        extra = sorted(n for n in set(found) - set(shapes) if not n.endswith(_HARMLESS_SUFFIXES))
        if extra:
            raise ModelFileError(f"unexpected tensor {quoted(extra[0])}")
        out = {}
        for name in shapes:
            words = (np.concatenate([read_bf16_words(name, e, maps) for e in experts[name]]) if name in experts
                     else read_bf16_words(name, found[name], maps))
            out[mtp.LAYER + name[len(layer_prefix(0)):] if name.startswith(layer_prefix(0)) else name] = words
        return out, []
    except ModelFileError as e:
        return {}, [f"{next(iter(own.values())).file}: the multi-token prediction layer (mtp.*) is not read: {e}"]


def _shifted_norms(tensors: dict[str, np.ndarray], shift: float) -> dict[str, np.ndarray]:
    """Every norm's weights plus `shift`, in float32, rounded once to bf16 (a model whose norms are
    held otherwise than its family's files store them); the rest untouched."""
    return {name: f32_to_bf16(bf16_to_f32(t) + np.float32(shift))
            if name.endswith("norm.weight") and not name.endswith(GATED_NORM) else t for name, t in tensors.items()}


def _split_experts(tensors: dict[str, np.ndarray], cfg: ModelConfig, family: Family) -> dict[str, np.ndarray]:
    """The stacked experts split back into one tensor per expert under the family's names (and
    its router under its block's name), as transformers writes them; the rest untouched."""
    if not cfg.n_experts:
        return tensors
    if family.hf_packed_experts:
        return _packed_for_files(tensors, cfg, family.hf_packed_experts)
    out = {}
    block = family.hf_expert_block
    for name, t in tensors.items():
        head, sep, proj = name.partition(".mlp.experts.")
        if name.endswith(".mlp.gate.weight"):
            out[name.replace(".mlp.gate.", f".{block}.gate.")] = t
        elif not sep:
            out[name] = t
        else:
            w = family.hf_expert_names[proj[:-len(".weight")]]
            for e, part in enumerate(np.split(t, cfg.n_experts)):
                out[f"{head}.{block}.experts.{e}.{w}.weight"] = np.ascontiguousarray(part)
    return out


def _saved_tensors(tensors: dict[str, np.ndarray], cfg: ModelConfig, family: Family) -> dict[str, np.ndarray]:
    """The tensors as the family's files hold them: in its own layout where it has one (gpt-oss's
    fused experts), else with the experts split one tensor per expert."""
    written = family.hf_written(tensors, cfg)
    return _split_experts(tensors, cfg, family) if written is None else written
def _packed_for_files(tensors: dict[str, np.ndarray], cfg: ModelConfig, block: str) -> dict[str, np.ndarray]:
    """The stacked experts as the files of a family that packs them hold them (Gemma 4's):
    model.layers.N.<block>.gate_up_proj (experts, 2 x width, dim), each expert's gate rows then its
    up rows, and <block>.down_proj (experts, dim, width); the rest untouched."""
    out = {}
    for name, t in tensors.items():
        head, sep, proj = name.partition(".mlp.experts.")
        per_expert = t.reshape(cfg.n_experts, t.shape[0] // cfg.n_experts, t.shape[1]) if sep else t
        if not sep:
            out[name] = t
        elif proj == "gate_proj.weight":
            up = tensors[f"{head}.mlp.experts.up_proj.weight"].reshape(per_expert.shape)
            out[f"{head}.{block}.gate_up_proj"] = np.ascontiguousarray(np.concatenate([per_expert, up], axis=1))
        elif proj == "down_proj.weight":
            out[f"{head}.{block}.down_proj"] = np.ascontiguousarray(per_expert)
    return out


def save_model(model: Model, directory) -> None:
    """Write config.json and model.safetensors (BF16) so that `load_model(directory)` reads it back.
    A model with quantized tensors is refused: the files hold bf16 words here."""
    quantized = sorted(name for name, t in model.tensors.items() if isinstance(t, QuantTensor))
    require(not quantized, f"model {model.name}: {len(quantized)} tensors are quantized ({quantized[0] if quantized else ''} "
            "...), and safetensors files hold bf16 here: load it with quantized=False to save it")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    doc = config_to_hf(model.config)
    (directory / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    # The files of a family store its norms' factors less one, or whole: shift the weights where the
    # model holds them the other way (a Gemma read from GGUF holds its factors whole: shift -1).
    family = family_for(model.config)
    shift = float(model.config.norm_plus_one) - float(family.norms_less_one)
    tensors = _shifted_norms(model.tensors, shift) if shift else model.tensors
    save_safetensors(directory / "model.safetensors", _saved_tensors(tensors, model.config, family), "BF16")
