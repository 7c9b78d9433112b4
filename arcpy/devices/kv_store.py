"""The GPU's store of earlier prefixes (arcpy/loop/prefix.py): KV rows copied to and from one
device allocation, stream-ordered, one copy per (layer, k or v, kv head)."""

from __future__ import annotations

from arcpy import _lib
from arcpy.errors import InvalidArgumentError

PROMPT_CACHE_SHARE = 0.1  # of the memory free after start-up, for earlier prompts' KV rows by default


class KVStore:
    """CudaDevice's store: it reads the device's `ctx`, `ffi`, `lib`, `forward` (its `kv_shape`
    and `ptr`), `prefix_row_bytes` and `_store`."""

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
        # Each (layer, k or v, head) holds its positions' rows contiguously: one copy each, to a
        # run of the saved positions' rows in the store.
        blocks, heads, max_seq, hd = self.forward.kv_shape
        saved = n if saved is None else saved
        if not (self._store is not None and 0 < n <= saved <= max_seq):
            raise InvalidArgumentError(f"the prefix store holds no room for {n} of {saved} positions")
        k, v = self.ffi.new("uint16_t **"), self.ffi.new("uint16_t **")
        _lib.check(self.lib.arc_model_kv_cache(self.forward.ptr, k, v))
        cache, store, run = self.ffi.cast("char *", k[0]), self.ffi.cast("char *", self._store) + offset, n * hd * 2
        self._idle = False
        for i in range(blocks * heads):
            there, here = cache + i * max_seq * hd * 2, store + i * saved * hd * 2
            src, dst = (there, here) if into_store else (here, there)
            _lib.check(self.lib.arc_enqueue_copy_on_device(self.ctx.ptr, dst, src, run))
