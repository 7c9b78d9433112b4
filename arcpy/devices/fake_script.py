"""FakeScript: how FakeDevice (fake.py), the scripted GPU of the control-logic tests, misbehaves
and what it can do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from arcpy.codes import FAULT_TOKEN_RANGE


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
    eager_offset: float = 0.0             # added to the eager forward's logits (verify tests)
    nan_at_position: int | None = None    # the forward at this position yields NaN logits
    flat_at_position: int | None = None   # the forward at this position yields all-equal logits
    supports_masks: bool = True           # the loop's steps apply a token mask the host writes
    mask_patience: int = 10_000           # ticks a masked step waits for its mask before the fault
    speculate_k: int = 0                  # drafts a speculative step verifies (0: no such step)
    speculate_ngram: int = 3
