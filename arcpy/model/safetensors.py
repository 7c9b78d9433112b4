"""The safetensors format, read and written with NumPy alone.

A file is an 8-byte little-endian header length N, N bytes of JSON describing each tensor (dtype,
shape, data_offsets relative to the end of the header), then the data. The data regions must tile
the data section exactly: sorted by begin, the first starts at 0, each starts where the previous
ended, the last ends at the end of the file (the format allows no holes, and the reference reader
refuses a file whose offsets do not cover its buffer). That one rule also catches overlapping
tensors and a header length that is off by a few bytes. The header's JSON is parsed only once it is
known to hold no more items than the tensors of the config need.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from arcpy.checks import is_int, quoted
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.files import MAX_JSON_BYTES, open_regular, parse_json, read_json_text
from arcpy.model.bf16 import bf16_to_f32, f32_to_bf16, require_finite

MAX_HEADER_BYTES = MAX_JSON_BYTES
MAX_DIMS = 8  # weights here have one or two; a header with more is not a model
# Tensors one file may list: a dense model of over 1,200 layers (Llama 3 405B has 126, in 1,137 tensors).
MAX_TENSORS = 1 << 14
# JSON items (values and keys) a header may hold per tensor, and for its __metadata__. An entry
# such as "name": {"dtype": "BF16", "shape": [a, b], "data_offsets": [x, y]} holds 12.
_ITEMS_PER_TENSOR = 20
_METADATA_ITEMS = 1 << 16
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
             "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
READABLE = {"BF16": "<u2", "F16": "<f2", "F32": "<f4"}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: its file, dtype, shape and absolute byte range."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    nbytes: int


def _shape_bytes(shape: list[int], itemsize: int, limit: int) -> int | None:
    """Bytes of a tensor of `shape`, or None once the running product passes `limit`."""
    if 0 in shape:
        return 0
    n = itemsize
    for dim in shape:
        n *= dim
        if n > limit:
            return None
    return n


def read_header(file: Path, max_tensors: int = MAX_TENSORS) -> dict[str, TensorEntry]:
    """Parse and validate one safetensors header against the file's size; reads no tensor data.

    `max_tensors` (at most MAX_TENSORS) is the most entries the header may list. The JSON is
    parsed only once it is known to hold no more items than that many entries need: parsing a
    hostile header near MAX_HEADER_BYTES builds tens of millions of Python objects.
    """
    max_tensors = min(max_tensors, MAX_TENSORS)
    fh, size = open_regular(file)
    with fh:
        if size < 8:
            raise ModelFileError(f"{file}: not a safetensors file (too short for a header: {size} bytes)")
        n = int.from_bytes(fh.read(8), "little")
        # The length word of a file that is not safetensors is arbitrary bytes: never repeat it.
        if n > MAX_HEADER_BYTES or n > size - 8:
            raise ModelFileError(f"{file}: not a safetensors file (its header length does not fit "
                                 f"the file's {size} bytes)")
        raw = read_json_text(fh, n, json_items(max_tensors))
    if raw is None:
        raise ModelFileError(f"{file}: header holds more JSON items than {max_tensors} tensors need "
                             f"(more than {json_items(max_tensors)})")
    header, problem = parse_json(raw)
    if problem is not None:
        raise ModelFileError(f"{file}: not a safetensors file (header {problem})")
    if not isinstance(header, dict):
        raise ModelFileError(f"{file}: not a safetensors file (header is not a JSON object)")
    listed = len(header) - ("__metadata__" in header)
    if listed > max_tensors:
        raise ModelFileError(f"{file}: header lists {listed} tensors, more than the {max_tensors} "
                             "a checkpoint of this config may hold")
    base, data_size = 8 + n, size - 8 - n
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{file}: tensor {quoted(name)}"
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise ModelFileError(f"{where}: malformed header entry") from None
        if not isinstance(dtype, str):
            raise ModelFileError(f"{where}: malformed dtype {quoted(dtype)}")
        if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and all(is_int(s) and s >= 0 for s in shape)):
            raise ModelFileError(f"{where}: malformed shape {quoted(shape)} (at most {MAX_DIMS} dims)")
        if not (is_int(begin) and is_int(end) and 0 <= begin <= end):
            raise ModelFileError(f"{where}: malformed data_offsets {quoted(info['data_offsets'])}")
        if end > data_size:
            raise ModelFileError(f"{where}: data_offsets [{quoted(begin)}, {quoted(end)}] run past the end of "
                                 f"the file ({data_size} data bytes; truncated?)")
        item = _ITEMSIZE.get(dtype)
        if item is not None:
            need = _shape_bytes(shape, item, data_size)
            if need != end - begin:
                needs = f"more than the file's {data_size} data bytes" if need is None else need
                raise ModelFileError(f"{where}: data_offsets span {end - begin} bytes but "
                                     f"{dtype}{quoted(shape)} needs {needs}")
        entries[name] = TensorEntry(file, dtype, tuple(shape), base + begin, end - begin)
    _check_tiling(file, entries, base, data_size)
    return entries


def json_items(max_tensors: int) -> int:
    """The most JSON values and keys a header (or an index) of `max_tensors` entries may hold."""
    return _ITEMS_PER_TENSOR * max_tensors + _METADATA_ITEMS


def _check_tiling(file: Path, entries: Mapping[str, TensorEntry], base: int, data_size: int) -> None:
    cursor, previous = 0, None
    for begin, end, name in sorted((e.start - base, e.start - base + e.nbytes, n) for n, e in entries.items()):
        if begin < cursor:
            raise ModelFileError(f"{file}: tensor {quoted(name)} overlaps the data of tensor {quoted(previous)}")
        if begin > cursor:
            raise ModelFileError(f"{file}: {begin - cursor} data bytes before tensor {quoted(name)} "
                                 "belong to no tensor (the data section must have no holes)")
        cursor, previous = end, name
    if cursor != data_size:
        raise ModelFileError(f"{file}: the last {data_size - cursor} data bytes belong to no tensor "
                             "(wrong header length, or data appended?)")


def _as_bf16_words(view: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        # Writers that do not pad the header leave the data at an odd address; copy those once.
        return view if view.flags.aligned else view.astype(np.uint16)
    return f32_to_bf16(view.astype(np.float32))


def entry_bytes(entry: TensorEntry, maps: dict[Path, np.ndarray]) -> np.ndarray:
    """A tensor's bytes (uint8), a view of its file's read-only mapping (one per file, in `maps`)."""
    if entry.file not in maps:
        maps[entry.file] = np.asarray(np.memmap(entry.file, dtype=np.uint8, mode="r"))
    return maps[entry.file][entry.start:entry.start + entry.nbytes]


def read_bf16_words(name: str, entry: TensorEntry, maps: dict[Path, np.ndarray]) -> np.ndarray:
    """One tensor as bf16 words: BF16 data stays a view of the file's mapping, F16/F32 are rounded.
    Every word is checked to be finite (one pass over the data, which also pages it in).

    `maps` holds one read-only mapping per file, shared by its tensors.
    """
    view = entry_bytes(entry, maps).view(READABLE[entry.dtype]).reshape(entry.shape)
    try:
        words = _as_bf16_words(view, entry.dtype)
    except MemoryError:
        raise ModelFileError(f"{entry.file}: not enough memory to read tensor {quoted(name)} "
                             f"({entry.dtype}, {entry.nbytes} bytes)") from None
    # After rounding: an F32 weight beyond the bf16 range is as infinite as a stored one.
    require_finite(words, f"{entry.file}: tensor {quoted(name)}")
    return words


def save_safetensors(path, tensors: Mapping[str, np.ndarray], dtype: str = "BF16") -> None:
    """Write tensors to one safetensors file, all stored as `dtype` (BF16, F16 or F32).

    uint16 arrays are taken as bf16 words; float arrays as values (rounded to bf16 for BF16).
    """
    if dtype not in READABLE:
        raise InvalidArgumentError(f"save_safetensors: dtype must be BF16, F16 or F32, got {dtype!r}")
    header: dict = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, t in tensors.items():
        t = np.asarray(t)
        if dtype == "BF16":
            data = t if t.dtype == np.uint16 else f32_to_bf16(t)
        else:
            values = bf16_to_f32(t) if t.dtype == np.uint16 else t.astype(np.float32)
            if dtype == "F16" and np.any(np.abs(values[np.isfinite(values)]) > np.finfo(np.float16).max):
                raise InvalidArgumentError(f"save_safetensors: tensor {name} has values beyond the F16 range")
            data = values.astype(READABLE[dtype])
        data = np.ascontiguousarray(data).astype(READABLE[dtype], copy=False)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + data.nbytes]}
        blobs.append(data)
        offset += data.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as other writers do
    # Write beside the target and rename: a model loaded from `path` is memory-mapped, and
    # truncating a mapped file in place would crash its next read.
    tmp = Path(f"{path}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little"))
        fh.write(raw)
        for data in blobs:
            fh.write(data.tobytes())
    os.replace(tmp, path)
