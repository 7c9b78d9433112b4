"""A request's token ids and stop ids, through the model's text (arcpy.text) where it has some."""

from __future__ import annotations

from dataclasses import dataclass

from arcpy.errors import InvalidArgumentError
from arcpy.loop.request import Request
from arcpy.sampling import TokenLogprob
from arcpy.text import TextSpec, chat_ids, encode


@dataclass(frozen=True)
class Piece:
    """One step of an answer: the token handed out (None for text held back to the end) and the
    text that became final with it (empty while a character or a possible stop string is open,
    or for a model without a tokenizer), and the token's log-probabilities where the request asked
    for them (Request.logprobs)."""

    token: int | None
    text: str
    logprob: TokenLogprob | None = None


def request_ids(text: TextSpec | None, request: Request) -> list[int]:
    """The prompt's token ids: as given, or encoded (a text prompt), or rendered through the
    chat template with the request's template keyword arguments, and encoded (messages)."""
    if request.prompt_ids is not None:
        return list(request.prompt_ids)
    if text is None:
        what = "a text prompt" if request.prompt is not None else "messages"
        raise InvalidArgumentError(f"{what} need the model's tokenizer, and this engine has none: give prompt_ids")
    if request.prompt is not None:
        ids = encode(text, request.prompt)  # special-token strings in it stay text
    else:  # only the template's own markup becomes special tokens
        ids = chat_ids(text, [m.as_dict() for m in request.messages], template_kwargs=request.template_kwargs,
                       tools=request.template_tools)
    if not ids:
        raise InvalidArgumentError("the prompt encodes to no tokens")
    return ids


DEFAULT_MAX_SEQ = 4096  # what arcpy.backends.open_device allocates unless told: the KV cache grows with it


def context_of(config, max_seq: int | None = None) -> int:
    """The context arcpy.backends.open_device allocates for a model of `config`: `max_seq` where given, else
    the model's own, at most DEFAULT_MAX_SEQ."""
    return min(config.max_seq, DEFAULT_MAX_SEQ) if max_seq is None else max_seq


def check_prompt(ids, vocab: int, context: int, stop_ids=(), hint: str = "") -> None:
    """The one check of a prompt, before it is decoded, that every front end and the engine make:
    its ids (and the stop ids) inside the vocabulary, and room left in the context to generate.
    `hint` ends the context's message: what the caller's user can change."""
    every = (*ids, *stop_ids)
    if every and not (0 <= min(every) and max(every) < vocab):  # at C speed; the message names the first
        t = next(t for t in every if not 0 <= t < vocab)
        raise InvalidArgumentError(f"token id {t} is outside the vocabulary [0, {vocab})")
    if len(ids) >= context:
        raise ContextFull(f"the prompt has {len(ids)} tokens, but the context holds {context} positions and leaves "
                          f"no room to generate{hint}")


def room_hint(needed: int, context: int, model_context: int, larger: str = "raise --max-seq",
              smaller: str = "shorten the prompt") -> str:
    """What can make room for `needed` positions (a prompt and what it must leave to generate)
    that a context of `context` positions lacks: a larger context (`larger` says how to ask for
    one) where the model's own context of `model_context` holds them, else asking for fewer
    (`smaller`): no context can hold more than the model's."""
    if context < model_context and needed <= model_context:
        return f"{larger} (the model allows up to {model_context})"
    return f"{smaller} (the model's own context is {model_context} positions)"


def check_budget(ids, max_new_tokens: int, context: int, name: str = "max_new_tokens") -> None:
    """Refuse a budget of new tokens that the context cannot hold after the prompt, naming both
    numbers (for a front end that takes a budget as given, as OpenAI's API does)."""
    if len(ids) + max_new_tokens > context:
        raise ContextFull(f"{name} is {max_new_tokens}, but the context holds {context} positions and the prompt "
                          f"takes {len(ids)}: at most {context - len(ids)} new tokens fit")


class ContextFull(InvalidArgumentError):
    """A prompt, or a prompt and its budget, larger than the context."""


def request_stop_ids(text: TextSpec | None, request: Request) -> tuple[int, ...]:
    """What ends the answer on the device: the model's end-of-sequence ids (where the engine has
    its text), then the request's own."""
    if request.stop and text is None:
        raise InvalidArgumentError("stop strings need the model's tokenizer, and this engine has none: use stop_ids")
    eos = tuple(text.eos_ids) if text is not None else ()
    return tuple(dict.fromkeys(eos + request.stop_ids))
