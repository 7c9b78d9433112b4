"""Token ids <-> text: encode a prompt, decode ids, and decode a stream of ids as they land.

Decoding drops special tokens (`skip_special_tokens=True`): control tokens such as <|im_end|> or
<|eot_id|> are not text, and a stop id never reaches the reader anyway. `decode` and
`StreamDecoder` follow that one policy, so a stream always adds up to `decode` of its ids.
"""

from __future__ import annotations

import json
import re

from arcpy.checks import is_int, quoted
from arcpy.errors import InvalidArgumentError
from arcpy.text.spec import TextSpec
from arcpy.text.specials import encode_as_text

_FFFD = "\ufffd"  # what the decoders put where bytes do not yet form a character
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>\Z")


def _token(spec: TextSpec, token_id, where: str) -> tuple[int, str]:
    """(the id as a Python int, its vocabulary entry); an id the tokenizer does not know is an error."""
    piece = None
    if is_int(token_id) and 0 <= token_id < 2**32:
        token_id = int(token_id)
        piece = spec.tokenizer.id_to_token(token_id)
    if piece is None:
        raise InvalidArgumentError(f"{where}: token id {quoted(token_id)} is not in the vocabulary")
    return token_id, piece


def encode(spec: TextSpec, text: str, add_bos: bool | None = None, parse_special: bool = False) -> list[int]:
    """Token ids of `text`, led by BOS when `add_bos` (default: the model's `add_bos`), unless the
    ids already start with it (a chat template usually writes its own).

    Special-token strings in `text` ('<|im_start|>') are text, encoded as the characters they are
    (arcpy.text.specials): a user's text cannot write the model's control tokens. With
    `parse_special` they are the control tokens, for text the program wrote, such as a chat
    template's output; `chat_ids` encodes messages so, the messages' own text as text."""
    if not isinstance(text, str):
        raise InvalidArgumentError(f"encode: text must be a str, got {type(text).__name__}")
    if not isinstance(parse_special, bool):
        raise InvalidArgumentError(f"encode: parse_special must be True or False, got {quoted(parse_special)}")
    add_bos = bos_wanted(spec, add_bos, "encode")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate: the tokenizer takes only real characters
        raise InvalidArgumentError(f"encode: text is not valid Unicode ({e.reason} at index {e.start})") from None
    # The post-processor is skipped: it may add BOS (handled here, once) or EOS (never in a prompt).
    if parse_special:
        ids = spec.tokenizer.encode(text, add_special_tokens=False).ids
    else:
        ids = encode_as_text(spec.tokenizer, text)
    return led_by_bos(spec, ids, add_bos)


def bos_wanted(spec: TextSpec, add_bos, where: str) -> bool:
    """`add_bos` checked; None is the model's own choice."""
    if add_bos is None:
        return spec.add_bos
    if not isinstance(add_bos, bool):
        raise InvalidArgumentError(f"{where}: add_bos must be True, False or None, got {quoted(add_bos)}")
    if add_bos and spec.bos_id is None:
        raise InvalidArgumentError(f"{where}: add_bos=True, but the model has no BOS token")
    return add_bos


def led_by_bos(spec: TextSpec, ids: list[int], add_bos: bool) -> list[int]:
    if add_bos and (not ids or ids[0] != spec.bos_id):
        ids.insert(0, spec.bos_id)
    return ids


def decode(spec: TextSpec, ids) -> str:
    """The text of `ids`, special tokens left out."""
    try:
        ids = list(ids)
    except TypeError:
        raise InvalidArgumentError(f"decode: ids must be a sequence of ints, got {type(ids).__name__}") from None
    ids = [_token(spec, i, "decode")[0] for i in ids]
    return spec.tokenizer.decode(ids, skip_special_tokens=True)


def token_text(spec: TextSpec, token_id: int) -> str:
    """One token's own text, special tokens included (what a log-probability entry names); a
    token that holds part of a character's bytes decodes to U+FFFD."""
    return spec.tokenizer.decode([_token(spec, token_id, "token_text")[0]], skip_special_tokens=False)


def _decoder_traits(tokenizer) -> tuple[bool, bool]:
    """(decodes byte-token runs, rewrites text across tokens) for the tokenizer's decoder.

    The library's decoders act on each token alone, or on the joined text only at its ends,
    except ByteFallback (a run of byte tokens is one unit) and whatever follows a Fuse that is not
    a Strip or a one-character Replace (it sees the joined text: a pattern may span tokens). A
    decoder that cannot describe itself (a custom one) is taken to do both, the safe side."""
    decoder = tokenizer.decoder
    if decoder is None:
        return False, False
    try:
        tree = json.loads(decoder.__getstate__())
    except Exception:
        return True, True
    chain = _flatten(tree)
    types = [d.get("type") for d in chain]
    after_fuse = chain[types.index("Fuse") + 1:] if "Fuse" in types else []
    return "ByteFallback" in types, not all(map(_stays_in_place, after_fuse))


def _flatten(d: dict) -> list[dict]:
    return [leaf for child in d["decoders"] for leaf in _flatten(child)] if d.get("type") == "Sequence" else [d]


def _stays_in_place(d: dict) -> bool:
    """Whether a decoder that sees the joined text leaves text already decoded as it is."""
    if d.get("type") == "Strip":
        return True
    pattern = d.get("pattern") if d.get("type") == "Replace" else None
    return isinstance(pattern, dict) and isinstance(pattern.get("String"), str) and len(pattern["String"]) == 1


class StreamDecoder:
    """Text of a stream of token ids: `push(id)` returns the text that became final with that id,
    `flush()` the rest at the end of the stream. Together they equal `decode(spec, ids)` exactly.

    Text is final once no later id can change it:
    - a character split over several tokens decodes as U+FFFD until its last byte arrives, so
      a trailing U+FFFD waits;
    - a run of byte tokens (<0xE2>) is decoded as one unit: one bad byte turns the whole run into
      U+FFFD. The run waits for the next token that is not a byte (special tokens, which are
      skipped, do not end a run);
    - a decoder that rewrites text across tokens (see _decoder_traits) makes everything wait for
      `flush`; none of the library's usual chains does.
    Each push decodes only a window: the ids from the start of the previous emission on. The
    window's first token is text already emitted, so a decoder's treatment of a first token
    (dropping a leading space) never touches new text.
    After `flush` the decoder is empty and takes the next stream.
    """

    def __init__(self, spec: TextSpec):
        self._spec = spec
        self._byte_runs, self._rewrites = _decoder_traits(spec.tokenizer)
        self._skipped = {i for i, t in spec.tokenizer.get_added_tokens_decoder().items() if t.special}
        self._reset()

    def _reset(self) -> None:
        self._ids: list[int] = []
        self._start = 0       # first id of the decoded window
        self._read = 0        # ids before this one have had their text emitted
        self._seen = ""       # the window's text already emitted: decode(ids[start:read]) or more
        self._emitted = 0     # characters emitted since the stream began
        self._in_run = False  # the last token the decoder sees is a byte token

    def _decode(self, ids: list[int]) -> str:
        return self._spec.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        token_id, piece = _token(self._spec, token_id, "StreamDecoder.push")
        self._ids.append(token_id)
        if self._byte_runs and token_id not in self._skipped:
            self._in_run = _BYTE_TOKEN.match(piece) is not None
        if self._in_run or self._rewrites:
            return ""
        text = self._decode(self._ids[self._start:])
        final = text.rstrip(_FFFD)
        if len(final) <= len(self._seen):
            return ""
        new = final[len(self._seen):]
        if len(final) == len(text):  # all of it is final: the window moves on
            self._start, self._read = self._read, len(self._ids)
            self._seen = self._decode(self._ids[self._start:self._read])
        else:  # the last token's text is final up to a character still missing bytes
            self._seen = final
        self._emitted += len(new)
        return new

    def flush(self) -> str:
        rest = self._decode(self._ids)[self._emitted:]
        self._reset()
        return rest
