"""The drafts of speculative steps, as the device's draft kernel makes them (libarc/model/forward/speculate.cu).

A speculative step at position p (the current token is history[p]) looks for the latest earlier
occurrence of the sequence's last n tokens, n from `ngram` down to 1 (the longest that occurs
wins, then the latest), ending at j, and proposes the k tokens that followed it: history[j + 1..p],
repeated with that period where it is shorter than k (a sequence that loops goes on looping).
The search also covers a memory of earlier sequences (`DraftMemory`), laid out as the device holds
it: each remembered sequence followed by a negative id, the whole placed right before position 0.
So an equally long match in the sequence itself is later and wins; a match never spans a
separator, and drafts from the memory stop at the remembered sequence's end. A question asked again
drafts its earlier answer.
`draft` is that definition, written plainly; `NgramIndex` gives the same drafts incrementally, in
constant time a token, for the host's estimate of what speculation would gain (`Acceptance`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from arcpy.codes import DRAFT_MEMORY

MAX_DRAFTS = 7   # arc_model_speculate_reserve's limit on k
DEFAULT_DRAFTS = MAX_DRAFTS  # what open_device and the commands capture unless told otherwise
MAX_NGRAM = 8    # arc_model_forward_speculate's limit on ngram
SEPARATOR = -1   # ends each sequence in the memory's layout


def draft(history: Sequence[int], k: int, ngram: int, memory: Sequence[int] = ()) -> list[int]:
    """The drafts after history[-1]: what the device proposes for this history and this memory
    (DraftMemory.layout())."""
    h = [*memory, *history]
    p = len(h) - 1
    best = (0, -1)  # (match length, end j)
    for j in range(p):
        n = 0
        while n < ngram and j - n >= 0 and h[j - n] >= 0 and h[j - n] == h[p - n]:
            n += 1
        if n > 0:
            best = max(best, (n, j))
    if best[0] == 0:
        return []
    return _follow(h, best[1], k)


def _follow(h: Sequence[int], j: int, k: int) -> list[int]:
    """The k tokens after a match ending at j: h[j + 1..p] with period p - j, up to a separator."""
    period = len(h) - 1 - j
    out = []
    for i in range(k):
        tok = h[j + 1 + i % period]
        if tok < 0:
            break
        out.append(tok)
    return out


class NgramIndex:
    """The memory and the history with, for each n <= ngram, the latest end of every n-gram before
    the last position (none spanning a separator): `draft` in constant time."""

    def __init__(self, ngram: int, history: Sequence[int] = (), memory: Sequence[int] = ()):
        self.ngram = ngram
        self.history: list[int] = []  # the memory's layout, then the history
        self.ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(ngram + 1)]
        for tok in (*memory, *history):
            self.append(tok)

    def append(self, tok: int) -> None:
        h = self.history
        j = len(h) - 1  # the last position becomes an earlier one
        for n in range(1, min(self.ngram, j + 1) + 1):
            if h[j - n + 1] < 0:
                break
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


class DraftMemory:
    """Earlier sequences for the drafts to look up (arc_loop_begin_sequence's ARC_SEQ_DRAFT_MEMORY
    part): each the last `context` tokens of its prompt (what a question asked again ends with) and
    its answer. Bounded by the device's store: the oldest go first; a sequence remembered again
    moves to the newest."""

    def __init__(self, capacity: int = DRAFT_MEMORY, context: int = MAX_NGRAM):
        self.capacity, self.context = capacity, context
        self.sequences: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self.size = 0  # ids in the layout, separators included
        self._layout: list[int] | None = []

    def remember(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        if not answer:
            return
        seq = (*prompt[len(prompt) - self.context:], *answer)[-(self.capacity - 1):]
        self._layout = None
        if seq in self.sequences:
            self.sequences.move_to_end(seq)
            return
        self.sequences[seq] = None
        self.size += len(seq) + 1
        while self.size > self.capacity:
            old, _ = self.sequences.popitem(last=False)
            self.size -= len(old) + 1

    def layout(self) -> list[int]:
        """The memory as the device holds it: every sequence, oldest first, followed by SEPARATOR."""
        if self._layout is None:
            self._layout = [tok for seq in self.sequences for tok in (*seq, SEPARATOR)]
        return self._layout


class Acceptance:
    """What speculative steps of k drafts would make of the tokens seen so far: the output is fixed
    (the argmax, or the draw at each position from the request's seed), so a step from position p
    yields 1 + the number of its drafts the following tokens match. Fed every token in order; `tokens_per_step` is a moving average over recent steps
    (`weight` the newest's share), starting from `prior`."""

    def __init__(self, k: int, ngram: int, prompt: Sequence[int], weight: float = 0.25, prior: float = 1.0,
                 memory: Sequence[int] = ()):
        self.k = k
        self.index = NgramIndex(ngram, prompt, memory)
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
