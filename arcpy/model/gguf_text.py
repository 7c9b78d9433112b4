"""The text half of a GGUF file: its tokenizer, special token ids, BOS rule and chat template.

llama.cpp describes a vocabulary by a tokenizer kind and lists: "gpt2" is byte-level BPE (tokens
and ranked merges, split first by a pre-tokenizer named in tokenizer.ggml.pre), "llama" is
SentencePiece (pieces with scores and types, <0xNN> byte tokens, U+2581 for a space). Both are
rebuilt as `tokenizers` BPE models that encode and decode ordinary text the way llama.cpp does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from arcpy.errors import ModelFileError

from .checks import quoted
from .gguf_file import Metadata

if TYPE_CHECKING:  # arcpy.text reads arcpy.model: importing it at load time would be circular
    from arcpy.text import TextSpec

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 1, 2, 3, 4, 6  # llama.cpp's token types
_SPACE = "\u2581"  # SentencePiece's visible space
# llama.cpp's pre-tokenizer names -> the split they stand for; any other name gets GPT-2's.
_LLAMA3_PRE = ("llama3", "llama-v3", "llama-bpe", "falcon3")
_DIGITS_PRE = ("smollm", "starcoder", "refact", "codeshell", "command-r", "exaone", "minerva-7b")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Byte-level vocabularies that llama.cpp starts with BOS unless the file says otherwise.
_BOS_PRE = _LLAMA3_PRE + ("tekken", "chameleon")
_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def text_spec(meta: Metadata, vocab: int) -> TextSpec:
    """The TextSpec the metadata describes for a model of `vocab` tokens.

    The tokenizer adds no special tokens itself: `add_bos` says whether a prompt starts with bos_id.
    """
    from arcpy.text import TextSpec

    kind = meta.text("tokenizer.ggml.model")
    # llama.cpp renames empty tokens the same way, so that every id has a distinct string.
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(meta.strings("tokenizer.ggml.tokens", vocab))]
    types = meta.numbers("tokenizer.ggml.token_type", vocab, "iu", np.full(vocab, _NORMAL)).astype(np.int64)
    if kind == "gpt2":
        pre = meta.text("tokenizer.ggml.pre", "default")
        tok, add_bos_default = _byte_level_bpe(meta, tokens, pre), pre in _BOS_PRE
    elif kind == "llama":
        tok, add_bos_default = _sentencepiece_bpe(meta, tokens, types), True
    else:
        raise ModelFileError(f"{meta.path}: unsupported tokenizer model {quoted(kind)} (supported: gpt2, llama)")
    _add_special_tokens(tok, tokens, types)

    bos = _token_id(meta, "tokenizer.ggml.bos_token_id", vocab)
    eos = tuple(dict.fromkeys(i for i in (_token_id(meta, k, vocab) for k in _EOS_KEYS) if i is not None))
    add_bos = meta.flag("tokenizer.ggml.add_bos_token", None)
    if add_bos and bos is None:
        raise ModelFileError(f"{meta.path}: add_bos_token is true but there is no bos_token_id")
    if add_bos is None:
        add_bos = add_bos_default and bos is not None
    return TextSpec(tokenizer=tok, bos_id=bos, eos_ids=eos, add_bos=add_bos,
                    chat_template=meta.text("tokenizer.chat_template", None))


def _token_id(meta: Metadata, key: str, vocab: int) -> int | None:
    i = meta.integer(key, None)
    if i is not None and not 0 <= i < vocab:
        raise ModelFileError(f"{meta.path}: metadata {quoted(key)} is {i}, outside the vocabulary of {vocab}")
    return i


def _bpe(meta: Metadata, tokens: list[str], merges: list[tuple[str, str]], **options) -> Tokenizer:
    # A string listed twice keeps its first id: an encoder can produce only one of them.
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    try:
        return Tokenizer(models.BPE(vocab=vocab, merges=merges, **options))
    except Exception as e:  # the tokenizers library raises plain Exception for a bad vocabulary
        raise ModelFileError(f"{meta.path}: the tokenizer cannot be built ({quoted(str(e), 120)})") from None


def _byte_level_bpe(meta: Metadata, tokens: list[str], pre: str) -> Tokenizer:
    """GPT-2 style byte-level BPE: the tokens and ranked merges, split as the pre-tokenizer name says."""
    pairs = []
    for m in meta.strings("tokenizer.ggml.merges"):
        left, sep, right = m.partition(" ")
        if not (sep and left and right):
            raise ModelFileError(f"{meta.path}: merge {quoted(m)} is not two tokens separated by a space")
        pairs.append((left, right))
    llama3 = pre in _LLAMA3_PRE
    tok = _bpe(meta, tokens, pairs, ignore_merges=llama3)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not llama3)
    if llama3:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), "isolated"),
                                                     byte_level])
    elif pre in _DIGITS_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(meta: Metadata, tokens: list[str], types: np.ndarray) -> Tokenizer:
    """A SentencePiece vocabulary (Llama 1/2 style) as BPE: pieces merge in order of their score.

    llama.cpp joins, again and again, the adjacent pair whose concatenation is the highest-scoring
    piece; ranking every (left, right) split of each piece by that piece's score makes a BPE that
    chooses the same way. Characters no piece covers fall back to the <0xNN> byte tokens.
    """
    scores = meta.numbers("tokenizer.ggml.scores", len(tokens), "f")
    normal: dict[str, int] = {}
    for i in np.flatnonzero(types == _NORMAL):
        normal.setdefault(tokens[i], int(i))
    ranked = []
    for piece, i in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                ranked.append((-float(scores[i]), i, normal[left], left, right))
    ranked.sort()
    unk = _token_id(meta, "tokenizer.ggml.unknown_token_id", len(tokens))
    tok = _bpe(meta, tokens, [(a, b) for *_, a, b in ranked], unk_token=None if unk is None else tokens[unk],
               byte_fallback=bool(np.any(types == _BYTE)), fuse_unk=True)
    prefix = meta.flag("tokenizer.ggml.add_space_prefix", True)
    tok.normalizer = normalizers.Sequence(
        ([normalizers.Prepend(_SPACE)] if prefix else []) + [normalizers.Replace(" ", _SPACE)])
    tok.decoder = decoders.Sequence(
        [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def _add_special_tokens(tok: Tokenizer, tokens: list[str], types: np.ndarray) -> None:
    """Control, unknown and user-defined tokens match whole in the text, before any splitting."""
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i in np.flatnonzero((types == _CONTROL) | (types == _UNKNOWN))]
    user = [AddedToken(tokens[i], special=False, normalized=False) for i in np.flatnonzero(types == _USER_DEFINED)]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
