"""The GGUF container: its header walked with every count bounded, typed metadata, tensors as
their raw blocks, float32 values or bf16 words.

A file is the magic "GGUF", a version, the tensor and key counts, the key/value metadata, one entry
per tensor (name, dims innermost first, type, offset), then the tensor data: each tensor's bytes, as
many as its type and dims imply, in table order, each starting at the aligned end of the one before.
Every length and count in the header is checked against the bytes the file holds before it is
read or allocated for; the `gguf` package supplies the type tables and the dequantization.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize

from arcpy.checks import is_finite_real, is_int, quoted
from arcpy.errors import ModelFileError
from arcpy.files import open_regular
from arcpy.model.bf16 import f32_to_bf16

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)  # version 1 had 32-bit counts; 3 only adds big-endian files, refused here
_MAX_TENSORS = 1 << 16
_MAX_DIMS = 4
_MAX_ALIGNMENT = 1 << 20
# Strings and numbers in all metadata arrays together. A Llama 3 vocabulary with its merges is
# about 540k; the cap keeps a hostile file from turning each of its bytes into a Python object.
_MAX_ITEMS = 1 << 23
_NUMBERS = {
    GGUFValueType.UINT8: np.dtype("<u1"), GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"), GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"), GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.UINT64: np.dtype("<u8"), GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT32: np.dtype("<f4"), GGUFValueType.FLOAT64: np.dtype("<f8"),
    GGUFValueType.BOOL: np.dtype("<u1"),
}
_REQUIRED = object()
# Rows of a tensor dequantized at once on its way to bf16: about this many float32 values (4 MB).
_WORDS_SLICE = 1 << 20


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: innermost first
    qtype: GGMLQuantizationType
    start: int  # absolute byte offset in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """Row-major (NumPy, Hugging Face) order: the dims reversed."""
        return tuple(reversed(self.dims))


class Metadata:
    """The key/value metadata, read one key at a time with a type check (one line when it fails)."""

    def __init__(self, values: dict[str, object], path: Path):
        self.values, self.path = values, path

    def get(self, key: str, kind: str, ok, default=_REQUIRED):
        v = self.values.get(key, _REQUIRED)
        if v is _REQUIRED:
            if default is _REQUIRED:
                raise ModelFileError(f"{self.path}: missing metadata {quoted(key)}")
            return default
        if not ok(v):
            raise ModelFileError(f"{self.path}: metadata {quoted(key)} must be {kind}, got {quoted(v)}")
        return v

    def integer(self, key: str, default=_REQUIRED) -> int:
        return self.get(key, "an integer", is_int, default)

    def number(self, key: str, default=_REQUIRED) -> float:
        return float(self.get(key, "a finite number", is_finite_real, default))

    def text(self, key: str, default=_REQUIRED) -> str:
        return self.get(key, "text", lambda v: isinstance(v, str), default)

    def flag(self, key: str, default=_REQUIRED) -> bool:
        return self.get(key, "true or false", lambda v: isinstance(v, bool), default)

    def strings(self, key: str, count: int | None = None, default=_REQUIRED) -> list[str]:
        def ok(v):
            return isinstance(v, list) and all(isinstance(s, str) for s in v) and count in (None, len(v))
        return self.get(key, "a list of strings" if count is None else f"a list of {count} strings", ok, default)

    def numbers(self, key: str, count: int, kinds: str, default=_REQUIRED) -> np.ndarray:
        """An array of `count` numbers whose NumPy kind is one of `kinds` ('iu' integers, 'f' floats)."""
        what = "integers" if "f" not in kinds else "numbers"
        return self.get(key, f"a list of {count} {what}",
                        lambda v: isinstance(v, np.ndarray) and v.dtype.kind in kinds and len(v) == count, default)


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    meta: Metadata
    tensors: dict[str, TensorInfo]
    data: np.ndarray  # the whole file, memory-mapped

    def check_types(self, infos: Iterable[TensorInfo]) -> None:
        """Refuse, before any is read, a tensor of a type the gguf package cannot dequantize."""
        for info in infos:
            if not _dequantizable(info.qtype):
                raise ModelFileError(f"{self.path}: tensor {quoted(info.name)} has type {info.qtype.name}, "
                                     "which cannot be dequantized")

    def raw(self, info: TensorInfo) -> np.ndarray:
        """One tensor's bytes as the file holds them (a view of the mapped file), one row a line."""
        block, type_size = GGML_QUANT_SIZES[info.qtype]
        return self.data[info.start:info.start + info.nbytes].reshape(-1, info.dims[0] // block * type_size)

    def values(self, info: TensorInfo) -> np.ndarray:
        """One tensor dequantized to float32, in its row-major shape (its type passed check_types)."""
        try:
            with np.errstate(invalid="ignore", over="ignore"):  # a NaN scale is reported by the caller
                return dequantize(self.raw(info), info.qtype).reshape(info.shape)
        except MemoryError:
            raise self._no_memory(info) from None

    def words(self, info: TensorInfo) -> np.ndarray:
        """One tensor as bf16 words in its row-major shape, dequantized a slice of rows at a time:
        a large tensor's float32 values never exist all at once. BF16 data is bf16 words already:
        a view of the mapped file, read as the caller scans it (no copy, no float32 at all)."""
        raw, cols = self.raw(info), info.dims[0]
        if info.qtype == GGMLQuantizationType.BF16:
            return raw.view("<u2").reshape(info.shape)
        try:
            out = np.empty((raw.shape[0], cols), np.uint16)
            step = max(1, _WORDS_SLICE // cols)
            with np.errstate(invalid="ignore", over="ignore"):  # a NaN scale is reported by the caller
                for r in range(0, raw.shape[0], step):
                    out[r:r + step] = f32_to_bf16(dequantize(raw[r:r + step], info.qtype))
        except MemoryError:
            raise self._no_memory(info) from None
        return out.reshape(info.shape)

    def _no_memory(self, info: TensorInfo) -> ModelFileError:
        return ModelFileError(f"{self.path}: not enough memory to read tensor {quoted(info.name)} "
                              f"({info.qtype.name}, {info.nbytes} bytes)")


@functools.lru_cache(maxsize=None)
def _dequantizable(qtype: GGMLQuantizationType) -> bool:
    # The package has no list of what it dequantizes: ask it with one block of zeros.
    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


class _Walker:
    """Reads the header front to back; each read is checked against the bytes left."""

    def __init__(self, data: np.ndarray, path: Path):
        self.mv, self.size, self.pos, self.path = memoryview(data), data.size, 0, path
        self.items_left = _MAX_ITEMS

    def fail(self, what: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: {what}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"{what} runs past the end of the file ({self.size} bytes; truncated?)")

    def unpack(self, fmt: str, what: str) -> tuple:
        n = struct.calcsize(fmt)
        self.need(n, what)
        values = struct.unpack_from(fmt, self.mv, self.pos)
        self.pos += n
        return values

    def string(self, what: str) -> str:
        (n,) = self.unpack("<Q", what)
        self.need(n, what)
        raw = bytes(self.mv[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8 text") from None

    def value(self, vtype: int, what: str):
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype == GGUFValueType.ARRAY:
            return self.array(what)
        if vtype not in _NUMBERS:
            raise self.fail(f"{what} has unknown value type {vtype}")
        v = self.numbers(vtype, 1, what)[0]
        # A float32 reads back as the shortest decimal that is the same float32: 1e-05, as written.
        return float(str(v)) if vtype == GGUFValueType.FLOAT32 else v.item()

    def numbers(self, vtype: int, count: int, what: str) -> np.ndarray:
        dt = _NUMBERS[vtype]
        self.need(count * dt.itemsize, what)
        out = np.frombuffer(self.mv, dtype=dt, count=count, offset=self.pos)
        self.pos += count * dt.itemsize
        if vtype == GGUFValueType.BOOL:
            if np.any(out > 1):
                raise self.fail(f"{what} holds a bool that is neither 0 nor 1")
            return out.astype(bool)
        return out

    def array(self, what: str):
        itype, count = self.unpack("<IQ", what)
        if count > self.items_left:
            raise self.fail(f"{what} claims {count} items, more than a model's metadata holds")
        self.items_left -= count
        if itype == GGUFValueType.STRING:
            self.need(8 * count, what)  # each string takes at least its length word
            return [self.string(what) for _ in range(count)]
        if itype not in _NUMBERS:
            kind = "arrays of arrays are" if itype == GGUFValueType.ARRAY else f"item type {itype} is"
            raise self.fail(f"{what}: {kind} not supported")
        return self.numbers(itype, count, what)

    def tensor_entry(self, index: int) -> tuple[str, tuple[int, ...], int, int]:
        where = f"tensor entry {index}"
        name = self.string(where)
        (n_dims,) = self.unpack("<I", where)
        if not 1 <= n_dims <= _MAX_DIMS:
            raise self.fail(f"tensor {quoted(name)} has {n_dims} dims (1..{_MAX_DIMS})")
        dims = self.unpack(f"<{n_dims}Q", where)
        qtype, offset = self.unpack("<IQ", where)
        return name, dims, qtype, offset


def read_gguf(path: Path) -> GGUFFile:
    """Map a GGUF file and check its header; reads no tensor data."""
    fh, size = open_regular(path)
    with fh:
        if size < 24:
            raise ModelFileError(f"{path}: not a GGUF file (too short for a header: {size} bytes)")
        data = np.asarray(np.memmap(fh, dtype=np.uint8, mode="r"))
    w = _Walker(data, path)
    if bytes(w.mv[:4]) != _MAGIC:
        raise ModelFileError(f"{path}: not a GGUF file (no GGUF magic)")
    (version,) = w.unpack("<4xI", "header")
    if version & 0xFFFF == 0:
        raise ModelFileError(f"{path}: big-endian GGUF files are not supported")
    if version not in _VERSIONS:
        raise ModelFileError(f"{path}: unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors, n_kv = w.unpack("<QQ", "header")
    # A key/value pair takes at least 13 bytes and a tensor entry 32: bound the counts by the file.
    if n_tensors > _MAX_TENSORS or 13 * n_kv + 32 * n_tensors > size - w.pos:
        raise ModelFileError(f"{path}: header claims {n_tensors} tensors and {n_kv} metadata keys, "
                             f"more than its {size} bytes can hold")
    values: dict[str, object] = {}
    for i in range(n_kv):
        key = w.string(f"metadata key {i}")
        if key in values:
            raise ModelFileError(f"{path}: metadata key {quoted(key)} appears twice")
        (vtype,) = w.unpack("<I", f"metadata {quoted(key)}")
        values[key] = w.value(vtype, f"metadata {quoted(key)}")
    entries = [w.tensor_entry(i) for i in range(n_tensors)]

    align = values.get("general.alignment", 32)
    if not (is_int(align) and 0 < align <= _MAX_ALIGNMENT and align & (align - 1) == 0):
        raise ModelFileError(f"{path}: general.alignment must be a power of two, got {quoted(align)}")
    base = -(-w.pos // align) * align
    tensors: dict[str, TensorInfo] = {}
    for name, dims, qtype, offset in entries:
        where = f"{path}: tensor {quoted(name)}"
        if name in tensors:
            raise ModelFileError(f"{where} appears twice")
        try:
            qt = GGMLQuantizationType(qtype)
            block, type_size = GGML_QUANT_SIZES[qt]
        except (ValueError, KeyError):
            raise ModelFileError(f"{where} has unknown type {qtype}") from None
        if dims[0] % block:
            raise ModelFileError(f"{where}: row length {dims[0]} is not a multiple of the {qt.name} block of {block}")
        tensors[name] = TensorInfo(name, tuple(dims), qt, base + offset, math.prod(dims) // block * type_size)
    _check_tiling(path, list(tensors.values()), base, align, size)
    return GGUFFile(path, Metadata(values, path), tensors, data)


def _check_tiling(path: Path, infos: list[TensorInfo], base: int, align: int, size: int) -> None:
    """The data section holds each tensor's data, in table order, each at the aligned end of the one
    before (the rule llama.cpp's reader enforces), and nothing after the last.

    A tensor's byte count follows from its type and dims alone, so a type relabelled in the header,
    or an offset moved, breaks the tiling: that is how a file whose entries do not describe its
    data is told apart from one that merely dequantizes to other numbers.
    """
    expected, previous = 0, None  # where the next tensor must start, relative to base
    for done, t in enumerate(infos):
        where = f"{path}: tensor {quoted(t.name)}"
        offset = t.start - base
        if offset % align:
            raise ModelFileError(f"{where}: data offset {offset} is not a multiple of the alignment {align}")
        if offset < expected:
            owner = next((p for p in reversed(infos[:done]) if p.start <= t.start and p.nbytes), previous)
            raise ModelFileError(f"{where} overlaps the data of tensor {quoted(owner.name)} "
                                 f"({_described(owner, base)}): it starts at data offset {offset}")
        if offset > expected:
            after = "the start of the data" if previous is None else \
                f"where tensor {quoted(previous.name)} ({_described(previous, base)}) ends, aligned to {align}"
            raise ModelFileError(f"{where} starts at data offset {offset}, expected {expected}, {after} "
                                 "(a type or an offset changed in the header?)")
        if t.start + t.nbytes > size:
            raise ModelFileError(f"{where}: its data ({t.qtype.name}, {t.nbytes} bytes from offset {offset}) runs "
                                 f"past the end of the file ({size} bytes; truncated?)")
        expected, previous = offset + -(-t.nbytes // align) * align, t
    if size > base + expected:
        raise ModelFileError(f"{path}: the last {size - base - expected} bytes of the file belong to no tensor "
                             "(a type changed in the header, or data appended?)")


def _described(t: TensorInfo, base: int) -> str:
    return f"{t.qtype.name} {list(t.shape)}, {t.nbytes} bytes from offset {t.start - base}"
