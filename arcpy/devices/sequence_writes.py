"""CudaDevice's sequence start and input: SequenceStart (sequence.py) as arc_loop_begin_sequence
calls, its parts in the library's order, each a stream-ordered write."""

from __future__ import annotations

from arcpy import _lib
from arcpy.codes import ARC_BUSY
from arcpy.devices.context import sequence_struct
from arcpy.devices.sequence import SequenceStart
from arcpy.errors import InvalidArgumentError


class SequenceWrites:
    """CudaDevice's: it reads the device's `ffi`, `lib`, `loop`, its supports_* flags, the staging
    of DraftStaging, and keeps `_drawing`, `_top_logprobs`, `_masking` (which step graphs run) and
    `_bias` (the loop holds bias pairs)."""

    def _begin(self, **parts) -> int:
        self._idle = False
        seq, _keep = sequence_struct(self.ffi, self.lib, **parts)
        return self.lib.arc_loop_begin_sequence(self.loop, seq)

    def set_input(self, token: int, position: int) -> None:
        _lib.check(self._begin(token_input=(token, position)))

    def begin_sequence(self, start: SequenceStart) -> bool:
        """Two calls: the ring's reset (refused while steps are in flight: False, nothing written),
        the stop ids, sampling, log-probabilities and logit bias; then, the stream having been idle
        so that nothing reads the staging, the drafts' memory, history and the input."""
        first = {}
        if start.loop:
            drawing = start.sampling is not None and not start.sampling.is_greedy()
            if drawing and not self.supports_sampling:
                raise InvalidArgumentError("this device's loop has no draw: sampling takes the host path")
            if drawing and start.sampling.seed is None:
                raise InvalidArgumentError("the device draw needs a resolved seed")
            if start.logprobs is not None and not self.supports_logprobs:
                raise InvalidArgumentError("this device's loop writes no log-probabilities")
            if start.masked and not self.supports_masks:
                raise InvalidArgumentError("this device's loop applies no token mask")
            first = dict(reset=True, stop_ids=start.stop_ids, sampling=start.sampling if drawing else None,
                         top_logprobs=start.logprobs)
        if start.logit_bias or self._bias:  # none to write where none was, nor is
            first["bias"] = start.logit_bias
        if first:
            status = self._begin(**first)
            if status == ARC_BUSY:
                return False
            _lib.check(status)
        if start.loop:
            self._prompt_in_use = self._memory_in_use = False  # the stream was idle: nothing reads the staging
            self._drawing, self._top_logprobs, self._masking = drawing, start.logprobs, start.masked
        if "bias" in first:
            self._bias = bool(start.logit_bias)
        rest = {}
        if start.draft_memory is not None:
            rest["memory"] = self._stage_draft_memory(start.draft_memory)  # None: the device holds it
        if start.history is not None:
            rest["history"] = self._stage_history(start.history)
        if start.input is not None:
            rest["token_input"] = start.input
        if any(v is not None for v in rest.values()):
            _lib.check(self._begin(**rest))
        return True
