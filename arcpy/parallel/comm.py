"""One rank's communicator for the all-reduce of tensor parallelism (libarc's arc_comm: NCCL,
loaded at run time). `nccl_library` finds the NCCL of the nvidia-nccl wheels (the one PyTorch's
CUDA builds install) on sys.path; without one, the dynamic loader's libnccl.so.2 is tried."""

from __future__ import annotations

import sys
from pathlib import Path

from arcpy import _lib
from arcpy.codes import MAX_WORLD
from arcpy.errors import InvalidArgumentError

ID_BYTES = 128  # ARC_COMM_ID_BYTES


def nccl_library() -> str | None:
    """The path of the wheels' libnccl.so.2, or None (the dynamic loader's search)."""
    for entry in sys.path:
        path = Path(entry or ".") / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
        if path.is_file():
            return str(path)
    return None


def _library(ffi, library: str | None):
    return ffi.NULL if library is None else ffi.new("char[]", library.encode())


def unique_id(library: str | None = None) -> bytes:
    """A new id for the ranks of one world to join with."""
    ffi, lib = _lib.load()
    buf = ffi.new("uint8_t[]", ID_BYTES)
    _lib.check(lib.arc_comm_unique_id(_library(ffi, library), buf))
    return bytes(ffi.buffer(buf, ID_BYTES))


class Communicator:
    """Rank `rank` of `world` on `ctx` (an arcpy.devices.context.Context), joined by `comm_id`
    (unique_id()); blocks until every rank has joined. The context holds it (ctx.comm) and closes
    it before itself: a model on that context is then the rank's shard (libarc's arc_comm_create).
    `ptr` instead adopts a communicator made by create_all."""

    def __init__(self, ctx, comm_id: bytes = b"", world: int = 1, rank: int = 0, library: str | None = None,
                 ptr=None):
        self.ffi, self.lib = ctx.ffi, ctx.lib
        if ptr is None:
            if not (isinstance(comm_id, bytes) and len(comm_id) == ID_BYTES):
                raise InvalidArgumentError(f"a communicator's id is {ID_BYTES} bytes (unique_id())")
            if not (1 <= world <= MAX_WORLD and 0 <= rank < world):
                raise InvalidArgumentError(f"rank {rank} of world {world}: a world holds 1 to {MAX_WORLD} ranks")
            out = self.ffi.new("arc_comm **")
            _lib.check(self.lib.arc_comm_create(ctx.ptr, _library(self.ffi, library), comm_id, world, rank, out))
            ptr = out[0]
        self.ptr = ptr
        ctx.comm = self

    def all_reduce(self, send, recv, count: int) -> None:
        """recv[0..count) = the ranks' send[0..count) summed (device float32; send may be recv), on
        the stream."""
        _lib.check(self.lib.arc_comm_all_reduce(self.ptr, send, recv, count))

    def info(self) -> tuple[int, int, int]:
        """(world, rank, NCCL version)."""
        w, r, v = (self.ffi.new("int32_t *") for _ in range(3))
        _lib.check(self.lib.arc_comm_info(self.ptr, w, r, v))
        return w[0], r[0], v[0]

    def close(self) -> None:
        if self.ptr is not None:
            ptr, self.ptr = self.ptr, None
            _lib.check(self.lib.arc_comm_destroy(ptr))


def create_all(ctxs, library: str | None = None) -> list[Communicator]:
    """Every rank's communicator at once, rank r on ctxs[r] (each its own GPU), from this process:
    libarc's arc_comm_create_all, which also runs their first all-reduce together."""
    if not 1 <= len(ctxs) <= MAX_WORLD:
        raise InvalidArgumentError(f"a world holds 1 to {MAX_WORLD} ranks, got {len(ctxs)}")
    ffi, lib = ctxs[0].ffi, ctxs[0].lib
    out = ffi.new("arc_comm *[]", len(ctxs))
    _lib.check(lib.arc_comm_create_all(ffi.new("arc_context *[]", [c.ptr for c in ctxs]), len(ctxs),
                                       _library(ffi, library), out))
    return [Communicator(ctx, ptr=out[r]) for r, ctx in enumerate(ctxs)]
