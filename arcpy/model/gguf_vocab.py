"""The vocabulary of a GGUF file: its tokenizer metadata, checked, as a plain Vocabulary.

    tokenizer.ggml.model          "gpt2" (byte-level BPE), "gemma4" (BPE on UTF-8) or "llama" (SentencePiece)
    tokenizer.ggml.tokens         one string per id; token_type and scores beside them
    tokenizer.ggml.merges         "left right", ranked (gpt2, gemma4)
    tokenizer.ggml.pre            the pre-tokenizer's name (gpt2; gemma4 is always "gemma4", as llama.cpp reads it)
    tokenizer.ggml.*_token_id     bos, eos, eot, eom, unknown
    tokenizer.ggml.add_bos_token, add_space_prefix, tokenizer.chat_template

arcpy.text builds the tokenizer from it; nothing here imports the text layer.
"""

from __future__ import annotations

import numpy as np

from arcpy.checks import quoted
from arcpy.errors import ModelFileError
from arcpy.model.gguf_file import Metadata
from arcpy.vocabulary import NORMAL, Vocabulary

_KINDS = ("gpt2", "gemma4", "llama")
_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def read_vocabulary(meta: Metadata, vocab: int) -> Vocabulary:
    """The Vocabulary the metadata describes for a model of `vocab` tokens."""
    kind = meta.text("tokenizer.ggml.model")
    if kind not in _KINDS:
        raise ModelFileError(f"{meta.path}: unsupported tokenizer model {quoted(kind)} "
                             f"(supported: {', '.join(_KINDS)})")
    # llama.cpp renames empty tokens the same way, so that every id has a distinct string.
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(meta.strings("tokenizer.ggml.tokens", vocab))]
    types = meta.numbers("tokenizer.ggml.token_type", vocab, "iu", np.full(vocab, NORMAL)).astype(np.int64)
    scores = meta.numbers("tokenizer.ggml.scores", vocab, "f") if kind == "llama" else None
    merges = meta.strings("tokenizer.ggml.merges") if kind != "llama" else []
    bos = _token_id(meta, "tokenizer.ggml.bos_token_id", vocab)
    eos = tuple(dict.fromkeys(i for i in (_token_id(meta, k, vocab) for k in _EOS_KEYS) if i is not None))
    add_bos = meta.flag("tokenizer.ggml.add_bos_token", None)
    if add_bos and bos is None:
        raise ModelFileError(f"{meta.path}: add_bos_token is true but there is no bos_token_id")
    return Vocabulary(
        source=str(meta.path), kind=kind, tokens=tokens, types=types, scores=scores, merges=merges,
        pre="gemma4" if kind == "gemma4" else meta.text("tokenizer.ggml.pre", "default"), bos_id=bos, eos_ids=eos,
        unknown_id=_token_id(meta, "tokenizer.ggml.unknown_token_id", vocab), add_bos=add_bos,
        add_space_prefix=meta.flag("tokenizer.ggml.add_space_prefix", True),
        chat_template=meta.text("tokenizer.chat_template", None))


def _token_id(meta: Metadata, key: str, vocab: int) -> int | None:
    i = meta.integer(key, None)
    if i is not None and not 0 <= i < vocab:
        raise ModelFileError(f"{meta.path}: metadata {quoted(key)} is {i}, outside the vocabulary of {vocab}")
    return i
