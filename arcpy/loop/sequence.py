"""The state of the sequence an Engine is decoding (arcpy/loop/engine.py)."""

from __future__ import annotations

from dataclasses import dataclass

from arcpy.loop.constrain import Constrained
from arcpy.loop.speculate import SpecPolicy
from arcpy.sampling import Sampler


@dataclass
class SequenceState:
    """The engine's running sequence: where it is, what ends it, how its tokens are drawn."""

    last_token: int
    position: int            # position of last_token
    max_new: int
    stop_ids: frozenset
    sampler: Sampler
    loop: bool
    budget_reason: str = ""  # why max_new ends it: the caller's budget, or the context
    prefilled: bool = False  # the next token comes from the prefill's logits, not a forward
    policy: SpecPolicy | None = None  # speculative bursts where they pay (the device loop)
    logprobs: int | None = None  # each token's log-probabilities with this many alternatives; None: none
    bias: tuple = ()         # the logit bias, (id, value) pairs
    bias_on_device: bool = False  # the device adds it (else the host path adds it to the logits it reads)
    constrained: Constrained | None = None  # the answer follows a grammar (its mask on the device or the host)
    produced: int = 0        # tokens handed out
    finished: bool = False
