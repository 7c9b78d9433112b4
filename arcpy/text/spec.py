"""TextSpec: what a model's files say about its text."""

from __future__ import annotations

from dataclasses import dataclass

from arcpy.checks import quoted
from arcpy.errors import InvalidArgumentError


def _is_id(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


@dataclass(frozen=True)
class TextSpec:
    """What a model's files say about its text: the tokenizer (a `tokenizers.Tokenizer`), the ids
    of its special tokens, whether a prompt starts with BOS, and its chat template (Jinja source).

    `eos_ids` are every id that ends a sequence; the first is the tokenizer's own end-of-sequence
    token, the one chat templates call `eos_token`. `add_bos` needs a `bos_id`.
    """

    tokenizer: object
    bos_id: int | None
    eos_ids: tuple[int, ...]
    add_bos: bool
    chat_template: str | None

    def __post_init__(self):
        if self.bos_id is not None and not _is_id(self.bos_id):
            raise InvalidArgumentError(f"TextSpec: bos_id must be a non-negative int or None, "
                                       f"got {quoted(self.bos_id)}")
        if not isinstance(self.eos_ids, tuple) or not all(_is_id(i) for i in self.eos_ids):
            tup = isinstance(self.eos_ids, tuple)
            shown = quoted(list(self.eos_ids)) if tup else f"a {type(self.eos_ids).__name__}"
            raise InvalidArgumentError(f"TextSpec: eos_ids must be a tuple of non-negative ints, got {shown}")
        if not isinstance(self.add_bos, bool):
            raise InvalidArgumentError(f"TextSpec: add_bos must be True or False, got {quoted(self.add_bos)}")
        if self.add_bos and self.bos_id is None:
            raise InvalidArgumentError("TextSpec: add_bos is True but there is no bos_id")
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise InvalidArgumentError(f"TextSpec: chat_template must be a string or None, "
                                       f"got {type(self.chat_template).__name__}")

    def token_text(self, token_id: int | None) -> str | None:
        """The vocabulary entry of `token_id` (e.g. '<|im_end|>'), or None."""
        return None if token_id is None else self.tokenizer.id_to_token(token_id)
