"""FakeDevice: a scripted GPU for the control-logic tests, on a simulated clock.

Enqueued operations complete in order, `latency` ticks each (or several per tick); a tick passes
at every poll_ring or stream_query, so the host's polling drives the clock. A FakeScript says how
it misbehaves (fake_script.py): lost launches, sticky faults, fault-word codes, hangs, non-finite
logits.

Its forward writes logits from one rule (FakeScript.forward); a device-loop step with sampling set draws
from those very logits by arcpy.sampling's definition, so its loop and its host path agree
exactly, as the real ones must.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from arcpy.codes import (DRAFT_MEMORY, FAULT_DEGENERATE, FAULT_MASK_TIMEOUT, FAULT_NONE, FAULT_NONFINITE,
                         FAULT_POSITION_RANGE, FAULT_TOKEN_RANGE, MAX_STOP_IDS)
from arcpy.devices.fake_script import FakeScript, FakeStore
from arcpy.devices.protocol import Capabilities, Counters, RingState
from arcpy.devices.sequence import SequenceStart
from arcpy.drafting import draft
from arcpy.errors import ContextLostError, InvalidArgumentError
from arcpy.sampling import Sampler, Sampling, token_logprob
from arcpy.text.grammar import allowed, words


@dataclass
class _Op:
    kind: str
    arg: object = None
    step: int = -1


class FakeDevice(FakeStore):
    """A scripted GPU; see the module's docstring."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities("fake GPU (scripted)", loop=self.supports_loop, sampling=self.supports_sampling,
                            prefill=self.supports_prefill, speculate_k=self.speculate_k,
                            speculate_ngram=self.speculate_ngram, logprobs=self.supports_logprobs,
                            logit_bias=self.supports_logit_bias, prefix_granule=self.prefix_granule,
                            prefix_row_bytes=self.prefix_row_bytes, prefix_state_bytes=self.prefix_state_bytes,
                            masks=self.script.supports_masks)

    def __init__(self, script: FakeScript | None = None):
        self.script = script or FakeScript()
        self.vocab, self.max_seq = self.script.vocab, self.script.max_seq
        self.supports_loop = self.script.supports_loop
        self.supports_sampling = self.script.supports_sampling
        self.supports_prefill = self.script.supports_prefill
        self.prefix_granule = self.script.prefix_granule
        self.supports_logprobs = self.script.supports_logprobs
        self.supports_logit_bias = self.script.supports_logit_bias
        self.bias: tuple = ()  # SequenceStart.logit_bias: (id, value) pairs
        self.masking, self.mask, self.mask_ready, self.mask_waited = False, None, 0, 0  # SequenceStart.masked, write_mask
        self.mask_timeouts = 0  # masked steps that waited past the script's patience
        self.prefix_row_bytes = self.script.prefix_row_bytes
        self.prefix_state_bytes = self.script.prefix_state_bytes
        # The store's copies in order: ("save" or "load", offset, rows[, saved]), ("save_state" or
        # "load_state", offset, position), ("move", to, from, bytes).
        self.prefix_ops: list[tuple] = []
        self.top_logprobs: int | None = None  # SequenceStart.logprobs: None, off
        self.entries: list = []  # the log-probabilities of each ring token, as they are written
        self.step_logits = np.zeros(self.vocab, np.float32)  # the last step's, for its log-probabilities
        self.scored: list = []  # what the last enqueue_prompt_logprobs scored
        self.prefills: list[tuple[tuple[int, ...], int]] = []  # (tokens, start) of each prefill
        self.sampler: Sampler | None = None  # the loop's; None: the argmax
        self.queue: deque[_Op] = deque()
        self.busy_ticks, self.token, self.position = 0, 0, 0
        self.argmax = (-1, 0.0, 0.0)  # (token, its logit, the smallest logit)
        self.argmax_pending = (-1, 0.0, 0.0)
        self.queries = 0
        self.logits = np.zeros(self.vocab, np.float32)
        self.stop_ids: tuple[int, ...] = ()
        self.ring: list[int] = []
        self.fault, self.stopped, self.dev_fault = RingState(0), 0, FAULT_NONE
        self.sticky, self.steps_enqueued = False, 0
        self.speculate_k, self.speculate_ngram = self.script.speculate_k, self.script.speculate_ngram
        self.history = [0] * self.max_seq  # the loop's token history (drafts read it)
        self.memory: tuple[int, ...] = ()  # the drafts' memory of earlier sequences (SequenceStart.draft_memory)
        self.limit = None  # the ring count at which the burst stops publishing
        self.burst = 0  # the burst id last begun
        self.spec_steps = 0  # speculative steps whose commit ran
        self.drafts: list[list[int]] = []  # each speculative step's drafts, in order
        self.calls, self.log, self.closed = Counters(), [], False

    def _count(self, calls: int = 1, graphs: int = 0) -> None:
        self.calls = Counters(self.calls.cuda_calls + calls, self.calls.graph_launches + graphs)

    def _enqueue(self, op: _Op) -> None:
        if self.sticky:
            raise ContextLostError("device fault: an earlier asynchronous fault poisoned the context")
        self.queue.append(op)

    def _tick(self) -> None:
        for _ in range(self.script.ops_per_tick):
            if not self.queue or self.sticky:
                return
            op = self.queue[0]
            if op.kind == "step" and op.step == self.script.hang_at:
                return
            if op.kind == "step" and self._waits_for_mask(op.arg):
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
        elif op.kind == "history":
            tokens, start = op.arg
            self.history[start:start + len(tokens)] = tokens
        elif op.kind == "memory":
            self.memory = op.arg
        elif op.kind == "burst":
            self.limit = None if op.arg is None else len(self.ring) + op.arg
        elif op.kind == "spec":
            self._speculate(op)
        elif op.kind in ("forward", "prefill"):
            # A prefill leaves what a forward of its last token at its last position would.
            token, position, eager = (self.token, self.position, op.arg) if op.kind == "forward" else (*op.arg, False)
            self.logits, nxt = self.script.forward(token, position, eager=eager)
            self.argmax_pending = (nxt, float(self.logits[nxt]) if 0 <= nxt < self.vocab else 1.0,
                                   float(self.logits.min()))
        elif op.kind == "argmax":
            self.argmax = self.argmax_pending
        elif op.kind == "bias":
            self.logits, tok = self._add_bias(self.logits)
            self.argmax_pending = (tok, float(self.logits[tok]), float(self.logits.min()))
        elif op.kind == "step":
            if self._gone(op):
                return
            logits, tok = self.script.forward(self.token, self.position)
            if self.bias:
                logits, tok = self._add_bias(logits)
            if self.masking and self.position != s.nan_at_position:
                logits = np.where(allowed(self.mask, self.vocab), logits, np.float32(-np.inf)).astype(np.float32)
                tok = int(np.argmax(logits))
            tok = self._drawn(logits, tok, self.position)
            self.step_logits = logits
            self._commit(op, tok)
        elif op.kind == "logprobs" and len(self.entries) < len(self.ring):  # the step published a token
            self.entries.append(token_logprob(self.step_logits, self.ring[-1], op.arg))
        elif op.kind == "score":  # each token after the first, against a forward of the one before
            tokens, top = op.arg
            self.scored = [token_logprob(self.script.forward(t, i)[0], tokens[i + 1], top) for i, t in enumerate(tokens[:-1])]

    def _drawn(self, logits: np.ndarray, argmax: int, position: int) -> int:
        """The token a step at `position` makes of its logits: the argmax, or with a sampler set the
        draw for position + 1 (as the device's; the script's broken positions keep the argmax, which
        their commit refuses)."""
        s = self.script
        if self.sampler is not None and position not in (s.nan_at_position, s.flat_at_position):
            return self.sampler.sample(logits, position + 1)
        return argmax

    def _add_bias(self, logits: np.ndarray) -> tuple[np.ndarray, int]:
        """The logits with the bias added (float32, as the device adds it), and their argmax."""
        logits = logits.copy()
        for i, v in self.bias:
            logits[i] += np.float32(v)
        return logits, int(np.argmax(logits))

    def _waits_for_mask(self, burst_id: int) -> bool:
        """A masked step whose commit would publish waits for its mask (mask.cu); past the
        script's patience it latches the timeout fault, as the kernel does."""
        publishes = not (self.dev_fault or self.stopped == burst_id or
                         (self.limit is not None and len(self.ring) >= self.limit))
        if not (self.masking and publishes and self.mask_ready <= len(self.ring)):
            self.mask_waited = 0
            return False
        self.mask_waited += 1
        if self.mask_waited <= self.script.mask_patience:
            return True
        self.dev_fault, self.mask_timeouts = FAULT_MASK_TIMEOUT, self.mask_timeouts + 1
        self.fault = RingState(0, FAULT_MASK_TIMEOUT, -1, self.position + 1)
        return False

    def _set_masking(self, on: bool) -> None:
        if on and not self.script.supports_masks:
            raise InvalidArgumentError("this device loop applies no token mask")
        self.masking = on

    def write_mask(self, n: int, words) -> None:
        self.mask, self.mask_ready = np.array(words, dtype=np.int32), n + 1

    def release_masks(self) -> None:
        if self.masking:
            self.mask, self.mask_ready = np.full(words(self.vocab), -1, np.int32), 0xFFFFFFFF

    def _gone(self, op: _Op) -> bool:
        """A step the script breaks: a sticky fault (the stream is poisoned), or a lost launch."""
        s = self.script
        if op.step == s.sticky_fault_at:
            self.sticky = True
            self.queue.clear()
            return True
        return op.step in s.lost_steps

    def _commit(self, op: _Op, tok: int) -> bool:
        """The commit's checks and publication of `tok`, as commit.cuh's publish_token."""
        s = self.script
        if self.dev_fault or self.stopped == op.arg or (self.limit is not None and len(self.ring) >= self.limit):
            return False
        nxt_pos = self.position + 1
        code = FAULT_NONE
        if op.step == s.fault_word_at:
            code = s.fault_code
        elif self.position == s.nan_at_position:
            code = FAULT_NONFINITE
        elif self.position == s.flat_at_position and self.vocab > 1:
            code = FAULT_DEGENERATE
        elif not 0 <= tok < self.vocab:
            code = FAULT_TOKEN_RANGE
        elif nxt_pos >= self.max_seq:
            code = FAULT_POSITION_RANGE
        if code:
            self.dev_fault = code
            self.fault = RingState(0, code, tok, nxt_pos)
            return False
        self.token, self.position = tok, nxt_pos
        self.history[nxt_pos] = tok
        self.ring.append(tok)
        if s.honor_stop_ids and tok in self.stop_ids:
            self.stopped = op.arg
        return True

    def _speculate(self, op: _Op) -> None:
        """A speculative step: drafts from the history, the model's token after each row (its
        argmax, or its draw at that row's position), and the accepted run committed token by token
        (speculate.cu's accept)."""
        if self._gone(op):
            return
        p = self.position
        self.history[p] = self.token
        drafts = draft(self.history[:p + 1], self.speculate_k, self.speculate_ngram, self.memory)
        self.drafts.append(drafts)
        rows = [self.token, *drafts]
        for i, row_token in enumerate(rows):
            made = self._drawn(*self.script.forward(row_token, p + i), p + i)
            if not self._commit(op, made) or i >= len(drafts) or drafts[i] != made:
                break
        self.spec_steps += 1

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

    def close(self) -> None:
        self.queue.clear()
        self.closed = True

    def enqueue_prefill(self, tokens, start: int) -> None:
        if not self.supports_prefill:
            raise InvalidArgumentError("this device has no prefill")
        tokens = tuple(int(t) for t in tokens)
        if not tokens or start < 0 or start + len(tokens) > self.max_seq:
            raise InvalidArgumentError(f"prefill of {len(tokens)} tokens at {start} out of range")
        self._count()
        self.prefills.append((tokens, start))
        self._enqueue(_Op("prefill", (tokens[-1], start + len(tokens) - 1)))
        if self.speculate_k:
            self._enqueue(_Op("history", (tokens, start)))

    def enqueue_prompt_logprobs(self, tokens, top_n: int) -> None:
        self.enqueue_prefill(tokens, 0)
        self._enqueue(_Op("score", (tuple(int(t) for t in tokens), top_n)))

    def read_prompt_logprobs(self) -> list:
        if self.queue:
            raise InvalidArgumentError("the prompt's log-probabilities are read once the stream is idle")
        return self.scored

    def enqueue_forward(self, eager: bool = False) -> None:
        self._count(1, 0 if eager else 1)
        self._enqueue(_Op("forward", eager))

    def enqueue_argmax(self, bias: bool = False) -> None:
        if bias:
            self._enqueue_bias()
        self._count()
        self._enqueue(_Op("argmax"))

    def enqueue_logits_to_host(self, bias: bool = False) -> None:
        if bias:
            self._enqueue_bias()
        self._count()
        self._enqueue(_Op("argmax"))

    def sampled(self) -> tuple[int, float, float]:
        return self.argmax

    def host_logits(self) -> np.ndarray:
        return self.logits.copy()

    def begin_sequence(self, start: SequenceStart) -> bool:
        # In the order arc_loop_begin_sequence writes its parts.
        if start.loop:
            if not self._reset_ring():
                return False
            if len(start.stop_ids) > MAX_STOP_IDS:
                raise InvalidArgumentError(f"at most {MAX_STOP_IDS} stop ids")
            self.stop_ids = tuple(start.stop_ids)
            self._set_sampling(start.sampling)
            if start.logprobs is not None or self.supports_logprobs:
                self._set_logprobs(start.logprobs)
            if start.masked or self.script.supports_masks:
                self._set_masking(start.masked)
        if start.logit_bias or self.supports_logit_bias:
            self._set_logit_bias(start.logit_bias)
        if start.draft_memory is not None:
            self._set_draft_memory(start.draft_memory)
        if start.history is not None:
            self._set_history(start.history)
        if start.input is not None:
            self.set_input(*start.input)
        return True

    def _reset_ring(self) -> bool:
        if not self.stream_query():
            return False
        self.ring, self.dev_fault, self.fault, self.stopped = [], FAULT_NONE, RingState(0), 0
        self.entries, self.mask_ready = [], 0
        self.spec_steps, self.limit = 0, None
        return True

    def _set_sampling(self, sampling: Sampling | None) -> None:
        if sampling is not None and not sampling.is_greedy():
            if not self.supports_sampling:
                raise InvalidArgumentError("this device loop draws the argmax only")
            if sampling.seed is None:
                raise InvalidArgumentError("the device loop draws with a resolved seed, got None")
        # At once, like the stop ids: the driver sets both on an idle stream, after the ring reset.
        self._count()
        self.sampler = None if sampling is None or sampling.is_greedy() else Sampler(sampling)

    def enqueue_step(self, burst_id: int, graphs: int = 1) -> None:
        self.begin_burst(burst_id, None)
        self._count(3, graphs)
        step = self.steps_enqueued
        self.steps_enqueued += 1
        self.log.append(f"step {step} burst {burst_id}" + ("" if graphs else " (commit)"))
        # A forward, the sampler and the commit; the fake folds them into one operation. The
        # log-probabilities are one more, so they land a tick after the token.
        self._enqueue(_Op("step", burst_id, step))
        if self.top_logprobs is not None:
            self._enqueue(_Op("logprobs", self.top_logprobs))

    def enqueue_commit(self, burst_id: int) -> None:
        # Its forward is the prefill's, whose logits are the step's own: the same operation here,
        # counted as a step for the fault script, with no graph launch.
        self.enqueue_step(burst_id, graphs=0)

    def _set_history(self, tokens) -> None:
        tokens = tuple(int(t) for t in tokens)
        if not tokens or len(tokens) > self.max_seq:
            raise InvalidArgumentError(f"a history of {len(tokens)} tokens does not fit max_seq {self.max_seq}")
        self._count()
        self._enqueue(_Op("history", (tokens, 0)))

    def _set_draft_memory(self, layout) -> None:
        layout = tuple(int(t) for t in layout)
        if not (self.speculate_k and len(layout) <= DRAFT_MEMORY and (not layout or layout[-1] < 0)):
            raise InvalidArgumentError(f"a draft memory of {len(layout)} ids refused (as CudaDevice refuses it)")
        self._count()
        self._enqueue(_Op("memory", layout))

    def begin_burst(self, burst_id: int, max_tokens: int | None) -> None:
        # As arc_loop_begin_burst(_limit): written to the device only when the id changes.
        if burst_id != self.burst:
            self._count()
            self._enqueue(_Op("burst", max_tokens))
            self.burst = burst_id

    def enqueue_spec_step(self, burst_id: int) -> None:
        if not self.speculate_k:
            raise InvalidArgumentError("this device has no speculative step")
        self.begin_burst(burst_id, None)
        self._count(1, 1)
        step = self.steps_enqueued
        self.steps_enqueued += 1
        self.log.append(f"spec {step} burst {burst_id}")
        self._enqueue(_Op("spec", burst_id, step))

    def poll_ring(self) -> RingState:
        self._tick()
        f = self.fault
        return RingState(len(self.ring), f.fault, f.fault_token, f.fault_pos, self.stopped, self.spec_steps,
                         len(self.entries))

    def read_ring(self, first: int, count: int) -> list[int]:
        if first + count > len(self.ring):
            raise InvalidArgumentError("tokens not published yet")
        return self.ring[first:first + count]

    def _set_logit_bias(self, pairs) -> None:
        if pairs and not self.supports_logit_bias:
            raise InvalidArgumentError("this device adds no logit bias")
        self._count()
        self.bias = tuple(pairs)  # at once, like the sampling: set on an idle stream

    def _enqueue_bias(self) -> None:
        self._count()
        self._enqueue(_Op("bias"))

    def _set_logprobs(self, top_n: int | None) -> None:
        if top_n is not None and not self.supports_logprobs:
            raise InvalidArgumentError("this device loop writes no log-probabilities")
        self._count()
        self.top_logprobs = top_n

    def read_logprobs(self, first: int, count: int) -> list:
        if first + count > len(self.entries):
            raise InvalidArgumentError("log-probabilities not written yet")
        return self.entries[first:first + count]
