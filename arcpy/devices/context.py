"""The CUDA context: one device, one non-blocking stream, device and pinned host memory, and the
libarc structs of a sampling setting and of a sequence's start. Every GPU object (the forward, the
device, the kernel benchmarks) is made on one.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from arcpy import _lib
from arcpy.codes import ARC_OK
from arcpy.devices.protocol import Counters, spin_until

# Polls of the stream at start-up and teardown before a hang is declared.
IDLE_SPINS = 50_000_000


class Context:
    """One device, one non-blocking stream. Closed by whoever created it."""

    def __init__(self, device: int = 0):
        self.ffi, self.lib = _lib.load()
        pp = self.ffi.new("arc_context **")
        _lib.check(self.lib.arc_context_create(device, pp))
        self.ptr = pp[0]
        self._pinned = []
        self.comm = None  # a tensor-parallel rank's communicator (arcpy.parallel.comm), closed first

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def name(self) -> str:
        buf = self.ffi.new("char[256]")
        _lib.check(self.lib.arc_context_device_name(self.ptr, buf, 256))
        return self.ffi.string(buf).decode()

    def query(self) -> bool:
        """True when every enqueued operation has completed. Never blocks."""
        return _lib.check(self.lib.arc_stream_query(self.ptr)) == ARC_OK

    def wait_idle(self) -> None:
        """Poll until the stream is idle: start-up and teardown only."""
        spin_until(self.query, IDLE_SPINS, "waiting for the GPU to go idle")

    def memory(self) -> tuple[int, int]:
        """(free, total) bytes of the device's memory. Start-up and reports only."""
        free, total = self.ffi.new("uint64_t *"), self.ffi.new("uint64_t *")
        _lib.check(self.lib.arc_context_memory(self.ptr, free, total))
        return int(free[0]), int(total[0])

    def counters(self) -> Counters:
        c = self.ffi.new("arc_counters *")
        _lib.check(self.lib.arc_context_counters(self.ptr, c))
        return Counters(int(c.cuda_calls), int(c.graph_launches))

    def device_alloc(self, nbytes: int):
        pp = self.ffi.new("void **")
        _lib.check(self.lib.arc_device_alloc(self.ptr, nbytes, pp))
        return pp[0]

    def device_free(self, ptr) -> None:
        _lib.check(self.lib.arc_device_free(self.ptr, ptr))

    def pinned(self, shape, dtype) -> tuple[np.ndarray, object]:
        """A pinned, mapped host array and its device pointer. Freed with the context."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        host, dev = self.ffi.new("void **"), self.ffi.new("void **")
        _lib.check(self.lib.arc_host_alloc(self.ptr, nbytes, host, dev))
        self._pinned.append(host[0])
        array = np.frombuffer(self.ffi.buffer(host[0], nbytes), dtype=dtype).reshape(shape)
        return array, dev[0]

    def upload_async(self, dst, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        _lib.check(self.lib.arc_enqueue_copy_to_device(self.ptr, dst, self.ffi.from_buffer(array), array.nbytes))

    def download_async(self, pinned_dst: np.ndarray, src) -> None:
        _lib.check(self.lib.arc_enqueue_copy_to_host(self.ptr, self.ffi.from_buffer(pinned_dst), src, pinned_dst.nbytes))

    def close(self) -> None:
        if self.ptr is None:
            return
        if self.comm is not None:
            self.comm.close()
        for host in self._pinned:
            self.lib.arc_host_free(self.ptr, host)
        self._pinned = []
        self.lib.arc_context_destroy(self.ptr)
        self.ptr = None


def sampling_struct(ffi, sampling):
    """An arc_sampling for a non-greedy Sampling with its seed resolved: each field of the record
    into arc.h's field of the same name, so a new sampling parameter is a field in both (and the
    draw that reads it), nothing here."""
    s = ffi.new("arc_sampling *")
    # Any top_k at or above the vocabulary is off: larger ones than int32 holds mean the same.
    values = {**dataclasses.asdict(sampling), "top_k": min(sampling.top_k, 2**31 - 1)}
    for name, value in values.items():
        setattr(s, name, value)
    return s


SEQUENCE_PARTS = ("reset", "stop_ids", "sampling", "top_logprobs", "bias", "memory", "history", "history_start",
                  "token_input")


def sequence_struct(ffi, lib, **parts):
    """An arc_sequence for arc_loop_begin_sequence that writes the parts given (None or absent: not
    written): `reset` (the ring's, when true), `stop_ids`, `sampling` (a non-greedy Sampling, its
    seed resolved), `top_logprobs` (the log-probabilities' alternatives), `bias` ((id, value)
    pairs), `memory` and `history` (the drafts', as a device-readable int32 pointer and a count;
    the history at position `history_start`, 0 unless given) and `token_input` ((token, position)).
    Returns it with the arrays it points at, which must stay alive until the call returns."""
    unknown = set(parts) - set(SEQUENCE_PARTS)
    if unknown:
        raise TypeError(f"not parts of a sequence's start: {sorted(unknown)}")
    seq = ffi.new("arc_sequence *")
    keep = [seq]
    flags = lib.ARC_SEQ_RESET_RING if parts.get("reset") else 0
    if parts.get("stop_ids") is not None:
        stop_ids = parts["stop_ids"]
        ids = ffi.new("int32_t[]", list(stop_ids) or [0])
        keep.append(ids)
        seq.stop_ids, seq.n_stop_ids = ids, len(stop_ids)
        flags |= lib.ARC_SEQ_STOP_IDS
    if parts.get("sampling") is not None:
        seq.sampling = sampling_struct(ffi, parts["sampling"])[0]
        flags |= lib.ARC_SEQ_SAMPLING
    if parts.get("top_logprobs") is not None:
        seq.top_logprobs = parts["top_logprobs"]
        flags |= lib.ARC_SEQ_LOGPROBS
    if parts.get("bias") is not None:
        bias = parts["bias"]
        ids = ffi.new("int32_t[]", [i for i, _ in bias] or [0])
        values = ffi.new("float[]", [v for _, v in bias] or [0.0])
        keep += [ids, values]
        seq.bias_ids, seq.bias_values, seq.n_bias = ids, values, len(bias)
        flags |= lib.ARC_SEQ_LOGIT_BIAS
    if parts.get("memory") is not None:
        seq.memory, seq.n_memory = parts["memory"]
        flags |= lib.ARC_SEQ_DRAFT_MEMORY
    if parts.get("history") is not None:
        seq.history, seq.n_history = parts["history"]
        seq.history_start = parts.get("history_start", 0)
        flags |= lib.ARC_SEQ_HISTORY
    if parts.get("token_input") is not None:
        seq.token, seq.position = parts["token_input"]
        flags |= lib.ARC_SEQ_INPUT
    seq.parts = flags
    return seq, keep
