"""What the host-side control logic may ask of a GPU, and two things that answer.

DeviceOps is the protocol BurstDriver and Engine are written against. It has no synchronize
method: the logic above it cannot block the stream because it is not given a way to. Completion
is learnt by polling: `stream_query()` (never blocks) and the ring (`poll_ring()`).

- CudaDevice: libarc through cffi (a context, a decode loop, a forward captured into a graph).
- FakeDevice: a scripted GPU for tests: tokens, latency, lost launches, sticky faults,
  fault-word codes and hangs, all on a simulated clock that advances as the host polls.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from . import _lib
from .errors import ContextLostError, DeviceFaultError, InvalidArgumentError

FAULT_NONE = 0
FAULT_TOKEN_RANGE = 1
FAULT_POSITION_RANGE = 2
FAULT_NAMES = {FAULT_TOKEN_RANGE: "token out of range", FAULT_POSITION_RANGE: "position out of range"}
MAX_STOP_IDS = 8


@dataclass(frozen=True)
class RingState:
    published: int
    fault: int = FAULT_NONE
    fault_token: int = 0
    fault_pos: int = 0
    stopped: int = 0


@dataclass(frozen=True)
class Counters:
    cuda_calls: int = 0
    graph_launches: int = 0

    def __sub__(self, other: "Counters") -> "Counters":
        return Counters(self.cuda_calls - other.cuda_calls, self.graph_launches - other.graph_launches)


class DeviceOps(Protocol):
    vocab: int
    max_seq: int
    supports_loop: bool

    # Both paths
    def set_input(self, token: int, position: int) -> None: ...
    def stream_query(self) -> bool: ...  # True when idle; raises DeviceFaultError on a fault
    def counters(self) -> Counters: ...

    # Host path
    def enqueue_forward(self, eager: bool = False) -> None: ...
    def enqueue_argmax(self) -> None: ...
    def enqueue_logits_to_host(self) -> None: ...
    def sampled_token(self) -> int: ...
    def host_logits(self) -> np.ndarray: ...

    # Device loop
    def reset_ring(self) -> bool: ...  # False while steps are in flight
    def set_stop_ids(self, ids: tuple[int, ...]) -> None: ...
    def enqueue_step(self, burst_id: int) -> None: ...
    def poll_ring(self) -> RingState: ...
    def read_ring(self, first: int, count: int) -> list[int]: ...


# --- libarc ---------------------------------------------------------------------------------


class Context:
    """One device, one non-blocking stream (arc_context)."""

    def __init__(self, device: int = 0):
        self.ffi, self.lib = _lib.load()
        pp = self.ffi.new("arc_context **")
        _lib.check(self.lib.arc_context_create(device, pp))
        self.ptr = pp[0]
        self._pinned = []

    def name(self) -> str:
        buf = self.ffi.new("char[256]")
        _lib.check(self.lib.arc_context_device_name(self.ptr, buf, 256))
        return self.ffi.string(buf).decode()

    def query(self) -> bool:
        """True when every enqueued operation has completed. Never blocks."""
        return _lib.check(self.lib.arc_stream_query(self.ptr)) == _lib.ARC_OK

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

    def wait_idle(self, max_spins: int = 50_000_000) -> None:
        """Poll the stream until it is idle: a host wait, used outside the device loop only."""
        for _ in range(max_spins):
            if self.query():
                return
        raise DeviceFaultError(f"the GPU made no progress in {max_spins} stream queries")

    def close(self) -> None:
        if self.ptr is None:
            return
        for host in self._pinned:
            self.lib.arc_host_free(self.ptr, host)
        self._pinned = []
        self.lib.arc_context_destroy(self.ptr)
        self.ptr = None


class CudaDevice:
    """DeviceOps over libarc. `forward(loop_ptr)` enqueues one forward on the context's stream
    reading the loop's token input and position, writing float32 logits at `logits` (width
    `logits_width` >= vocab). With use_graph it is warmed up once, captured once, and replayed."""

    supports_loop = True

    def __init__(self, ctx: Context, vocab: int, max_seq: int, forward: Callable[[object], None],
                 logits, logits_width: int, use_graph: bool = True, ring_capacity: int = 1024):
        if logits_width < vocab:
            raise InvalidArgumentError(f"logits width {logits_width} is smaller than vocab {vocab}")
        self.ctx, self.ffi, self.lib = ctx, ctx.ffi, ctx.lib
        self.vocab, self.max_seq = vocab, max_seq
        self._forward, self._logits, self._width = forward, logits, logits_width
        pp = self.ffi.new("arc_loop **")
        _lib.check(self.lib.arc_loop_create(ctx.ptr, vocab, max_seq, ring_capacity, pp))
        self.loop = pp[0]
        self.graph = None
        self.model = None  # the owner of the forward's storage, closed with this device
        self._idle = False  # stream_query() saw the stream idle after the last enqueue
        self._host_logits, _ = ctx.pinned((logits_width,), np.float32)
        self._tokens = self.ffi.new("int32_t[]", ring_capacity)
        self._state = self.ffi.new("arc_ring_state *")
        self._sampled, self._sampled_dev = ctx.pinned((1,), np.int32)
        self.step_graph = None
        if use_graph:
            self.set_input(0, 0)
            forward(self.loop)  # warm-up: first launches load modules outside the capture
            ctx.wait_idle()
            # The host path replays the forward; the device loop replays forward + sample-and-commit.
            self.graph = self._capture(lambda: forward(self.loop))
            self.step_graph = self._capture(lambda: (forward(self.loop), _lib.check(
                self.lib.arc_loop_enqueue_sample_commit(self.loop, logits, logits_width))))
        self.supports_loop = self.step_graph is not None

    def _capture(self, enqueue: Callable[[], None]):
        _lib.check(self.lib.arc_graph_capture_begin(self.ctx.ptr))
        try:
            enqueue()
        finally:
            gp = self.ffi.new("arc_graph **")
            status = self.lib.arc_graph_capture_end(self.ctx.ptr, gp)
        _lib.check(status)
        return gp[0]

    def set_input(self, token: int, position: int) -> None:
        self._idle = False
        _lib.check(self.lib.arc_loop_set_input(self.loop, token, position))

    def stream_query(self) -> bool:
        idle = self.ctx.query()
        if idle:
            self._idle = True
        return idle

    def _require_idle(self, what: str) -> None:
        # The forward's logits are overwritten by the next launch: what the host reads must come
        # from work that has retired, never from steps still in flight.
        if not self._idle:
            raise InvalidArgumentError(
                f"{what} is read only once stream_query() reports the stream idle; work is in flight")

    def counters(self) -> Counters:
        return self.ctx.counters()

    def enqueue_forward(self, eager: bool = False) -> None:
        self._idle = False
        if self.graph is not None and not eager:
            _lib.check(self.lib.arc_graph_launch(self.graph))
        else:
            self._forward(self.loop)

    def enqueue_argmax(self) -> None:
        self._idle = False
        _lib.check(self.lib.arc_argmax(self.ctx.ptr, self._logits, self._width, self._sampled_dev))

    def sampled_token(self) -> int:
        self._require_idle("the sampled token")
        return int(self._sampled[0])

    def enqueue_logits_to_host(self) -> None:
        self._idle = False
        self.ctx.download_async(self._host_logits, self._logits)

    def host_logits(self) -> np.ndarray:
        self._require_idle("the logits")
        return self._host_logits.copy()

    def reset_ring(self) -> bool:
        status = self.lib.arc_loop_reset_ring(self.loop)
        if status == _BUSY:
            return False
        _lib.check(status)
        self._idle = False
        return True

    def set_stop_ids(self, ids: tuple[int, ...]) -> None:
        self._idle = False
        arr = self.ffi.new("int32_t[]", list(ids) or [0])
        _lib.check(self.lib.arc_loop_set_stop_ids(self.loop, arr, len(ids)))

    def enqueue_step(self, burst_id: int) -> None:
        self._idle = False
        _lib.check(self.lib.arc_loop_enqueue_step(self.loop, self.step_graph, burst_id))

    def poll_ring(self) -> RingState:
        s = self._state
        self.lib.arc_ring_poll(self.loop, s)
        return RingState(s.published, s.fault, s.fault_token, s.fault_pos, s.stopped)

    def read_ring(self, first: int, count: int) -> list[int]:
        _lib.check(self.lib.arc_ring_read(self.loop, first, count, self._tokens))
        return list(self._tokens[0:count])

    def inject_lost_step(self, n: int) -> None:
        self._idle = False
        _lib.check(self.lib.arc_loop_inject_lost_step(self.loop, n))

    def close(self) -> None:
        for g in (self.graph, self.step_graph):
            if g is not None:
                self.lib.arc_graph_destroy(g)
        self.graph = self.step_graph = None
        if self.loop is not None:
            self.lib.arc_loop_destroy(self.loop)
            self.loop = None
        if self.model is not None:
            self.model.close()
            self.model = None


_BUSY = 8


def scripted_device(ctx: Context, vocab: int = 32000, loop_vocab: int | None = None, max_seq: int = 4096,
                    mode: str = "ARC_SCRIPT_NORMAL", at_pos: int = -1, bias: int = 3, flag=None) -> CudaDevice:
    """A CudaDevice whose forward is libarc's scripted model: argmax = scripted_next(token,
    position, vocab) with bias `bias`, or a misbehaviour (`mode`, an arc_script_mode name) at
    position `at_pos`. The device loop's fixture on a real GPU, without a transformer."""
    ffi, lib = ctx.ffi, ctx.lib
    logits = ctx.device_alloc(vocab * 4)
    script = ffi.new("arc_script *")
    script.vocab, script.mul, script.add, script.bias = vocab, SCRIPT_MUL, SCRIPT_ADD, bias
    script.mode, script.at_pos = getattr(lib, mode), at_pos
    script.flag = flag if flag is not None else ffi.NULL

    def forward(loop):
        _lib.check(lib.arc_script_forward(loop, script, logits))

    dev = CudaDevice(ctx, loop_vocab or vocab, max_seq, forward, logits, vocab)
    dev.model = _ScriptStorage(ctx, logits, script)
    return dev


class _ScriptStorage:
    def __init__(self, ctx, logits, script):
        self.ctx, self.logits, self.script = ctx, logits, script

    def close(self) -> None:
        if self.logits is not None:
            self.ctx.device_free(self.logits)
            self.logits = None


# --- The CPU backend -------------------------------------------------------------------------


class NumpyDevice:
    """DeviceOps over the NumPy reference forward: the host path on a machine without a GPU.
    Work completes when enqueued, so the stream is always idle; there is no device loop."""

    supports_loop = False

    def __init__(self, reference):
        self.ref = reference
        self.vocab, self.max_seq = reference.config.vocab, reference.max_seq
        self.token, self.position = 0, 0
        self.logits = np.zeros(self.vocab, np.float32)
        self.calls = 0

    def set_input(self, token: int, position: int) -> None:
        self.token, self.position = token, position

    def stream_query(self) -> bool:
        return True

    def counters(self) -> Counters:
        return Counters()

    def enqueue_forward(self, eager: bool = False) -> None:
        self.logits = self.ref.forward(self.token, self.position)

    def enqueue_argmax(self) -> None:
        pass

    def enqueue_logits_to_host(self) -> None:
        pass

    def sampled_token(self) -> int:
        return int(np.argmax(self.logits))

    def host_logits(self) -> np.ndarray:
        return self.logits


# --- The scripted GPU -----------------------------------------------------------------------


SCRIPT_MUL, SCRIPT_ADD = 31, 7


def scripted_next(token: int, position: int, vocab: int, bias: int = 3) -> int:
    """The scripted model's next token: the same rule as libarc's script kernel."""
    return (token * SCRIPT_MUL + position * SCRIPT_ADD + bias) % vocab


@dataclass
class FakeScript:
    """How the fake GPU misbehaves. Step indices count enqueue_step calls from 0."""

    vocab: int = 64
    max_seq: int = 4096
    latency: int = 3                      # polls (simulated ticks) per enqueued operation
    lost_steps: frozenset = frozenset()   # commits that silently never happen
    sticky_fault_at: int | None = None    # step at which a sticky CUDA error poisons the stream
    fault_word_at: int | None = None      # step whose commit latches the fault word
    fault_code: int = FAULT_TOKEN_RANGE
    hang_at: int | None = None            # step that never completes
    honor_stop_ids: bool = True
    next_token: Callable[[int, int], int] | None = None
    supports_loop: bool = True
    eager_offset: float = 0.0             # added to the eager forward's logits (verify tests)


@dataclass
class _Op:
    kind: str
    arg: object = None
    step: int = -1


class FakeDevice:
    """A scripted GPU. Enqueued operations complete in order, `latency` ticks each; a tick
    passes at every poll_ring or stream_query, so the host's polling drives the clock."""

    def __init__(self, script: FakeScript | None = None):
        self.script = script or FakeScript()
        self.vocab, self.max_seq = self.script.vocab, self.script.max_seq
        self.supports_loop = self.script.supports_loop
        self.queue: deque[_Op] = deque()
        self.busy_ticks = 0
        self.token, self.position = 0, 0
        self.sampled = -1
        self.sampled_pending = -1
        self.queries = 0
        self.logits = np.zeros(self.vocab, np.float32)
        self.stop_ids: tuple[int, ...] = ()
        self.ring: list[int] = []
        self.fault = RingState(0)
        self.stopped = 0
        self.dev_fault = FAULT_NONE
        self.sticky = False
        self.steps_enqueued = 0
        self.calls = Counters()
        self.log: list[str] = []

    def _next(self, token: int, position: int) -> int:
        if self.script.next_token is not None:
            return self.script.next_token(token, position)
        return scripted_next(token, position, self.vocab)

    def _count(self, calls: int = 1, graphs: int = 0) -> None:
        self.calls = Counters(self.calls.cuda_calls + calls, self.calls.graph_launches + graphs)

    def _enqueue(self, op: _Op) -> None:
        if self.sticky:
            raise ContextLostError("device fault: an earlier asynchronous fault poisoned the context")
        self.queue.append(op)

    def _tick(self) -> None:
        if not self.queue or self.sticky:
            return
        op = self.queue[0]
        if op.kind == "step" and op.step == self.script.hang_at:
            return
        self.busy_ticks += 1
        if self.busy_ticks < self.script.latency:
            return
        self.busy_ticks = 0
        self.queue.popleft()
        self._run(op)

    def _run(self, op: _Op) -> None:
        s = self.script
        if op.kind == "input":
            self.token, self.position = op.arg
        elif op.kind == "forward":
            nxt = self._next(self.token, self.position)
            self.logits = np.linspace(0.0, 0.5, self.vocab, dtype=np.float32)
            if 0 <= nxt < self.vocab:
                self.logits[nxt] = 1.0
            if op.arg:
                self.logits += np.float32(s.eager_offset)
            self.sampled_pending = nxt
        elif op.kind == "argmax":
            self.sampled = self.sampled_pending
        elif op.kind == "step":
            if op.step == s.sticky_fault_at:
                self.sticky = True
                self.queue.clear()
                return
            tok = self._next(self.token, self.position)
            if op.step in s.lost_steps or self.dev_fault or self.stopped == op.arg:
                return
            nxt_pos = self.position + 1
            code = FAULT_NONE
            if op.step == s.fault_word_at:
                code = s.fault_code
            elif not 0 <= tok < self.vocab:
                code = FAULT_TOKEN_RANGE
            elif nxt_pos >= self.max_seq:
                code = FAULT_POSITION_RANGE
            if code:
                self.dev_fault = code
                self.fault = RingState(0, code, tok, nxt_pos)
                return
            self.token, self.position = tok, nxt_pos
            self.ring.append(tok)
            if s.honor_stop_ids and tok in self.stop_ids:
                self.stopped = op.arg

    # DeviceOps
    def set_input(self, token: int, position: int) -> None:
        if not (0 <= token < self.vocab and 0 <= position < self.max_seq):
            raise InvalidArgumentError(f"input ({token}, {position}) out of range")
        self._count()
        self._enqueue(_Op("input", (token, position)))

    def stream_query(self) -> bool:
        self._count()
        self.queries += 1
        self._tick()
        if self.sticky:
            raise ContextLostError("device fault: cudaErrorIllegalAddress (an illegal memory access was encountered)")
        return not self.queue

    def counters(self) -> Counters:
        return self.calls

    def enqueue_forward(self, eager: bool = False) -> None:
        self._count(1, 0 if eager else 1)
        self._enqueue(_Op("forward", eager))

    def enqueue_argmax(self) -> None:
        self._count()
        self._enqueue(_Op("argmax"))

    def enqueue_logits_to_host(self) -> None:
        self._count()
        self._enqueue(_Op("argmax"))

    def sampled_token(self) -> int:
        return self.sampled

    def host_logits(self) -> np.ndarray:
        return self.logits.copy()

    def reset_ring(self) -> bool:
        if not self.stream_query():
            return False
        self.ring, self.dev_fault, self.fault, self.stopped = [], FAULT_NONE, RingState(0), 0
        return True

    def set_stop_ids(self, ids: tuple[int, ...]) -> None:
        if len(ids) > MAX_STOP_IDS:
            raise InvalidArgumentError(f"at most {MAX_STOP_IDS} stop ids")
        self.stop_ids = tuple(ids)

    def enqueue_step(self, burst_id: int) -> None:
        self._count(3, 1)
        step = self.steps_enqueued
        self.steps_enqueued += 1
        self.log.append(f"step {step} burst {burst_id}")
        # A forward, argmax and commit; the fake folds them into one operation.
        self._enqueue(_Op("step", burst_id, step))

    def poll_ring(self) -> RingState:
        self._tick()
        f = self.fault
        return RingState(len(self.ring), f.fault, f.fault_token, f.fault_pos, self.stopped)

    def read_ring(self, first: int, count: int) -> list[int]:
        if first + count > len(self.ring):
            raise InvalidArgumentError("tokens not published yet")
        return self.ring[first:first + count]
