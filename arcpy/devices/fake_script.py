"""FakeScript: how FakeDevice (fake.py), the scripted GPU of the control-logic tests, misbehaves
and what it can do; FakeStore: its store of earlier prefixes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from arcpy.codes import FAULT_TOKEN_RANGE
from arcpy.devices.scripted import scripted_next


@dataclass
class FakeScript:
    """How the fake GPU misbehaves. Step indices count enqueue_step calls from 0."""

    vocab: int = 64
    max_seq: int = 4096
    latency: int = 3                      # polls (simulated ticks) per enqueued operation
    ops_per_tick: int = 1                 # operations that may complete in one tick
    lost_steps: frozenset = frozenset()   # commits that silently never happen
    sticky_fault_at: int | None = None    # step at which a sticky CUDA error poisons the stream
    fault_word_at: int | None = None      # step whose commit latches the fault word
    fault_code: int = FAULT_TOKEN_RANGE
    hang_at: int | None = None            # step that never completes
    honor_stop_ids: bool = True
    next_token: Callable[[int, int], int] | None = None
    supports_loop: bool = True
    supports_sampling: bool = True        # the loop draws non-greedy tokens (else: the argmax only)
    supports_prefill: bool = True         # a prompt goes through in one forward
    prefix_granule: int = 1               # a reused prefix is a multiple of this (0: none reused)
    supports_logprobs: bool = True        # the loop writes log-probabilities (a tick after each token)
    supports_logit_bias: bool = True      # a logit bias is added on the device (both paths)
    prefix_row_bytes: int = 0             # bytes a position's KV rows take in the prefix store (0: no store)
    prefix_state_bytes: int = 0           # bytes of the recurrent state a prefix needs at its end (0: none)
    eager_offset: float = 0.0             # added to the eager forward's logits (verify tests)
    nan_at_position: int | None = None    # the forward at this position yields NaN logits
    flat_at_position: int | None = None   # the forward at this position yields all-equal logits
    supports_masks: bool = True           # the loop's steps apply a token mask the host writes
    mask_patience: int = 10_000           # ticks a masked step waits for its mask before the fault
    speculate_k: int = 0                  # drafts a speculative step verifies (0: no such step)
    speculate_ngram: int = 3

    def forward(self, token: int, position: int, eager: bool = False) -> tuple[np.ndarray, int]:
        """The logits the fake's forward writes for (token, position), and their argmax: the
        scripted next token, which (like a padded lm_head's) may lie outside the vocabulary."""
        s = self
        nxt = s.next_token(token, position) if s.next_token is not None else scripted_next(token, position, s.vocab)
        logits = np.linspace(0.0, 0.5, self.vocab, dtype=np.float32)
        if 0 <= nxt < self.vocab:
            logits[nxt] = 1.0
        if eager:
            logits += np.float32(s.eager_offset)
        if position == s.nan_at_position:
            logits[:] = np.nan
            nxt = 0  # NaN wins the argmax, first index first
        if position == s.flat_at_position:
            logits[:] = 0.25
            nxt = 0  # equal values go to the lowest index
        return logits, nxt


class FakeStore:
    """FakeDevice's store of earlier prefixes (arcpy/loop/prefix.py): each copy recorded in order in
    `prefix_ops` and counted as a CUDA call; the device's `prefix_row_bytes` and
    `prefix_state_bytes` size it."""

    def default_prefix_store_bytes(self) -> int:
        return 64 * self.prefix_row_bytes + 4 * self.prefix_state_bytes

    def reserve_prefix_store(self, nbytes: int) -> int:
        return nbytes

    def save_prefix(self, offset: int, n: int) -> None:
        self._store_op("save", offset, n)

    def load_prefix(self, offset: int, n: int, saved: int) -> None:
        self._store_op("load", offset, n, saved)

    def save_state(self, offset: int, position: int) -> None:
        self._store_op("save_state", offset, position)

    def load_state(self, offset: int, position: int) -> None:
        self._store_op("load_state", offset, position)

    def move_stored(self, to: int, source: int, nbytes: int) -> None:
        self._store_op("move", to, source, nbytes)

    def _store_op(self, *op) -> None:
        self._count()
        self.prefix_ops.append(op)
