"""Answers in the OpenAI API's shapes: whole responses, server-sent-event chunks, usage.

A streamed chunk is built from two byte strings made once per request and the JSON of its text,
so the per-token work on the event loop is one json.dumps of a few characters.
"""

from __future__ import annotations

import json
import time
import uuid

from arcpy.loop.stats import FinishReason, GenerationStats
from arcpy.serve.schema import CHAT

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}

# arcpy's reasons -> OpenAI's: "stop" for a natural stop or a stop sequence, "length" for the
# budget or the context.
_FINISH = {FinishReason.STOP_ID: "stop", FinishReason.STOP_STRING: "stop",
           FinishReason.TOKEN_BUDGET: "length", FinishReason.CONTEXT_FULL: "length"}


def finish_reason(stats: GenerationStats) -> str:
    """OpenAI's finish_reason for a sequence that ended by itself."""
    return _FINISH[FinishReason(stats.finish_reason)]


def usage(stats: GenerationStats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.tokens,
            "total_tokens": stats.prompt_tokens + stats.tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}


def _json(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


class Shaper:
    """The response to one request, in the shape of its endpoint (chat or completion)."""

    def __init__(self, kind: str, model: str, fingerprint: str, include_usage: bool = False):
        self.kind, self.model, self.fingerprint = kind, model, fingerprint
        self.include_usage = include_usage
        self.id = ("chatcmpl-" if kind == CHAT else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        mark = "\x00text-" + uuid.uuid4().hex
        head, _, tail = _json(self._chunk(self._delta(mark), None)).partition(_json(mark))
        self._head, self._tail = b"data: " + head, tail + b"\n\n"

    def _delta(self, text) -> dict:
        return {"content": text} if self.kind == CHAT else {"text": text}

    def _choice(self, part: dict, reason) -> dict:
        choice = {"index": 0, "delta": part} if self.kind == CHAT else {"index": 0, **part}
        choice.update(logprobs=None, finish_reason=reason)
        return choice

    def _chunk(self, part: dict, reason) -> dict:
        chunk = {"id": self.id, "object": "chat.completion.chunk" if self.kind == CHAT else "text_completion",
                 "created": self.created, "model": self.model, "system_fingerprint": self.fingerprint,
                 "choices": [self._choice(part, reason)]}
        if self.include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the last
        return chunk

    # -- streaming ---------------------------------------------------------------------------

    def first_chunk(self) -> bytes:
        """The chunk that opens a chat stream: the assistant's role (a completion has none)."""
        if self.kind != CHAT:
            return b""
        return b"data: " + _json(self._chunk({"role": "assistant", "content": ""}, None)) + b"\n\n"

    def text_chunk(self, text: str) -> bytes:
        return self._head + json.dumps(text, ensure_ascii=False).encode() + self._tail

    def last_chunks(self, stats: GenerationStats) -> bytes:
        """The finish reason, the usage where asked for, and [DONE]."""
        part = {} if self.kind == CHAT else {"text": ""}
        out = b"data: " + _json(self._chunk(part, finish_reason(stats))) + b"\n\n"
        if self.include_usage:
            last = self._chunk(part, None)
            last["choices"], last["usage"] = [], usage(stats)
            out += b"data: " + _json(last) + b"\n\n"
        return out + DONE

    @staticmethod
    def error_event(error: dict) -> bytes:
        """An error after the stream began (its status was already sent): OpenAI's clients raise it."""
        return b"data: " + _json(error) + b"\n\n"

    # -- whole -------------------------------------------------------------------------------

    def body(self, text: str, stats: GenerationStats) -> dict:
        if self.kind == CHAT:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice.update(logprobs=None, finish_reason=finish_reason(stats))
        return {"id": self.id, "object": "chat.completion" if self.kind == CHAT else "text_completion",
                "created": self.created, "model": self.model, "system_fingerprint": self.fingerprint,
                "choices": [choice], "usage": usage(stats)}
