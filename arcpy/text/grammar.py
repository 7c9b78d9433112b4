"""Constrained output: a grammar over the model's tokens, from a JSON schema, "any JSON object", or
a GBNF or Lark grammar, compiled by llguidance (docs/PERF.md has the comparison with xgrammar that
chose it).

    TokenTables(spec, vocab)                     the model's tokens as llguidance reads them (once a model)
    Grammar.compile(tables, kind, source)        -> a Grammar; a bad schema or grammar is one line
    check_grammar(kind, source)                  the same checks without a model (before one loads)
    grammar.matcher()                            -> a Matcher for one answer
    matcher.fill(bits)                           the allowed next tokens, as a bitmask (int32 words)
    matcher.consume(token)                       move past a token the mask allowed
    allowed(bits, vocab)                         the bitmask as booleans

The mask allows the model's end-of-sequence ids only where the grammar is complete, so an answer
the grammar constrains ends by one of them, and what it ends with parses.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from arcpy.checks import quoted
from arcpy.errors import InvalidArgumentError
from arcpy.text.spec import TextSpec

JSON_SCHEMA, JSON_OBJECT, GBNF, LARK = "json_schema", "json_object", "gbnf", "lark"
KINDS = (JSON_SCHEMA, JSON_OBJECT, GBNF, LARK)
_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>\Z")
_ANY_OBJECT = {"type": "object"}
# Compact JSON, as an answer is parsed (a strict schema allows no other keys: llguidance's option).
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def words(vocab: int) -> int:
    """int32 words in a mask over `vocab` ids."""
    return (vocab + 31) // 32


def allowed(bits: np.ndarray, vocab: int) -> np.ndarray:
    """A mask's bits as booleans over ids 0..vocab-1."""
    return np.unpackbits(np.ascontiguousarray(bits, dtype="<i4").view(np.uint8), bitorder="little")[:vocab] == 1


def token_bytes(spec: TextSpec, vocab: int) -> list[bytes]:
    """The bytes each id stands for, as the decoder writes them: byte-level BPE through GPT-2's
    byte table, SentencePiece pieces with U+2581 as a space and <0xNN> as that byte; special
    tokens and ids past the tokenizer's own (a padded vocabulary) as nothing (llguidance treats
    special ids apart)."""
    tok = spec.tokenizer
    kinds = _decoder_kinds(tok)
    table = {c: b for b, c in _gpt2_bytes().items()} if "ByteLevel" in kinds else None
    added = tok.get_added_tokens_decoder()
    out = []
    for i in range(vocab):
        piece = tok.id_to_token(i)
        if piece is None or (i in added and added[i].special):
            out.append(b"")
        elif i in added:
            out.append(added[i].content.encode())
        elif table is not None:
            out.append(bytes(table[c] for c in piece) if all(c in table for c in piece) else piece.encode())
        elif (m := _BYTE.match(piece)) and "ByteFallback" in kinds:
            out.append(bytes([int(m.group(1), 16)]))
        else:
            out.append(piece.replace("\u2581", " ").encode())
    return out


def _decoder_kinds(tok) -> set[str]:
    try:
        tree = json.loads(tok.decoder.__getstate__()) if tok.decoder is not None else {}
    except Exception:
        return set()
    stack, kinds = [tree], set()
    while stack:
        d = stack.pop()
        kinds.add(d.get("type"))
        stack.extend(d.get("decoders") or ())
    return kinds


def _gpt2_bytes() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


class TokenTables:
    """The model's tokens as llguidance reads them: built once per model (0.5 to 1.3 s at 128k ids)."""

    def __init__(self, spec: TextSpec, vocab: int):
        import llguidance

        self.spec, self.vocab = spec, vocab
        pieces = token_bytes(spec, vocab)
        special = [i for i, b in enumerate(pieces) if not b]
        eos = list(spec.eos_ids) or [special[0] if special else 0]

        class _Wrapper:  # what llguidance.TokenizerWrapper reads
            is_tokenizer_wrapper = True
            eos_token_id, bos_token_id, tokens, special_token_ids = eos[0], spec.bos_id, pieces, special

            def __call__(self, s: str) -> list[int]:
                return spec.tokenizer.encode(s, add_special_tokens=False).ids

        self.lltok = llguidance.LLTokenizer(_Wrapper(), n_vocab=vocab, eos_token=eos)


@dataclass(frozen=True)
class Grammar:
    """A compiled grammar: what llguidance takes, checked."""

    kind: str
    text: str               # llguidance's grammar (JSON)
    vocabulary: TokenTables

    @classmethod
    def compile(cls, vocabulary: TokenTables, kind: str, source=None) -> "Grammar":
        """`source`: a JSON schema (a dict, for JSON_SCHEMA), None (JSON_OBJECT), or grammar text
        (GBNF, LARK). An invalid one raises InvalidArgumentError with llguidance's reason."""
        kind, text = _grammar(kind, source)
        _validate(kind, text, vocabulary.lltok)
        return cls(kind, text, vocabulary)

    def matcher(self) -> "Matcher":
        return Matcher(self)


def check_grammar(kind: str, source=None) -> None:
    """Grammar.compile's checks of `source` that need no model: a bad schema or grammar raises
    InvalidArgumentError with the reason before any model is loaded."""
    _validate(*_grammar(kind, source), None)


def _grammar(kind: str, source) -> tuple[str, str]:
    """(kind, llguidance's grammar text) of `source` (Grammar.compile's)."""
    import llguidance

    if kind == JSON_OBJECT:
        kind, source = JSON_SCHEMA, _ANY_OBJECT
    if kind == JSON_SCHEMA:
        if not isinstance(source, dict):
            raise InvalidArgumentError(f"a JSON schema must be an object, got {quoted(source)}")
        try:
            return kind, llguidance.LLMatcher.grammar_from_json_schema(source, overrides=_JSON_OPTIONS)
        except (ValueError, TypeError) as exc:
            raise InvalidArgumentError(f"the JSON schema is not valid: {exc}") from None
    if kind == GBNF:
        if not isinstance(source, str) or not source.strip():
            raise InvalidArgumentError("a GBNF grammar must be a non-empty string")
        from llguidance.gbnf_to_lark import gbnf_to_lark
        try:
            return kind, llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(source))
        except Exception as exc:  # the converter raises what its parser meets
            raise InvalidArgumentError(f"the GBNF grammar is not valid: {exc}") from None
    if kind == LARK:
        if not isinstance(source, str) or not source.strip():
            raise InvalidArgumentError("a Lark grammar must be a non-empty string")
        return kind, llguidance.LLMatcher.grammar_from_lark(source)
    raise InvalidArgumentError(f"unknown grammar kind {quoted(kind)} (known: {', '.join(KINDS)})")


def _validate(kind: str, text: str, lltok) -> None:
    """llguidance's check of a grammar's text, against the model's tokens (`lltok`) or none."""
    import llguidance

    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, lltok)
    if failed:
        what = "JSON schema" if kind == JSON_SCHEMA else f"{kind.upper() if kind == GBNF else 'Lark'} grammar"
        raise InvalidArgumentError(f"the {what} is not valid: {messages[0].strip()[:500]}")


class Matcher:
    """Where one answer stands in its grammar."""

    def __init__(self, grammar: Grammar):
        import llguidance

        self.vocab = grammar.vocabulary.vocab
        self._m = llguidance.LLMatcher(grammar.vocabulary.lltok, grammar.text, log_level=0)
        self._check()

    def _check(self) -> None:
        if self._m.is_error():
            raise InvalidArgumentError(f"the grammar failed: {self._m.get_error()}")

    def fill(self, bits: np.ndarray) -> None:
        """Write the allowed next tokens into `bits` (words(vocab) int32 words, C-contiguous)."""
        if bits.dtype != np.int32 or not bits.flags["C_CONTIGUOUS"] or bits.size != words(self.vocab):
            raise InvalidArgumentError(f"a mask takes {words(self.vocab)} contiguous int32 words")
        self._m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        self._check()

    def consume(self, token: int) -> None:
        """Move past `token`; a token the mask did not allow is an error."""
        if not self._m.consume_token(int(token)):
            raise InvalidArgumentError(f"token {token} is not allowed by the grammar here: {self._m.get_error()}")

    def rollback(self, n: int) -> None:
        """Step back over the last `n` tokens consumed."""
        if not self._m.rollback(int(n)):
            raise InvalidArgumentError(f"the grammar cannot step back {n} tokens: {self._m.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar allows nothing more but an end-of-sequence id."""
        return self._m.is_stopped()

    @property
    def complete(self) -> bool:
        """What was consumed so far is a whole answer of the grammar."""
        return self._m.is_accepting()
