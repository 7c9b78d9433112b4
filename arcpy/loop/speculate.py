"""When the device loop speculates, and for how many steps.

A speculative step verifies k drafts in one read of the weights; it costs more than a plain step
(k + 1 rows through every product, a draft, an accept) and gains only where the drafts match. The
choice is made per burst, from two measurements:

- what speculation would make of this sequence: `Acceptance` replays the device's drafts over the
  tokens seen so far (the output, greedy or drawn by position from a seed, does not depend on how
  it was produced), so the estimate
  exists on plain bursts as well as on speculative ones;
- what a step of each kind costs on this device: the wall time of whole bursts, per step, kept
  across sequences (`StepCost`), with a prior for the kind not yet measured.

A burst speculates when the expected tokens per speculative step exceed the cost of such a step
in plain steps by a margin; so k is in effect 0 where nothing repeats. Greedy and sampled requests
speculate alike: a sampled step draws the token after each verify row with the plain step's draw
at that row's position and accepts a draft where it equals the drawn token, so every token is a
draw from the model's distribution and the estimate (drafts that match the tokens made) is the same
for both. The verify's rows have the plain step's logits bit for bit (libarc's arc.h), so a seeded
request gives the same tokens whichever steps ran, and which bursts speculate never shows in the
output. A sequence starts on the
plain loop (the estimate starts at one token a step) and turns to speculation as soon as the
tokens it has made show drafts that would have matched. The drafts also come from earlier
sequences (the engine's DraftMemory, which the device searches too), so a question asked again
speculates from its second burst on.
"""

from __future__ import annotations

import math
import time
from typing import Iterator, Sequence

from arcpy.drafting import Acceptance
from arcpy.loop.burst import BurstDriver
from arcpy.loop.stats import GenerationStats

PLAIN, SPECULATIVE = "plain", "speculative"
COST_PRIOR = 1.3  # a speculative step in plain steps, until both kinds are measured on this device
MARGIN = 1.1      # the expected gain a burst must show before it speculates


class StepCost:
    """Seconds per step of each kind: a moving average over whole bursts. With `measure` off the
    ratio stays the prior (a policy that does not depend on timing; prior 0 speculates always)."""

    def __init__(self, weight: float = 0.3, measure: bool = True, prior: float = COST_PRIOR):
        self.weight = weight
        self.measure = measure
        self.prior = prior
        self.seconds: dict[str, float] = {}

    def record(self, kind: str, steps: int, seconds: float) -> None:
        if not self.measure or steps < 1 or not seconds > 0:
            return
        per = seconds / steps
        old = self.seconds.get(kind)
        self.seconds[kind] = per if old is None else old + self.weight * (per - old)

    def ready(self) -> bool:
        """Whether a plain step has been timed here (always, when not measuring): the ratio means
        nothing before. The first burst of a sequence carries the prefill and is not timed, so the
        second burst of the first sequence is a plain one."""
        return not self.measure or PLAIN in self.seconds

    def ratio(self) -> float:
        """A speculative step's cost in plain steps."""
        if PLAIN in self.seconds and SPECULATIVE in self.seconds:
            return self.seconds[SPECULATIVE] / self.seconds[PLAIN]
        return self.prior


class SpecPolicy:
    """One sequence's choice, burst by burst, from the estimate of what its drafts would make
    (`memory`: the drafts' memory of earlier sequences, as the device holds it). `answer` keeps
    the tokens made, for the memory of the sequences after this one."""

    def __init__(self, k: int, ngram: int, prompt: Sequence[int], cost: StepCost, memory: Sequence[int] = ()):
        self.acceptance = Acceptance(k, ngram, prompt, prior=1.0, memory=memory)
        self.cost = cost
        self.prompt = prompt
        self.answer: list[int] = []

    def push(self, tok: int) -> None:
        self.acceptance.push(tok)
        self.answer.append(tok)

    def speculate(self) -> bool:
        return self.cost.ready() and self.acceptance.tokens_per_step > MARGIN * self.cost.ratio()

    def steps(self, burst: int, remaining: int) -> int:
        """Speculative steps for a burst of at most `burst` steps and `remaining` tokens: never so
        many that the budget would end the burst early (a step past it reads every weight for
        nothing); a burst that stops short costs only the host's turn-around."""
        expected = max(1.0, self.acceptance.tokens_per_step)
        return max(1, min(burst, math.floor(remaining / expected)))


def speculation(device, allowed: bool, admitted: bool, prompt: Sequence[int], cost: StepCost,
                stats: GenerationStats, memory: Sequence[int] = ()) -> SpecPolicy | None:
    """A sequence's policy, or None where it does not speculate (stats.speculation says why).
    `allowed`: the engine's choice; `admitted`: the sequence runs on the device loop; `memory`: the
    drafts' memory the device will search (DraftMemory.layout())."""
    caps = device.capabilities
    k, refused = caps.speculate_k, caps.speculation_refused
    if not (k and allowed):
        stats.speculation = f"off: {refused}" if refused and allowed else "off"
    elif not admitted:
        stats.speculation = "off: only the device loop speculates"
    else:
        stats.speculation, stats.drafts = "on", k
        return SpecPolicy(k, caps.speculate_ngram, prompt, cost, memory)
    return None


def burst(driver: BurstDriver, policy: SpecPolicy | None, stats: GenerationStats, cost: StepCost, most: int,
          remaining: int, first_commit: bool) -> Iterator[int]:
    """One burst of the device loop of at most `most` steps and `remaining` tokens, speculative where
    the policy says it pays; the policy sees every token. A burst that runs to its end is timed for
    the policy (not the first: the prefill is in it)."""
    t0 = time.perf_counter()
    if policy is not None and policy.speculate():
        steps = policy.steps(most, remaining)
        stats.weight_reads += steps + first_commit
        stats.spec_steps += steps
        for tok in driver.run_speculative(steps, remaining, first_commit):
            stats.spec_tokens += 1
            policy.push(tok)
            yield tok
        kind = SPECULATIVE
    else:
        steps = min(most, remaining)
        stats.weight_reads += steps
        for tok in driver.run(steps, first_commit):
            if policy is not None:
                policy.push(tok)
            yield tok
        kind = PLAIN
    if not first_commit:
        cost.record(kind, steps, time.perf_counter() - t0)
