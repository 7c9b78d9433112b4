"""What the drafts of speculative steps look up, on its way to the GPU: a sequence's history
(through the prompt's staging) and the memory of earlier sequences (through pinned, mapped staging
of its own that the library's copy reads, rewritten only once no earlier copy can still read it,
sent only when it changed). Both go to the loop in arc_loop_begin_sequence (sequence_writes.py)."""

from __future__ import annotations

import numpy as np

from arcpy.codes import DRAFT_MEMORY
from arcpy.devices.context import IDLE_SPINS
from arcpy.devices.protocol import spin_until
from arcpy.errors import InvalidArgumentError


class DraftStaging:
    """CudaDevice's: it reads the device's `ctx`, `ffi`, `speculate_k`, `max_seq`,
    `_prompt_dev` and `_stage_prompt` (the prompt's staging),
    `_memory` (the memory's staging: None until _reserve_draft_memory), `_memory_sent` (what the
    device holds) and `_memory_in_use` (cleared once the stream is seen idle)."""

    def _stage_history(self, tokens) -> tuple[object, int]:
        """The history the drafts look up, from position 0 (a prompt that went through token by
        token, or one whose prefix was copied back), staged: (pointer, count) for the loop."""
        n = len(tokens)
        if not (self.speculate_k and 1 <= n <= self.max_seq):
            raise InvalidArgumentError(f"a history of {n} tokens needs a speculative step and at most max_seq "
                                       f"{self.max_seq} tokens")
        self._stage_prompt(tokens)
        return self._prompt_dev, n

    def _reserve_draft_memory(self) -> None:
        """The staging, allocated once, at load: an allocation may wait for the GPU."""
        if self._memory is None:
            memory, memory_dev = self.ctx.pinned((DRAFT_MEMORY,), np.int32)
            self._memory = (memory, self.ffi.cast("int32_t *", memory_dev))

    def _stage_draft_memory(self, layout) -> tuple[object, int] | None:
        """The drafts' memory (DraftMemory.layout()) staged: (pointer, count) for the loop, or None
        where it is what the device holds already. Waits only where the last copy may still read
        the staging."""
        layout = np.asarray(layout, np.int32)
        n = len(layout)
        if not (self.speculate_k and n <= DRAFT_MEMORY and (n == 0 or layout[-1] < 0)):
            raise InvalidArgumentError(f"a draft memory of {n} ids needs a speculative step, at most {DRAFT_MEMORY} "
                                       "ids and a separator last")
        if self._memory_sent is not None and np.array_equal(self._memory_sent, layout):
            return None
        if self._memory_in_use:
            spin_until(self.stream_query, IDLE_SPINS, "draft memory: waiting for the last copy")
        staging, staging_dev = self._memory
        staging[:max(n - 1, 0)] = layout[:-1]  # the library adds the last separator
        self._memory_sent, self._memory_in_use = layout, True
        return staging_dev, max(n - 1, 0)
