"""Prefix reuse: the tokens whose KV rows the engine's last prefills wrote, earlier prefixes kept in
a bounded store in spare device memory, and how many of a new prompt's first positions can keep
(or get back) their rows.

Only rows a prefill wrote are held, never rows of decode steps: a step's GEMV sums in another
order than the prefill's products. The prompt's last token is always prefilled again (its logits
give the first token). Where reuse stops is rounded down to the device's `prefix_granule`, chosen
so that the reused rows are those a cold prefill would write (docs/USAGE.md, Prefix reuse). The store
keeps copies of such rows, bit for bit: before a prefill rewrites rows of the held prefix, they
are copied into it, and a prompt that shares more with a stored prefix than with the held one
gets that prefix's rows copied back first. The least recently used leave it first when it is
full. Every copy is stream-ordered, at a sequence's start: none waits for the GPU.

A model with a recurrent state (a DeltaNet layer's) needs that state at the position a prefill
resumes from, and keeps it only at the end of a prefill: its prefixes are reused whole or not at
all. After each prefill the state at the end of its whole granules is copied into the store's
first `state_bytes` (before any step changes it), and a stored prefix keeps its state after its
rows; a prompt reuses a prefix only where it extends all of it, and gets its state copied back.
Without a store such a model reuses nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arcpy.checks import is_int, quoted
from arcpy.errors import InvalidArgumentError
from arcpy.loop.stats import CacheStats


@dataclass
class Stored:
    tokens: tuple[int, ...]  # whole granules of a prompt whose prefill wrote the rows
    offset: int              # where its rows lie in the device's store, in bytes
    nbytes: int
    used: int                # the clock when last saved or restored (least recently used leave first)


def shared(held, prompt: list[int], granule: int, whole: bool = False) -> int:
    """The positions of `prompt` whose rows `held`'s prefill wrote: the tokens they share, but not
    the prompt's last, rounded down to `granule` (0: none); `whole`: all of held's or none."""
    if not (granule and len(held)):
        return 0
    if whole:
        n = len(held)
        return n if n < len(prompt) and n % granule == 0 and tuple(held) == tuple(prompt[:n]) else 0
    n = min(len(held), len(prompt) - 1)
    differ = np.asarray(held[:n]) != np.asarray(prompt[:n])
    same = int(np.argmax(differ)) if differ.any() else n
    return same // granule * granule


class PrefixCache:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled   # off: every prompt is prefilled whole
        self.held: list[int] = []  # the tokens whose KV rows 0..len-1 the last prefills wrote
        self.stats = CacheStats()
        self.capacity = 0        # bytes of the device's store (0: none)
        self.row_bytes = 0       # bytes one position's rows take (every layer's k and v)
        self.stateful = False    # the device's model keeps a recurrent state: prefixes reused whole
        self.state_bytes = 0     # bytes of that state, the held prefix's at the store's start
        self.stored: list[Stored] = []
        self.restored = False    # the last prepare() copied a stored prefix back
        self._clock = 0

    def reserve(self, device, nbytes: int | None) -> None:
        """A store of `nbytes` on `device` (None: the device's default share of its free memory)."""
        if nbytes is not None and not (is_int(nbytes) and nbytes >= 0):
            raise InvalidArgumentError(f"prompt_cache_bytes must be an integer >= 0 or None, got {quoted(nbytes)}")
        caps = device.capabilities
        row, state = caps.prefix_row_bytes, caps.prefix_state_bytes
        self.stateful = state > 0
        if not (self.enabled and row):
            return
        nbytes = device.default_prefix_store_bytes() if nbytes is None else nbytes
        if nbytes >= max(row, state):
            self.capacity, self.row_bytes = device.reserve_prefix_store(nbytes), row
            self.state_bytes = state

    def _match(self, prompt: list[int], granule: int) -> tuple[int, Stored | None]:
        """The positions of `prompt` whose rows can be kept, and the stored prefix they are copied
        back from (None: the held one's rows, or none)."""
        if not self.enabled or (self.stateful and not self.capacity):
            return 0, None
        whole = self.stateful
        best, entry = shared(self.held, prompt, granule, whole), None
        for e in self.stored:
            m = shared(e.tokens, prompt, granule, whole)
            if m > best:
                best, entry = m, e
        return best, entry

    def restores(self, prompt: list[int], granule: int) -> bool:
        """Whether prepare() would copy a stored prefix back for `prompt` (nothing changes)."""
        return self._match(prompt, granule)[1] is not None

    def prepare(self, prompt: list[int], device, granule: int) -> int:
        """Before a prefill of `prompt` (granule 0: before its rows are written otherwise): the
        positions whose rows it keeps, with a stored prefix's copied back where one shares more.
        The held prefix's rows that are about to be rewritten are stored first."""
        best, entry = self._match(prompt, granule)
        # Rows the prefill rewrites with the same tokens come out the same bits; the others are lost
        # unless stored first (all of them where a stored prefix is copied over them).
        if self.held and (entry is not None or list(self.held) != prompt[:len(self.held)]):
            self._save(device)
        self.restored = entry is not None
        if entry is not None:
            device.load_prefix(entry.offset, best, len(entry.tokens))
            entry.used = self._tick()
        if self.stateful and best:  # the state the prefill resumes from: the held prefix's, or the entry's
            device.load_state(0 if entry is None else entry.offset + best * self.row_bytes, best)
        self.held = []
        return best

    def prefilled(self, prompt: list[int], cached: int, granule: int, device) -> None:
        """A prefill of `prompt` from position `cached` was enqueued (nothing after it yet): its
        whole granules are held."""
        self.rewritten(prompt, granule, device)
        self.stats.count(len(prompt), cached, self.restored)

    def rewritten(self, prompt: list[int], granule: int, device) -> None:
        """A prefill wrote the rows of `prompt` (one no request counts: a prompt's scoring), and
        nothing has run after it."""
        self.held = prompt[:len(prompt) // granule * granule] if granule and self.enabled else []
        if self.stateful:
            if self.held and self.capacity:
                device.save_state(0, len(self.held))  # before a step moves the state on
            else:
                self.held = []

    def forget_held(self) -> None:
        """The held prefix's rows were rewritten by something other than a prefill."""
        self.held = []

    def clear(self) -> None:
        """Forget the held prefix and every stored one (the store's memory stays reserved)."""
        self.held = []
        self.stored = []

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _save(self, device) -> None:
        held = tuple(self.held)
        for e in list(self.stored):
            # Kept already, as it is or longer; a state is kept only at the end of the very tokens.
            if e.tokens[:len(held)] == held and (e.tokens == held or not self.stateful):
                e.used = self._tick()
                return
            if held[:len(e.tokens)] == e.tokens and not self.stateful:  # the held prefix extends it
                self.stored.remove(e)
        rows = len(held) * self.row_bytes
        need = rows + self.state_bytes
        if not rows or need > self.capacity - self.state_bytes:
            return
        offset = self._fit(need)
        device.save_prefix(offset, len(held))
        if self.stateful:
            device.move_stored(offset + rows, 0, self.state_bytes)
        self.stored.append(Stored(held, offset, need, self._tick()))
        self.stats.stored += 1

    def _fit(self, need: int) -> int:
        """The lowest offset with `need` bytes free, the least recently used evicted until one is."""
        while True:
            at = self.state_bytes  # the store's start holds the held prefix's state
            for e in sorted(self.stored, key=lambda e: e.offset):
                if e.offset - at >= need:
                    return at
                at = e.offset + e.nbytes
            if self.capacity - at >= need:
                return at
            self.stored.remove(min(self.stored, key=lambda e: e.used))
            self.stats.evicted += 1
