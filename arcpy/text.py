"""Text around the engine: the tokenizer, streaming detokenization, chat templates, stop strings.

Nothing here is in the per-step path: the engine decodes token ids; this module turns text into
ids before a sequence and ids back into text as they land.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextSpec:
    """What a model's files say about its text: the tokenizer (a `tokenizers.Tokenizer`), the ids
    of its special tokens, whether a prompt starts with BOS, and its chat template (Jinja source)."""

    tokenizer: object
    bos_id: int | None
    eos_ids: tuple[int, ...]
    add_bos: bool
    chat_template: str | None
