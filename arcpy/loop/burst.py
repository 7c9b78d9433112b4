"""BurstDriver: enqueue a burst of device-loop steps, then watch the ring as tokens land.

The host never waits for the stream: every step of the burst is enqueued up front (graph launch,
sampler, commit), and tokens are read from the pinned, host-mapped ring with plain loads. A
fault inside the graph is asynchronous, so three non-blocking signals stand in for the sync
(docs/ARCHITECTURE.md, section 2), checked while draining:

- the fault word the commit kernel latches (read with the ring, every poll);
- stream_query(), which also reports errors of earlier asynchronous work (a sticky fault);
- idle-but-short: the stream is idle, so every enqueued step retired, yet fewer tokens than
  steps reached the ring and no stop id explains it.

max_spins is only a liveness backstop for a kernel that hangs without ever erroring.
"""

from __future__ import annotations

from typing import Iterator

from arcpy.codes import FAULT_DEGENERATE, FAULT_NONFINITE
from arcpy.devices.protocol import DeviceOps, RingState, spin_until
from arcpy.devices.sequence import SequenceStart
from arcpy.errors import (BadLogitsError, DegenerateLogitsError, DeviceFaultError, FaultWordError, HangError,
                           NonFiniteLogitsError, ShortBurstError)

# Polls of the stream or the ring that may say no before a wait counts as a hang (HangError).
MAX_SPINS = 20_000_000


def fault_error(state: RingState) -> DeviceFaultError | BadLogitsError:
    """The error a latched fault word stands for. Non-finite and degenerate logits are the
    model's, not the loop's: the host path would meet them too, so they are not a reason to fall
    back."""
    if state.fault == FAULT_NONFINITE:
        return NonFiniteLogitsError(state.fault_pos - 1, "device loop")
    if state.fault == FAULT_DEGENERATE:
        return DegenerateLogitsError(state.fault_pos - 1, "device loop")
    return FaultWordError(state.fault, state.fault_token, state.fault_pos)


class BurstDriver:
    """Drives bursts on one DeviceOps. The ring's count is tracked across bursts of a sequence;
    `begin_sequence()` resets it (and the device's ring) when the stream is idle."""

    def __init__(self, device: DeviceOps, max_spins: int = MAX_SPINS, query_every: int = 4096):
        if max_spins < 1 or query_every < 1:
            raise ValueError("max_spins and query_every must be positive")
        self.device = device
        self.max_spins = max_spins
        self.query_every = query_every
        self.published = 0
        self.steps = 0  # speculative steps whose commit ran, as the ring counts them
        self.burst_id = 0
        self.host_waits = 0
        self.sink = None  # where each taken token's log-probabilities go (a deque), when asked for
        self.guide = None  # a masked sequence's Constrained: it sees every token, and gives the next mask
        self.stop_ids: frozenset[int] = frozenset()

    def begin_sequence(self, start: SequenceStart, sink=None, guide=None) -> None:
        """Start a device-loop sequence: the device's ring reset, and its stop ids, sampling
        parameters and the rest of `start` written, in one begin_sequence. The ring may only be
        reset once no step is in flight (the tail of a burst a stop id ended may still be
        retiring): that wait is a host wait, counted, once per sequence, never per token. With
        log-probabilities (start.logprobs), a token is taken only once its entry is written too,
        and the entries go to `sink` (appended, in order). With `guide` (a Constrained, on a device
        with masks; start.masked) every step applies the grammar's mask on the device: the first
        is written now, and each next one as soon as the tokens before it are taken from the ring."""
        if spin_until(lambda: self.device.begin_sequence(start), self.max_spins, "device loop: resetting the ring"):
            self.host_waits += 1
        self.published = 0
        self.steps = 0
        self.stop_ids = frozenset(start.stop_ids)
        self.sink = sink if start.logprobs is not None else None
        self.guide = guide
        if guide is not None:
            guide.fill()
            self.device.write_mask(0, guide.mask)

    def release(self) -> None:
        """A masked sequence ends before its burst does: the steps still in flight pass unmasked."""
        if self.guide is not None:
            self.device.release_masks()
            self.guide = None

    def run(self, steps: int, first_commit: bool = False) -> Iterator[int]:
        """Enqueue `steps` steps, then yield each token as it lands in the ring, in order. The
        burst ends after `steps` tokens, or early when the device reports that a stop id ended
        it (the stop token itself is published and yielded). Stop ids are honoured by the
        commit kernel; the caller still checks what it hands out. With `first_commit`, the
        first step is the commit alone, on the logits a prefill left (enqueue_commit).

        Tokens published before a fault are valid: every fault signal is raised only after the
        tokens the ring shows have been yielded, in order."""
        if steps < 1:
            raise ValueError("a burst has at least one step")
        self.burst_id = self.burst_id % 0xFFFFFFFF + 1
        for k in range(steps):
            if k == 0 and first_commit:
                self.device.enqueue_commit(self.burst_id)
            else:
                self.device.enqueue_step(self.burst_id)
        yield from self._drain(self.published + steps, steps, speculative=False)

    def run_speculative(self, steps: int, max_tokens: int, first_commit: bool = False) -> Iterator[int]:
        """Enqueue `steps` speculative steps (after the prefill's commit with `first_commit`), in a
        burst that publishes at most `max_tokens` tokens, and yield each token as it lands. Each
        step publishes one token or more, so the burst ends when the ring holds `max_tokens` more
        tokens, when a stop id ended it, or when the ring's step count says every step ran. The
        fault signals are those of `run`; idle-but-short means the stream is idle yet a step
        never counted itself and the tokens fall short of the limit."""
        if steps < 1 or max_tokens < 1:
            raise ValueError("a speculative burst has at least one step and one token")
        self.burst_id = self.burst_id % 0xFFFFFFFF + 1
        self.device.begin_burst(self.burst_id, max_tokens)
        if first_commit:
            self.device.enqueue_commit(self.burst_id)
        for _ in range(steps):
            self.device.enqueue_spec_step(self.burst_id)
        yield from self._drain(self.published + max_tokens, steps, speculative=True)

    def _drain(self, want: int, steps: int, speculative: bool) -> Iterator[int]:
        """Yield the burst's tokens as they land, until the ring count reaches `want`, a stop id
        ended the burst, or (speculative) the ring's step count says all `steps` ran; the three
        fault signals are checked between polls that bring nothing new."""
        base, base_steps = self.published, self.steps
        idle_seen = False
        spins = 0

        def progress(state) -> str:
            if speculative:
                return f"{state.steps - base_steps} of {steps} speculative steps ran"
            return f"{self.published - base} of {steps} steps published a token"

        while self.published < want:
            state = self.device.poll_ring()  # the step count is read before the tokens it covers
            ready = self._ready(state)
            if ready > self.published:
                yield from self._take(ready)
                spins = 0
                if not speculative:
                    continue
            if speculative:
                self.steps = state.steps
                if self.published >= want or state.steps - base_steps >= steps:
                    return
            if state.fault:
                raise fault_error(state)
            if state.stopped == self.burst_id and ready == state.published:
                return
            if idle_seen:
                # The stream was idle before this poll, so nothing more can land.
                raise ShortBurstError(f"device loop: the stream is idle but only {progress(state)} "
                                      f"(burst {self.burst_id})")
            spins += 1
            if spins % self.query_every == 0:
                # Query, then poll once more before judging: a token may land between the two.
                try:
                    idle_seen = self.device.stream_query()
                except DeviceFaultError:
                    yield from self._take(self._ready(self.device.poll_ring()))
                    raise
            if spins >= self.max_spins:
                yield from self._take(self._ready(self.device.poll_ring()))
                raise HangError(f"device loop: no token and no error in {self.max_spins} polls "
                                f"({progress(state)})")

    def _ready(self, state: RingState) -> int:
        """The tokens that may be taken: those published, and with log-probabilities asked for,
        only those whose entry is written too (it lands a kernel after its token)."""
        return state.published if self.sink is None else min(state.published, state.logprobs)

    def _take(self, published: int) -> Iterator[int]:
        """Yield the tokens the ring holds beyond those already taken."""
        if published > self.published:
            tokens = self.device.read_ring(self.published, published - self.published)
            if self.sink is not None:
                self.sink.extend(self.device.read_logprobs(self.published, published - self.published))
            self.published = published
            if self.guide is not None:  # the next step waits for this mask: before anything else
                for tok in tokens:
                    self.guide.advance(tok)
                if not self.stop_ids.intersection(tokens):  # after a stop id no step publishes
                    self.guide.fill()
                    self.device.write_mask(published, self.guide.mask)
            yield from tokens
