"""A tokenizer from a GGUF file's Vocabulary (arcpy.vocabulary): the TextSpec of the file.

llama.cpp describes a vocabulary by a tokenizer kind and lists: "gpt2" is byte-level BPE (tokens
and ranked merges, split first by the pre-tokenizer named in tokenizer.ggml.pre: see
arcpy.text.pretokenize), "gemma4" is BPE on raw UTF-8 (spaces as U+2581, <0xNN> byte tokens),
"llama" is SentencePiece (pieces with scores and types, <0xNN> byte tokens, U+2581 for a space).
All are rebuilt as `tokenizers` BPE models that encode and decode ordinary text the way llama.cpp
does.
"""

from __future__ import annotations

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

from arcpy.checks import quoted
from arcpy.errors import ModelFileError
from arcpy.text.turns import turn_end_ids
from arcpy.text.limits import check_template_size
from arcpy.text.pretokenize import PreTokenizer, pre_tokenizer_named
from arcpy.text.spec import TextSpec
from arcpy.vocabulary import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, Vocabulary

_SPACE = "\u2581"  # SentencePiece's visible space
_MAX_MERGE_CHARS = 64 * 1024 * 1024  # what a SentencePiece vocabulary's merges may name, in characters


def gguf_text_spec(v: Vocabulary) -> TextSpec:
    """The TextSpec of a GGUF file's vocabulary.

    The tokenizer adds no special tokens itself: `add_bos` says whether a prompt starts with bos_id.
    """
    if v.chat_template is not None:
        check_template_size(v.chat_template, f"{v.source}: key 'tokenizer.chat_template'")
    if v.kind in ("gpt2", "gemma4"):
        pre = pre_tokenizer_named(v.source, v.pre)
        tok, add_bos_default = _bpe_split_first(v, pre), pre.add_bos
    elif v.kind == "llama":
        pre, tok, add_bos_default = None, _sentencepiece_bpe(v), True
    else:
        raise ModelFileError(f"{v.source}: unsupported tokenizer model {quoted(v.kind)} "
                             "(supported: gpt2, gemma4, llama)")
    _add_special_tokens(tok, v.tokens, v.types)
    add_bos = v.add_bos
    if add_bos is None or (pre is not None and pre.bos_always):
        add_bos = add_bos_default and v.bos_id is not None
    eos_ids = tuple(dict.fromkeys(v.eos_ids + turn_end_ids(tok)))  # a family's turn ends (arcpy.text.turns)
    return TextSpec(tokenizer=tok, bos_id=v.bos_id, eos_ids=eos_ids, add_bos=add_bos,
                    chat_template=v.chat_template)


def _bpe(v: Vocabulary, merges: list[tuple[str, str]], **options) -> Tokenizer:
    # A string listed twice keeps its first id: an encoder can produce only one of them.
    vocab: dict[str, int] = {}
    for i, t in enumerate(v.tokens):
        vocab.setdefault(t, i)
    try:
        return Tokenizer(models.BPE(vocab=vocab, merges=merges, **options))
    except Exception as e:  # the tokenizers library raises plain Exception for a bad vocabulary
        raise ModelFileError(f"{v.source}: the tokenizer cannot be built ({quoted(str(e), 120)})") from None


def _merge_pairs(v: Vocabulary) -> list[tuple[str, str]]:
    """The merges as (left, right): llama.cpp cuts each at its first space after the first character."""
    pairs = []
    for m in v.merges:
        cut = m.find(" ", 1)
        if cut < 0 or cut == len(m) - 1:
            raise ModelFileError(f"{v.source}: merge {quoted(m)} is not two tokens separated by a space")
        pairs.append((m[:cut], m[cut + 1:]))
    return pairs


def _bpe_split_first(v: Vocabulary, pre: PreTokenizer) -> Tokenizer:
    """BPE on the words the pre-tokenizer cuts: GPT-2's bytes-as-characters, or (Gemma 4) raw
    UTF-8 with spaces as U+2581 and <0xNN> tokens for bytes no token covers."""
    if pre.byte_level:
        tok = _bpe(v, _merge_pairs(v), ignore_merges=pre.ignore_merges)
        tok.decoder = decoders.ByteLevel()
    else:
        tok = _bpe(v, _merge_pairs(v), ignore_merges=pre.ignore_merges, byte_fallback=bool(np.any(v.types == BYTE)))
        tok.normalizer = normalizers.Replace(" ", _SPACE)
        tok.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.pre_tokenizer = pre.pre_tokenizer()
    return tok


def _sentencepiece_bpe(v: Vocabulary) -> Tokenizer:
    """A SentencePiece vocabulary (Llama 1/2 style) as BPE: pieces merge in order of their score.

    llama.cpp joins, again and again, the adjacent pair whose concatenation is the highest-scoring
    piece; ranking every (left, right) split of each piece by that piece's score makes a BPE that
    chooses the same way. Characters no piece covers fall back to the <0xNN> byte tokens.
    """
    tokens, types, scores = v.tokens, v.types, v.scores
    normal: dict[str, int] = {}
    for i in np.flatnonzero(types == NORMAL):
        normal.setdefault(tokens[i], int(i))
    ranked = [(-float(scores[i]), i, normal[left], left, right) for left, right, i in _splits(v.source, normal)]
    ranked.sort()
    unk = v.unknown_id
    tok = _bpe(v, [(a, b) for *_, a, b in ranked], unk_token=None if unk is None else tokens[unk],
               byte_fallback=bool(np.any(types == BYTE)), fuse_unk=True)
    prefix = v.add_space_prefix
    tok.normalizer = normalizers.Sequence(
        ([normalizers.Prepend(_SPACE)] if prefix else []) + [normalizers.Replace(" ", _SPACE)])
    tok.decoder = decoders.Sequence(
        [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def _splits(source: str, pieces: dict[str, int]):
    """(left, right, id) for every way to cut a piece into two pieces.

    A piece's cuts are where a piece that starts it meets a piece that ends it. The pieces that
    start a piece form a chain (each the longest piece that starts the next), and so do those
    that end it, so walking both chains finds every cut in time linear in the piece's length:
    no piece is cut at every character and looked up (quadratic in its length). The merges name
    their pieces, and the tokenizers library copies each name: past _MAX_MERGE_CHARS characters,
    far beyond any real vocabulary, the file is refused.
    """
    pieces = {p: i for p, i in pieces.items() if p}
    starts = _longest_start(pieces)
    backwards = {p[::-1]: p for p in pieces}
    ends = {backwards[r]: None if e is None else backwards[e] for r, e in _longest_start(backwards).items()}
    named = 0
    for piece, i in pieces.items():
        left, right = starts[piece], ends[piece]
        if left is None or right is None:
            continue
        rights = {}
        while right is not None:
            rights[len(right)] = right
            right = ends[right]
        while left is not None:
            right = rights.get(len(piece) - len(left))
            if right is not None:
                named += len(piece)
                if named > _MAX_MERGE_CHARS:
                    raise ModelFileError(f"{source}: the vocabulary's pieces split into more than "
                                         f"{_MAX_MERGE_CHARS:,} characters of merges; no real vocabulary does")
                yield left, right, i
            left = starts[left]


def _longest_start(pieces) -> dict[str, str | None]:
    """Each piece -> the longest other piece it starts with (None if none). In sorted order, the
    pieces a piece starts with come before it, and everything between them and it starts with them
    too, so a stack of the pieces that start the current one holds the answer on top."""
    out, stack = {}, []
    for p in sorted(pieces):
        while stack and not p.startswith(stack[-1]):
            stack.pop()
        out[p] = stack[-1] if stack else None
        stack.append(p)
    return out


def _add_special_tokens(tok: Tokenizer, tokens: list[str], types: np.ndarray) -> None:
    """Control, unknown and user-defined tokens match whole in the text, before any splitting."""
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i in np.flatnonzero((types == CONTROL) | (types == UNKNOWN))]
    user = [AddedToken(tokens[i], special=False, normalized=False) for i in np.flatnonzero(types == USER_DEFINED)]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
