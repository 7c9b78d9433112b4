"""The GPU's store of earlier prefixes (arcpy/loop/prefix.py): KV rows copied to and from one
device allocation, stream-ordered, one copy per (layer, k or v, kv head), and the DeltaNet layers'
states at a prefix's end, one copy per layer (arc_model_state's slots)."""

from __future__ import annotations

from arcpy import _lib
from arcpy.errors import InvalidArgumentError

PROMPT_CACHE_SHARE = 0.1  # of the memory free after start-up, for earlier prompts' KV rows by default


class KVStore:
    """CudaDevice's store: it reads the device's `ctx`, `ffi`, `lib`, `forward` (its `kv_planes`,
    `kv_runs`, `max_seq` and `state`), `prefix_row_bytes` and `_store`."""

    def default_prefix_store_bytes(self) -> int:
        """A share of the memory free after start-up, in whole positions."""
        free, _ = self.ctx.memory()
        return int(free * PROMPT_CACHE_SHARE) // self.prefix_row_bytes * self.prefix_row_bytes

    def reserve_prefix_store(self, nbytes: int) -> int:
        """Allocate the store (once, at start-up: an allocation may wait for the GPU)."""
        if self._store is not None:
            self.ctx.device_free(self._store)
            self._store = None
        self._store = self.ctx.device_alloc(nbytes)
        return nbytes

    def save_prefix(self, offset: int, n: int) -> None:
        """Copy the KV rows of positions 0..n-1 into the store at byte `offset` (stream-ordered)."""
        self._prefix_copies(offset, n, into_store=True)

    def load_prefix(self, offset: int, n: int, saved: int) -> None:
        """Copy the first n of the `saved` positions' rows saved at `offset` back into positions
        0..n-1 (stream-ordered)."""
        self._prefix_copies(offset, n, into_store=False, saved=saved)

    def _prefix_copies(self, offset: int, n: int, into_store: bool, saved: int | None = None) -> None:
        # Each (plane, layer, head) of the cache's form (arc_model_kv_planes: a bf16 cache's k and v
        # values, a q8_0 cache's codes and scales; a head's rows as wide as its head) holds its
        # positions' rows contiguously: one copy each, to a run of the saved positions' rows in the
        # store.
        saved = n if saved is None else saved
        if not (self._store is not None and 0 < n <= saved <= self.forward.max_seq):
            raise InvalidArgumentError(f"the prefix store holds no room for {n} of {saved} positions")
        store = self.ffi.cast("char *", self._store) + offset
        self._idle = False
        for base, row, rows in self.forward.kv_planes:
            there = self.ffi.cast("char *", base)
            for hd in self.forward.kv_runs:  # a (layer, kv head)'s rows, as wide as its head
                width = row * hd // self.forward.kv_head_dim
                src, dst = (there, store) if into_store else (store, there)
                _lib.check(self.lib.arc_enqueue_copy_on_device(self.ctx.ptr, dst, src, n * width))
                there, store = there + rows * width, store + saved * width

    def save_state(self, offset: int, position: int) -> None:
        """Copy the states after positions 0..position-1 (the last prefill's end, before any step
        moves them on) into the store at byte `offset` (stream-ordered)."""
        self._state_copies(offset, position, into_store=True)

    def load_state(self, offset: int, position: int) -> None:
        """Copy the states saved at `offset` back, where a prefill from `position` reads them."""
        self._state_copies(offset, position, into_store=False)

    def move_stored(self, to: int, source: int, nbytes: int) -> None:
        """Copy `nbytes` of the store from byte `source` to byte `to` (stream-ordered)."""
        store = self.ffi.cast("char *", self._store)
        self._idle = False
        _lib.check(self.lib.arc_enqueue_copy_on_device(self.ctx.ptr, store + to, store + source, nbytes))

    def _state_copies(self, offset: int, position: int, into_store: bool) -> None:
        # Layer i's state after `position` tokens lies in its slot position % slots.
        base, layers, slots, floats = self.forward.state
        if not (self._store is not None and layers and 0 < position <= self.forward.max_seq):
            raise InvalidArgumentError(f"the prefix store holds no state for position {position}")
        state, store, size = self.ffi.cast("char *", base), self.ffi.cast("char *", self._store) + offset, floats * 4
        self._idle = False
        for i in range(layers):
            there, here = state + (i * slots + position % slots) * size, store + i * size
            src, dst = (there, here) if into_store else (here, there)
            _lib.check(self.lib.arc_enqueue_copy_on_device(self.ctx.ptr, dst, src, size))
