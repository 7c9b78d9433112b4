"""The records of one sequence: what a request asks for (SequenceSpec), built once and handed whole
to the engine, and what a device writes at the sequence's start (SequenceStart), handed whole to
DeviceOps.begin_sequence (arc_loop_begin_sequence on the GPU: one call, its parts stream-ordered).

A per-request option is a field of SequenceSpec; where the device applies it, a field of
SequenceStart too, which arcpy/loop/plan.py fills from the spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arcpy.sampling import Sampling


@dataclass(frozen=True)
class SequenceSpec:
    """One request, as the engine runs it: token ids throughout (front ends render text and
    stop strings into these). Validated against the device by arcpy/loop/plan.py."""

    prompt: tuple[int, ...]
    max_new_tokens: int
    stop_ids: tuple[int, ...] = ()   # distinct, in the order given
    sampling: Sampling = field(default_factory=Sampling)  # its seed unresolved (None: one is drawn per sequence)
    logprobs: int | None = None      # each token's log-probability with this many alternatives; None: none
    logit_bias: tuple[tuple[int, float], ...] = ()  # (id, value) pairs, ids distinct
    matcher: object | None = None    # a grammar's matcher (arcpy.text.grammar): the answer follows it

    @property
    def plain(self) -> bool:
        """Nothing a speculative step does not compute: no log-probabilities, bias or grammar."""
        return self.logprobs is None and not self.logit_bias and self.matcher is None


@dataclass(frozen=True)
class SequenceStart:
    """What a device writes at a sequence's start, in this order. `loop`: a device-loop sequence,
    whose ring is reset (refused while steps are in flight: begin_sequence returns False and writes
    nothing), then its stop ids, sampling parameters (None: the argmax), log-probabilities (None:
    none) and masking; else those are left as they are. Then, on every path, the logit bias (on a
    device that adds one: () for none), the drafts' memory (None: unchanged), the drafts' history
    from position 0 (None: none written) and the input the next forward reads, (token, position)
    (None: none written)."""

    loop: bool = False
    stop_ids: tuple[int, ...] = ()
    sampling: Sampling | None = None  # its seed resolved
    logprobs: int | None = None
    masked: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    draft_memory: tuple[int, ...] | None = None
    history: tuple[int, ...] | None = None
    input: tuple[int, int] | None = None
