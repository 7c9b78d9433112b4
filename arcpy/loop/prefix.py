"""Prefix reuse: the tokens whose KV rows the engine's last prefills wrote, and how many of a new
prompt's first positions can keep them.

Only rows a prefill wrote are held, never rows of decode steps: a step's GEMV sums in another
order than the prefill's products. The prompt's last token is always prefilled again (its logits
give the first token). Where reuse stops is rounded down to the device's `prefix_granule`, chosen
so that the reused rows are those a cold prefill would write (README, section Use).
"""

from __future__ import annotations

import numpy as np

from arcpy.loop.stats import CacheStats


class PrefixCache:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled   # off: every prompt is prefilled whole
        self.held: list[int] = []  # the tokens whose KV rows 0..len-1 the last prefills wrote
        self.stats = CacheStats()

    def reusable(self, prompt: list[int], granule: int) -> int:
        """How many of the prompt's first positions keep their rows: the tokens it shares with
        `held`, but not its last, rounded down to `granule` (0: none)."""
        if not (self.enabled and granule and self.held):
            return 0
        n = min(len(self.held), len(prompt) - 1)
        differ = np.asarray(self.held[:n]) != np.asarray(prompt[:n])
        shared = int(np.argmax(differ)) if differ.any() else n
        return shared // granule * granule

    def prefilled(self, prompt: list[int], cached: int, granule: int) -> None:
        """A prefill of `prompt` from position `cached` was enqueued: its whole granules are held."""
        self.held = prompt[:len(prompt) // granule * granule] if granule and self.enabled else []
        self.stats.count(len(prompt), cached)

    def clear(self) -> None:
        self.held = []
