"""The device loop driven over several devices, one rank each: every rank runs the same steps, the
host reads the tokens from rank 0's ring, and watches every rank as it watches one device.

`TensorParallelDevice` answers DeviceOps (arcpy/devices/protocol.py) for the ranks together, so
BurstDriver and Engine run on it unchanged:
- everything the host enqueues (inputs, prefills, steps, commits, bursts, stop ids, sampling) is
  enqueued on every rank, rank 0 first; each rank's step ends in its own commit, which writes the
  token the ranks agreed on into that rank's input (on the GPU the agreement is the all-reduce of
  the argmax or the draw, never the host);
- the tokens are read from rank 0's ring, each once every rank has published it;
- `poll_ring` reads every rank's ring: a rank that falls short (a lost commit) keeps the count
  short, so the driver's idle-but-short check catches it; a rank that committed another token is a
  loop fault before that token is handed out; a fault word latched on any rank is the burst's
  fault; and
  `stream_query` asks every rank, so a sticky fault on any rank surfaces as on one device. Either
  stops all ranks at once: the engine falls back or gives up as it would for one device;
- the host path reads rank 0's logits (the gathered ones, where the ranks split the vocabulary).
Features that would need the ranks to combine more than the token (log-probabilities, a logit
bias, token masks, speculative steps, the store of earlier prefixes) are not offered: the
capabilities say so, and the engine runs without them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from arcpy.checks import is_int
from arcpy.codes import FAULT_NONE, MAX_WORLD
from arcpy.devices.protocol import Capabilities, Counters, RingState
from arcpy.devices.sequence import SequenceStart
from arcpy.errors import InvalidArgumentError, LoopFault


def check_devices(devices) -> int:
    """The ranks `devices` asks for (None: 0, no split): distinct device indices, 1 to MAX_WORLD."""
    if devices is None:
        return 0
    devices = list(devices) if isinstance(devices, (list, tuple, range)) else None
    if not (devices and len(devices) <= MAX_WORLD and all(is_int(d) and d >= 0 for d in devices)
            and len(set(devices)) == len(devices)):
        raise InvalidArgumentError(f"devices must list 1 to {MAX_WORLD} distinct device indices (0, 1, ...)")
    return len(devices)


class TensorParallelDevice:
    """Ranks 0..n-1 of one model, as one DeviceOps. Owns the ranks: close() closes them all."""

    supports_logprobs = supports_logit_bias = False
    speculate_k = speculate_ngram = 0
    prefix_granule = 0

    def __init__(self, ranks: Sequence):
        ranks = list(ranks)
        if not ranks:
            raise InvalidArgumentError("tensor parallel needs at least one device")
        first = ranks[0]
        for r, dev in enumerate(ranks[1:], 1):
            if (dev.vocab, dev.max_seq) != (first.vocab, first.max_seq):
                raise InvalidArgumentError(f"rank {r} has vocab {dev.vocab} and max_seq {dev.max_seq}, rank 0 "
                                           f"{first.vocab} and {first.max_seq}")
        self.ranks = ranks
        self.vocab, self.max_seq = first.vocab, first.max_seq
        self.supports_loop = all(d.supports_loop for d in ranks)
        self.supports_sampling = all(d.supports_sampling for d in ranks)
        self.supports_prefill = all(d.supports_prefill for d in ranks)
        self._agreed = 0  # ring entries every rank has published alike, since the last reset

    def __enter__(self) -> "TensorParallelDevice":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def capabilities(self) -> Capabilities:
        first = self.ranks[0].capabilities
        return Capabilities(f"{len(self.ranks)} x {first.name} (tensor parallel)", loop=self.supports_loop,
                            sampling=self.supports_sampling, prefill=self.supports_prefill, graphs=first.graphs,
                            speculation_refused="not over several devices yet",
                            memory_report=all(d.capabilities.memory_report for d in self.ranks))

    # -- both paths ----------------------------------------------------------------------------

    def set_input(self, token: int, position: int) -> None:
        for dev in self.ranks:
            dev.set_input(token, position)

    def stream_query(self) -> bool:
        idle = [dev.stream_query() for dev in self.ranks]  # every rank, so that any rank's fault surfaces
        return all(idle)

    def counters(self) -> Counters:
        total = Counters()
        for dev in self.ranks:
            c = dev.counters()
            total = Counters(total.cuda_calls + c.cuda_calls, total.graph_launches + c.graph_launches)
        return total

    def close(self) -> None:
        for dev in self.ranks:
            dev.close()

    def enqueue_prefill(self, tokens, start: int) -> None:
        for dev in self.ranks:
            dev.enqueue_prefill(tokens, start)

    def memory_report(self) -> str:
        """Each rank's line: the memory of every GPU."""
        return "; ".join(f"rank {r} {dev.memory_report()}" for r, dev in enumerate(self.ranks))

    # -- host path: rank 0 holds the gathered logits ---------------------------------------------

    def enqueue_forward(self, eager: bool = False) -> None:
        for dev in self.ranks:
            dev.enqueue_forward(eager)

    def enqueue_argmax(self, bias: bool = False) -> None:
        self.ranks[0].enqueue_argmax(bias)

    def enqueue_logits_to_host(self, bias: bool = False) -> None:
        self.ranks[0].enqueue_logits_to_host(bias)

    def sampled(self):
        return self.ranks[0].sampled()

    def host_logits(self):
        return self.ranks[0].host_logits()

    # -- device loop ------------------------------------------------------------------------------

    def begin_sequence(self, start: SequenceStart) -> bool:
        """Every rank's, once every rank's stream is idle (each rank's ring reset succeeds only
        then); what the ranks cannot do together yet is refused."""
        if start.logprobs is not None:
            self._refused("log-probabilities")
        if start.logit_bias:
            self._refused("a logit bias")
        if start.masked:
            self._refused("token masks")
        if start.loop and not self.stream_query():
            return False
        for dev in self.ranks:
            if not dev.begin_sequence(start):
                raise LoopFault("a rank's stream was busy right after every rank's was seen idle")
        if start.loop:
            self._agreed = 0
        return True

    def enqueue_step(self, burst_id: int) -> None:
        for dev in self.ranks:
            dev.enqueue_step(burst_id)

    def enqueue_commit(self, burst_id: int) -> None:
        for dev in self.ranks:
            dev.enqueue_commit(burst_id)

    def begin_burst(self, burst_id: int, max_tokens) -> None:
        for dev in self.ranks:
            dev.begin_burst(burst_id, max_tokens)

    def poll_ring(self) -> RingState:
        states = [dev.poll_ring() for dev in self.ranks]
        # A token counts once every rank has committed it, the same on every rank: a rank whose
        # commit was lost falls short (the driver's idle-but-short check catches it), and a rank
        # that committed another token (its input went stale, so every rank's sums went wrong) stops
        # the loop here, before any token from that position is handed out.
        count = min(s.published for s in states)
        if count > self._agreed:
            tokens = self.ranks[0].read_ring(self._agreed, count - self._agreed)
            for r, dev in enumerate(self.ranks[1:], 1):
                theirs = dev.read_ring(self._agreed, count - self._agreed)
                if theirs != tokens:
                    i = next(i for i, (a, b) in enumerate(zip(tokens, theirs)) if a != b)
                    raise LoopFault(f"the ranks disagree: rank {r} committed token {theirs[i]} as the burst's token "
                                    f"{self._agreed + i}, rank 0 token {tokens[i]}")
            self._agreed = count
        state = replace(states[0], published=count)
        if state.fault == FAULT_NONE:
            faulted = next((s for s in states[1:] if s.fault != FAULT_NONE), None)
            if faulted is not None:  # another rank's fault word: the burst's fault, as on rank 0
                state = replace(state, fault=faulted.fault, fault_token=faulted.fault_token,
                                fault_pos=faulted.fault_pos)
        return state

    def read_ring(self, first: int, count: int) -> list[int]:
        return self.ranks[0].read_ring(first, count)

    def _refused(self, what: str):
        raise InvalidArgumentError(f"{what}: not over several devices yet")

    def release_masks(self) -> None:
        pass  # no masked step is ever enqueued here
