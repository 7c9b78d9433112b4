"""A request's constraint, resolved and compiled: response_format, or a tool_choice of "required"
or a named function (which becomes the grammar of a call in the model's format,
arcpy.text.tools.call_grammar), compiled against the model's tokens (arcpy.text.grammar).

The tokens' tables are built once per model and vocabulary size (about half a second at 128k
ids) and kept; a grammar compiles in about a millisecond (docs/PERF.md).
"""

from __future__ import annotations

import functools

import numpy as np

from arcpy.errors import InvalidArgumentError
from arcpy.loop.request import Constraint, Frozen, Request
from arcpy.text import TextSpec
from arcpy.text.answer import special_marks
from arcpy.text.grammar import LARK, Grammar, Matcher, TokenTables, allowed, check_grammar, words
from arcpy.text.tools import AUTO, NONE, call_grammar, tool_format


@functools.lru_cache(maxsize=4)
def vocabulary(text: TextSpec, vocab: int) -> TokenTables:
    return TokenTables(text, vocab)


def resolve(text: TextSpec | None, request: Request) -> Constraint | None:
    """What constrains the answer: the response_format, or the call grammar a tool_choice of
    "required" or a function's name asks for; None where nothing does."""
    if request.response_format is not None:
        return request.response_format
    if not request.tools or request.tool_choice in (AUTO, NONE):
        return None
    fmt = tool_format(text.chat_template if text is not None else None)
    marks = {t: i for i, t in special_marks(text).items()}  # the format's tags that are special tokens
    return Constraint(LARK, call_grammar(fmt, request.tools.value, request.tool_choice, marks,
                                         request.parallel_tool_calls))


def compile_constraint(text: TextSpec | None, vocab: int, constraint: Constraint | None) -> Grammar | None:
    """The constraint compiled for a model of `vocab` ids; a bad schema or grammar raises
    InvalidArgumentError with the reason."""
    if constraint is None:
        return None
    if text is None:
        raise InvalidArgumentError("constrained output needs the model's tokenizer, and this engine has none")
    return Grammar.compile(vocabulary(text, vocab), constraint.kind, _source(constraint))


def check_constraint(constraint: Constraint | None) -> None:
    """compile_constraint's checks that need no model, for a front end to make before one loads."""
    if constraint is not None:
        check_grammar(constraint.kind, _source(constraint))


def _source(constraint: Constraint):
    return constraint.source.value if isinstance(constraint.source, Frozen) else constraint.source


def matcher_for(text: TextSpec | None, vocab: int, request: Request) -> Matcher | None:
    grammar = compile_constraint(text, vocab, resolve(text, request))
    return None if grammar is None else grammar.matcher()


class Constrained:
    """One answer's matcher and its mask. In the device loop the driver `advance`s it past each
    token it takes from the ring and writes the next mask (`fill`) for the step waiting on it
    (arcpy.loop.burst). On the host path a step enqueues its forward and the
    logits' copy, `fill`s the mask while they run, waits, draws from `masked(logits)` (the allowed
    ids' logits alone, in id order: the draw's weights of the others would be zero, and the host's
    sampler costs by the ids it is given) and `consume`s the index drawn, which is mapped back to
    its token id."""

    def __init__(self, matcher: Matcher, vocab: int):
        self.matcher, self.vocab = matcher, vocab
        self.mask = np.zeros(words(vocab), np.int32)
        self.ids = np.arange(vocab)

    def fill(self) -> None:
        self.matcher.fill(self.mask)

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """The allowed ids' logits (the caller checks the whole logits first)."""
        valid = np.asarray(logits[:self.vocab], dtype=np.float32)
        self.ids = np.flatnonzero(allowed(self.mask, self.vocab))
        return valid[self.ids]

    def advance(self, token: int) -> None:
        """The matcher moved past `token` (the device loop's, chosen under the last mask)."""
        self.matcher.consume(int(token))

    def consume(self, index: int) -> int:
        """The token at `index` of the last `masked` logits, moved past."""
        token = int(self.ids[index])
        self.advance(token)
        return token

    def rollback(self, n: int) -> None:
        """Step back over the last `n` tokens advanced past (a fallback drops them)."""
        if n:
            self.matcher.rollback(n)
