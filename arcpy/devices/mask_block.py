"""The device loop's mask block (libarc/mask.cu): pinned, host-mapped memory the host writes a
grammar's masks into and a masked step reads on the device. The host's plain stores land in
order (the mask's words, then the ready word), and the step reads the ready word with acquire
semantics before the words, so a step that sees its mask ready sees the whole mask."""

from __future__ import annotations

import numpy as np

from arcpy import _lib


class MaskBlock:
    def __init__(self, ffi, lib, loop, vocab: int):
        words, ready = ffi.new("uint32_t **"), ffi.new("uint32_t **")
        _lib.check(lib.arc_loop_mask_block(loop, words, ready))  # allocates it: not while capturing
        self.words = np.frombuffer(ffi.buffer(words[0], 4 * ((vocab + 31) // 32)), dtype=np.uint32)
        self.ready = np.frombuffer(ffi.buffer(ready[0], 4), dtype=np.uint32)

    def write(self, n: int, words) -> None:
        """The mask of the sequence's token n (int32 or uint32 words), then the word that releases
        the step waiting on it."""
        self.words[:] = np.asarray(words).view(np.uint32)
        self.ready[0] = n + 1

    def release(self) -> None:
        """Every step in flight passes: all ids allowed, and a ready word no count reaches."""
        self.words[:] = 0xFFFFFFFF
        self.ready[0] = 0xFFFFFFFF
