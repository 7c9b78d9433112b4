"""Special-token strings in a user's text are text.

A tokenizer reads '<|im_start|>' anywhere in its input as the control token, so a user who types it
into a message could open a turn of their own (a system turn the model obeys). A user's text is
therefore encoded with each special-token string in it as the characters it is: the ids the
tokenizer gives that text were the string not a special token. Only a chat template's own markup
becomes control tokens.

How: each place where the tokenizer would read a special token in the user's text is replaced by
a placeholder, a private-use character that neither the texts nor the template hold, and the whole
prompt is encoded by a copy of the tokenizer whose normalizer first turns each placeholder back
into the text it stands for. The tokenizer finds special tokens before it normalizes, so the
template's markup is still read as control tokens and the placeholders are not; once normalized,
the restored text goes through the pre-tokenizer and the model like any other text.
"""

from __future__ import annotations

import threading
import weakref

from tokenizers import AddedToken, normalizers

from arcpy.errors import InvalidArgumentError

_PRIVATE_USE = ((0xE000, 0xF8FF), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD))


class _Specials:
    """What reading special-token strings as text needs of one tokenizer: its special tokens,
    and (made on first need, ~0.1 s for a 49,152-token vocabulary) the copy that restores
    placeholders."""

    def __init__(self, tokenizer):
        added = tokenizer.get_added_tokens_decoder()
        self.special = [t for t in added.values() if t.special]
        self.ids = frozenset(i for i, t in added.items() if t.special)
        self.chars = {c for t in added.values() for c in t.content}
        self._copy = None
        self._lock = threading.Lock()

    def encode_marked(self, tokenizer, text: str, marks: dict[str, str]) -> list[int]:
        with self._lock:
            if self._copy is None:
                self._copy = _restoring_copy(tokenizer, self.special)
            own = tokenizer.normalizer
            restore = [normalizers.Replace(p, s) for p, s in marks.items()]
            self._copy.normalizer = normalizers.Sequence(restore + ([own] if own is not None else []))
            return self._copy.encode(text, add_special_tokens=False).ids


def _restoring_copy(tokenizer, special):
    copy = type(tokenizer).from_str(tokenizer.to_str())
    # A special token matched after normalizing would find the restored text again: match those
    # before normalizing, as the template writes them.
    late = [AddedToken(t.content, special=True, normalized=False, lstrip=t.lstrip, rstrip=t.rstrip,
                       single_word=t.single_word) for t in special if t.normalized]
    if late:
        copy.add_special_tokens(late)
    return copy


_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def _specials(tokenizer) -> _Specials:
    with _cache_lock:
        state = _cache.get(tokenizer)
        if state is None:
            state = _cache[tokenizer] = _Specials(tokenizer)
        return state


class Marks:
    """Placeholders for the special-token strings in a user's texts (`mark` each text), and the
    encoder of the text they end up in (`encode`). `avoid` is every other text the encoded text
    may hold (the template): no placeholder is a character of it."""

    def __init__(self, tokenizer, avoid=()):
        self._tokenizer = tokenizer
        self._specials = _specials(tokenizer)
        self._avoid = set(self._specials.chars).union(*avoid)
        self._free = (chr(c) for lo, hi in _PRIVATE_USE for c in range(lo, hi + 1))
        self.texts: dict[str, str] = {}  # placeholder -> the text it stands for
        self._placeholder: dict[str, str] = {}

    def avoid(self, text: str) -> None:
        self._avoid.update(text)

    def mark(self, text: str, encoding=None) -> str:
        """`text` with each special-token string in it (where the tokenizer would read one)
        replaced by a placeholder. `encoding` is the tokenizer's encoding of `text`, if made."""
        if encoding is None:
            encoding = self._tokenizer.encode(text, add_special_tokens=False)
        spans = [span for i, span in zip(encoding.ids, encoding.offsets) if i in self._specials.ids]
        if not spans:
            return text
        out, at = [], 0
        for start, end in spans:
            out += [text[at:start], self._stand_in(text[start:end])]
            at = end
        out.append(text[at:])
        return "".join(out)

    def _stand_in(self, piece: str) -> str:
        p = self._placeholder.get(piece)
        if p is None:
            p = next((c for c in self._free if c not in self._avoid), None)
            if p is None:
                raise InvalidArgumentError("the messages hold too many different special-token strings")
            self._placeholder[piece], self.texts[p] = p, piece
        return p

    def encode(self, text: str) -> list[int]:
        """The ids of `text`: special-token strings as control tokens, placeholders as the text
        they stand for."""
        if not self.texts:
            return self._tokenizer.encode(text, add_special_tokens=False).ids
        return self._specials.encode_marked(self._tokenizer, text, self.texts)


def encode_as_text(tokenizer, text: str) -> list[int]:
    """The ids of a user's `text`, special-token strings in it encoded as text."""
    encoding = tokenizer.encode(text, add_special_tokens=False)
    if not _specials(tokenizer).ids.intersection(encoding.ids):
        return encoding.ids
    marks = Marks(tokenizer, (text,))
    return marks.encode(marks.mark(text, encoding))
