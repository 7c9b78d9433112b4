"""What a sequence runs as, decided before anything reaches the device: a SequenceSpec
(arcpy/devices/sequence.py) checked against the device's vocabulary and context, the path it takes
(the device loop, admitted by gate.py and Capabilities.admits, or the host path), whether its prompt
is prefilled, and what ends it. Pure: no device call, so the decision is testable on its own; the
engine (engine.py) runs it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from arcpy.devices.protocol import Capabilities
from arcpy.devices.sequence import SequenceSpec, SequenceStart
from arcpy.errors import InvalidArgumentError
from arcpy.loop import gate
from arcpy.loop.prompt import check_prompt
from arcpy.loop.request import logit_bias_pairs
from arcpy.loop.stats import CONTEXT_FULL, TOKEN_BUDGET
from arcpy.sampling import Sampling


def sequence_spec(prompt_ids: Iterable[int], max_new_tokens: int, stop_ids: Iterable[int] = (),
                  sampling: Sampling | None = None, matcher=None, logprobs: int | None = None,
                  logit_bias=()) -> SequenceSpec:
    """A SequenceSpec from Engine.start's arguments: the logit bias checked (a mapping or pairs),
    the ids made ints, the stop ids made distinct."""
    bias = logit_bias_pairs(logit_bias)
    prompt = tuple(int(t) for t in prompt_ids)
    stops = tuple(dict.fromkeys(int(t) for t in stop_ids))
    return SequenceSpec(prompt, max_new_tokens, stops, sampling or Sampling(), logprobs, bias, matcher)


@dataclass(frozen=True)
class Settings:
    """The engine's choices a plan reads (Engine's attributes of the same names)."""

    device_loop: bool | None = None  # None: ARC_GRAPH_DEVICE_LOOP decides
    verify: bool = False             # the host path verifies every step
    prefill: bool = True             # off: the prompt goes through the decode step token by token
    speculate: bool = True           # off: never a speculative step
    environ: Mapping[str, str] | None = None
    latch: gate.FallbackLatch = gate.LATCH


@dataclass(frozen=True)
class Plan:
    spec: SequenceSpec
    loop: bool            # the device loop; else the host path
    reason: str           # why (gate.device_loop_admission's reason)
    bias_on_device: bool  # the device adds the logit bias (else the host path adds it to the logits it reads)
    prefill: bool         # the prompt goes through in one forward
    max_new: int          # tokens the sequence may produce: its budget, or what the context has room for
    budget_reason: str    # why max_new ends it
    speculate: bool       # speculative bursts may be considered (arcpy/loop/speculate.py decides where they pay)

    def device_start(self, sampling: Sampling | None, memory, restored: bool) -> SequenceStart:
        """What the device writes at the start: `sampling` with its seed resolved (None: the argmax),
        the drafts' `memory` (None: no speculative bursts), the history from position 0 where the
        prefill will not write it whole (a prompt that goes through token by token, or one whose
        prefix was `restored` from the store), and the input the first commit continues from
        after a prefill."""
        spec, prompt = self.spec, self.spec.prompt
        return SequenceStart(
            loop=self.loop, stop_ids=spec.stop_ids, sampling=sampling, logprobs=spec.logprobs,
            masked=self.loop and spec.matcher is not None,
            logit_bias=spec.logit_bias if self.bias_on_device else (),
            draft_memory=None if memory is None else tuple(memory),
            history=prompt if memory is not None and (restored or not self.prefill) else None,
            input=(prompt[-1], len(prompt) - 1) if self.prefill else None)


def plan_sequence(spec: SequenceSpec, caps: Capabilities, vocab: int, max_seq: int, settings: Settings) -> Plan:
    """`spec` on a device of `caps` with `vocab` ids and a context of `max_seq`; raises
    InvalidArgumentError for a request the device cannot take."""
    prompt = spec.prompt
    if not prompt:
        raise InvalidArgumentError("the prompt is empty: give at least one token id")
    check_prompt(list(prompt), vocab, max_seq, spec.stop_ids + tuple(i for i, _ in spec.logit_bias),
                 f" (the engine's max_seq {max_seq})")
    n = spec.max_new_tokens
    if not (isinstance(n, int) and n >= 0):
        raise InvalidArgumentError(f"max_new_tokens must be an integer >= 0, got {n!r}")
    loop, reason = gate.device_loop_admission(settings.device_loop, caps, spec, environ=settings.environ,
                                              latch=settings.latch, verify=settings.verify)
    room = max_seq - len(prompt)
    return Plan(spec, loop, reason,
                bias_on_device=bool(spec.logit_bias) and caps.logit_bias and not settings.verify,
                prefill=settings.prefill and not settings.verify and caps.prefill,
                max_new=min(n, room), budget_reason=TOKEN_BUDGET if n <= room else CONTEXT_FULL,
                speculate=settings.speculate and spec.plain)


def with_loop(caps: Capabilities, loop: bool) -> Capabilities:
    """`caps` with the loop as the engine has it (its burst driver, made where the device had one)."""
    return caps if caps.loop == loop else replace(caps, loop=loop)
