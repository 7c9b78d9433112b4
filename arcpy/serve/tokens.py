"""POST /tokenize and /detokenize: the model's tokenizer over HTTP, in the shapes vLLM and
llama-server answer (a body's `prompt`, or llama-server's `content`; or chat `messages`, rendered
through the chat template as a chat completion's are)."""

from __future__ import annotations

from arcpy.checks import is_int, quoted
from arcpy.errors import ArcError
from arcpy.loop.prompt import request_ids
from arcpy.loop.request import Request
from arcpy.serve.schema import bad, check_model, messages_of, template_kwargs_of
from arcpy.text import decode, encode

_TOKENIZE = {"model", "prompt", "content", "messages", "add_special_tokens", "add_special", "chat_template_kwargs"}


def tokenize(body, model: str, text, max_seq: int, defaults) -> dict:
    """{"tokens", "count", "max_model_len"} of the body's text or messages."""
    _object(body, _TOKENIZE)
    check_model(body, model, required=False)
    given = [name for name in ("prompt", "content", "messages") if body.get(name) is not None]
    if len(given) != 1:
        raise bad("give one of prompt (or content) and messages", param="prompt")
    try:
        if given[0] == "messages":
            request = Request(**messages_of(body), template_kwargs=template_kwargs_of(body, defaults))
            ids = request_ids(text, request)
        else:
            prompt = body[given[0]]
            if not isinstance(prompt, str):
                raise bad(f"{given[0]} must be a string, got {quoted(prompt)}", param=given[0])
            special = body.get("add_special_tokens", body.get("add_special", True))
            if not isinstance(special, bool):
                raise bad(f"add_special_tokens must be true or false, got {quoted(special)}",
                          param="add_special_tokens")
            ids = encode(text, prompt, add_bos=None if special else False)
    except ArcError as exc:
        raise bad(str(exc), param=given[0]) from None
    return {"tokens": ids, "count": len(ids), "max_model_len": max_seq}


def detokenize(body, model: str, text) -> dict:
    """{"prompt", "content"}: the text of the body's token ids (special tokens left out)."""
    _object(body, {"model", "tokens"})
    check_model(body, model, required=False)
    tokens = body.get("tokens")
    if not (isinstance(tokens, list) and all(is_int(t) for t in tokens)):
        raise bad(f"tokens must be an array of token ids, got {quoted(tokens)}", param="tokens")
    try:
        out = decode(text, tokens)
    except ArcError as exc:
        raise bad(str(exc), param="tokens") from None
    return {"prompt": out, "content": out}


def _object(body, known: set) -> None:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad(f"unrecognized request argument supplied: {quoted(unknown[0])}", param=unknown[0])

