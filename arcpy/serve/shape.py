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


def finish_reason(stats: GenerationStats, calls: bool = False) -> str:
    """OpenAI's finish_reason for a sequence that ended by itself; "tool_calls" where it stopped
    by itself after calling tools."""
    reason = _FINISH[FinishReason(stats.finish_reason)]
    return "tool_calls" if calls and reason == "stop" else reason


def usage(stats: GenerationStats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.tokens,
            "total_tokens": stats.prompt_tokens + stats.tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}


# A log-probability JSON can hold: -inf (a token the model rules out) is written as OpenAI writes
# the least likely, -9999.
_FLOOR = -9999.0


def _value(v: float) -> float:
    return v if v > _FLOOR else _FLOOR


def chat_logprobs(entries, token_text) -> dict:
    """Chat's `logprobs`: `content` holds, per (token id, TokenLogprob, text), the token's text, its
    log-probability, its UTF-8 bytes and the alternatives in the same form."""
    def item(tok, value):
        text = token_text(tok)
        return {"token": text, "logprob": _value(value), "bytes": list(text.encode())}
    return {"content": [{**item(tok, lp.logprob), "top_logprobs": [item(i, v) for i, v in lp.top]}
                        for tok, lp, _ in entries], "refusal": None}


def completion_logprobs(entries, token_text, offset: int = 0) -> dict:
    """A completion's legacy `logprobs`: parallel lists, the alternatives as text -> value, and
    each token's offset in the answer's text (from `offset`: the text that came before; each
    entry's `text` is what its token made final). An echoed prompt's first token has no
    log-probability (None: null, as OpenAI writes it)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tok, lp, made in entries:
        out["tokens"].append(token_text(tok))
        out["token_logprobs"].append(None if lp is None else _value(lp.logprob))
        out["top_logprobs"].append(None if lp is None else {token_text(i): _value(v) for i, v in lp.top})
        out["text_offset"].append(offset)
        offset += len(made)
    return out


def _json(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


class Shaper:
    """The response to one request, in the shape of its endpoint (chat or completion)."""

    def __init__(self, kind: str, model: str, fingerprint: str, include_usage: bool = False,
                 token_text=None, continuous_usage: bool = False, prompt_tokens: int = 0):
        self.kind, self.model, self.fingerprint = kind, model, fingerprint
        self.include_usage = include_usage
        self.token_text = token_text  # a token id's text, for log-probabilities
        self.continuous_usage, self.prompt_tokens, self.sent = continuous_usage, prompt_tokens, 0
        self.offset = 0  # a completion's text sent so far (its logprobs' text_offset)
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
        """The chunk that opens a chat stream: the assistant's role, no content yet (a completion
        has none)."""
        if self.kind != CHAT:
            return b""
        chunk = self._chunk({"role": "assistant", "content": None}, None)
        if self.continuous_usage:
            chunk["usage"] = self._usage_so_far()
        return b"data: " + _json(chunk) + b"\n\n"

    def text_chunk(self, text: str, entries=()) -> bytes:
        """Text, with the log-probabilities of the tokens that made it (`entries`, (id,
        TokenLogprob, text) triples) where asked for; `sent` counts the tokens so far (continuous usage)."""
        if not entries and not self.continuous_usage:
            self.offset += len(text)
            return self._head + json.dumps(text, ensure_ascii=False).encode() + self._tail
        chunk = self._chunk(self._delta(text), None)
        if entries:
            chunk["choices"][0]["logprobs"] = (chat_logprobs(entries, self.token_text) if self.kind == CHAT else
                                               completion_logprobs(entries, self.token_text, self.offset))
        if self.continuous_usage:
            chunk["usage"] = self._usage_so_far()
        self.offset += len(text)
        return b"data: " + _json(chunk) + b"\n\n"

    def _usage_so_far(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.sent,
                "total_tokens": self.prompt_tokens + self.sent}

    def delta_chunk(self, delta) -> bytes:
        """A chunk of reasoning, content or one tool call (arcpy.text.answer.Delta)."""
        if delta.tool_call is not None:
            return b"data: " + _json(self._chunk({"tool_calls": [delta.tool_call]}, None)) + b"\n\n"
        if delta.reasoning:
            return b"data: " + _json(self._chunk({"reasoning_content": delta.reasoning}, None)) + b"\n\n"
        return self.text_chunk(delta.content)

    def last_chunks(self, stats: GenerationStats, calls: bool = False) -> bytes:
        """The finish reason, the usage where asked for, and [DONE]."""
        part = {} if self.kind == CHAT else {"text": ""}
        chunk = self._chunk(part, finish_reason(stats, calls))
        if self.continuous_usage:
            chunk["usage"] = usage(stats)
        out = b"data: " + _json(chunk) + b"\n\n"
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

    def body(self, text: str, stats: GenerationStats, answer=None, entries=None) -> dict:
        """The whole response; `answer` (arcpy.text.answer.Answer) where the text was split into
        reasoning, content and tool calls; `entries` ((id, TokenLogprob, text) triples) where
        log-probabilities were asked for."""
        calls = bool(answer and answer.tool_calls)
        if self.kind == CHAT:
            message = {"role": "assistant", "content": text}
            if answer is not None:
                message["content"] = answer.content or (None if calls else "")
                if answer.reasoning:
                    message["reasoning_content"] = answer.reasoning
                if calls:
                    message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in answer.tool_calls]
            choice = {"index": 0, "message": message}
            logprobs = None if entries is None else chat_logprobs(entries, self.token_text)
        else:
            choice = {"index": 0, "text": text}
            logprobs = None if entries is None else completion_logprobs(entries, self.token_text)
        choice.update(logprobs=logprobs, finish_reason=finish_reason(stats, calls))
        return {"id": self.id, "object": "chat.completion" if self.kind == CHAT else "text_completion",
                "created": self.created, "model": self.model, "system_fingerprint": self.fingerprint,
                "choices": [choice], "usage": usage(stats)}
