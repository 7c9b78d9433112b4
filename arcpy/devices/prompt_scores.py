"""The GPU's scoring of a prompt (an echoed prompt's log-probabilities, arcpy/loop/host.py): one
prefill from position 0 that also ranks each row's logits on the device, as the loop ranks a
step's, into pinned, mapped arrays that the host reads once the stream is idle."""

from __future__ import annotations

import numpy as np

from arcpy import _lib
from arcpy.codes import MAX_TOP_LOGPROBS
from arcpy.errors import InvalidArgumentError
from arcpy.sampling import TokenLogprob, logprob_entries


class PromptScores:
    """CudaDevice's scoring: it reads the device's `ctx`, `ffi`, `lib`, `loop`, `forward`, `vocab`,
    `max_seq`, `speculate_k`, `supports_prefill` and `_scores` (None until the first call
    allocates the arrays: max_seq entries)."""

    def enqueue_prompt_logprobs(self, tokens, top_n: int) -> None:
        """The prefill of `tokens` from position 0 (the KV rows and last logits a prefill writes),
        each token after the first scored with `top_n` alternatives (read_prompt_logprobs)."""
        n = len(tokens)
        if not (self.supports_prefill and 2 <= n <= self.max_seq and 0 <= top_n <= MAX_TOP_LOGPROBS):
            raise InvalidArgumentError(f"scoring {n} tokens with {top_n} alternatives needs a prefill, 2 to max_seq "
                                       f"{self.max_seq} tokens and 0 to {MAX_TOP_LOGPROBS} alternatives")
        if self._scores is None:  # pinned allocations, at the first scoring rather than at start-up
            self._scores = (self.ctx.pinned((self.max_seq,), np.float32),
                            self.ctx.pinned((self.max_seq, MAX_TOP_LOGPROBS), np.int32),
                            self.ctx.pinned((self.max_seq, MAX_TOP_LOGPROBS), np.float32))
        (_, lp), (_, ids), (_, values) = self._scores
        self._stage_prompt(tokens)
        self.forward.score(self._prompt_dev, n, self.vocab, top_n, self.ffi.cast("float *", lp),
                           self.ffi.cast("int32_t *", ids), self.ffi.cast("float *", values))
        if self.speculate_k:  # the prompt is the history the drafts are looked up in, as after a prefill
            _lib.check(self._begin(history=(self._prompt_dev, n)))
        self._scored = (n - 1, top_n)

    def read_prompt_logprobs(self) -> list[TokenLogprob]:
        """What the last enqueue_prompt_logprobs wrote, once the stream is idle: one entry per
        token after the first (an id of -1, past a small vocabulary, is no alternative)."""
        self._require_idle("the prompt's log-probabilities")
        (lp, _), (ids, _), (values, _) = self._scores
        count, top_n = self._scored
        return logprob_entries(lp[:count].tolist(), ids[:count].ravel().tolist(), values[:count].ravel().tolist(),
                               top_n)
