"""Vocabulary: a tokenizer described by lists, as a GGUF file holds it.

The checkpoint reader (arcpy.model) fills it from a file's metadata, checked; the text layer
(arcpy.text) builds a tokenizer from it. Plain data, so that neither layer imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# llama.cpp's token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class Vocabulary:
    """`kind` "gpt2" is byte-level BPE (`tokens` and ranked `merges`, split first as the
    pre-tokenizer named `pre` does); "gemma4" is BPE on UTF-8 (`pre` is "gemma4"); "llama" is
    SentencePiece (`tokens` with `scores` and `types`, <0xNN> byte tokens, U+2581 for a space).
    Ids are checked against len(tokens). `add_bos` None means the file does not say. `source`
    names the file in messages."""

    source: str
    kind: str
    tokens: list[str]
    types: np.ndarray               # int64[len(tokens)], llama.cpp's token types
    scores: np.ndarray | None       # float[len(tokens)], "llama" only
    merges: list[str]               # "left right", "gpt2" and "gemma4" only
    pre: str                        # the pre-tokenizer's name, "gpt2" and "gemma4" only
    bos_id: int | None
    eos_ids: tuple[int, ...]
    unknown_id: int | None
    add_bos: bool | None
    add_space_prefix: bool
    chat_template: str | None
