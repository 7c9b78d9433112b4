"""The drafts of speculative steps, as the device's draft kernel makes them (libarc/model/speculate.cu).

A speculative step at position p (the current token is history[p]) looks for the latest earlier
occurrence of the sequence's last n tokens, n from `ngram` down to 1 (the longest that occurs
wins, then the latest), ending at j, and proposes the k tokens that followed it: history[j + 1..p],
repeated with that period where it is shorter than k (a sequence that loops goes on looping).
`draft` is that definition, written plainly; `NgramIndex` gives the same drafts incrementally, in
constant time a token, for the host's estimate of what speculation would gain (`Acceptance`).
"""

from __future__ import annotations

from typing import Sequence

MAX_DRAFTS = 7   # arc_model_speculate_reserve's limit on k
DEFAULT_DRAFTS = MAX_DRAFTS  # what Engine.load and the commands capture unless told otherwise
MAX_NGRAM = 8    # arc_model_forward_speculate's limit on ngram


def draft(history: Sequence[int], k: int, ngram: int) -> list[int]:
    """The drafts after history[-1]: what the device proposes for this history."""
    p = len(history) - 1
    best = (0, -1)  # (match length, end j)
    for j in range(p):
        n = 0
        while n < ngram and j - n >= 0 and history[j - n] == history[p - n]:
            n += 1
        if n > 0:
            best = max(best, (n, j))
    if best[0] == 0:
        return []
    return _follow(history, best[1], k)


def _follow(history: Sequence[int], j: int, k: int) -> list[int]:
    """The k tokens after a match ending at j: history[j + 1..p] with period p - j."""
    period = len(history) - 1 - j
    return [history[j + 1 + i % period] for i in range(k)]


class NgramIndex:
    """The history with, for each n <= ngram, the latest end of every n-gram before the last
    position: `draft` in constant time."""

    def __init__(self, ngram: int, history: Sequence[int] = ()):
        self.ngram = ngram
        self.history: list[int] = []
        self.ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(ngram + 1)]
        for tok in history:
            self.append(tok)

    def append(self, tok: int) -> None:
        h = self.history
        j = len(h) - 1  # the last position becomes an earlier one
        for n in range(1, min(self.ngram, j + 1) + 1):
            self.ends[n][tuple(h[j - n + 1:j + 1])] = j
        h.append(int(tok))

    def draft(self, k: int) -> list[int]:
        h = self.history
        p = len(h) - 1
        for n in range(min(self.ngram, p + 1), 0, -1):
            j = self.ends[n].get(tuple(h[p - n + 1:]))
            if j is not None:
                return _follow(h, j, k)
        return []


class Acceptance:
    """What speculative steps of k drafts would make of the tokens seen so far: the output is fixed
    (the argmax, or the draw at each position from the request's seed), so a step from position p
    yields 1 + the number of its drafts the following tokens match. Fed every token in order; `tokens_per_step` is a moving average over recent steps
    (`weight` the newest's share), starting from `prior`."""

    def __init__(self, k: int, ngram: int, prompt: Sequence[int], weight: float = 0.25, prior: float = 1.0):
        self.k = k
        self.index = NgramIndex(ngram, prompt)
        self.weight = weight
        self.tokens_per_step = prior
        self.steps = 0
        self._draft = self.index.draft(k)
        self._matched = 0

    def push(self, tok: int) -> None:
        if self._matched < len(self._draft) and self._draft[self._matched] == tok:
            self._matched += 1
            self.index.append(tok)
            return
        # The step ends with this token, the model's own: 1 + the drafts it accepted.
        made = self._matched + 1
        self.steps += 1
        # A running mean while few steps are known (the prior counts as one), then a moving average.
        self.tokens_per_step += max(self.weight, 1.0 / (self.steps + 1)) * (made - self.tokens_per_step)
        self.index.append(tok)
        self._draft = self.index.draft(self.k)
        self._matched = 0
