"""Answers of /v1/responses in the Responses API's shape: the response object, whole, or streamed
as its events (response.created, response.in_progress, then per output item its
output_item.added, its text's or arguments' deltas and done events, output_item.done, and last
response.completed, or response.incomplete where the budget or the context ran out).

The ResponseShaper answers to the same calls as shape.Shaper (arcpy/serve/response.py drives
either); the text it is given, whole or in pieces, goes through one machine that opens and closes
the output items (reasoning, message, function_call), so a whole response holds exactly the items
its stream would have sent. Once a response is done, its conversation is stored for a later
previous_response_id.
"""

from __future__ import annotations

import json
import time
import uuid

from arcpy.loop.stats import GenerationStats
from arcpy.serve.responses import Store, Turn
from arcpy.serve.shape import finish_reason
from arcpy.text.answer import Delta


def _event(kind: str, sequence: int, **fields) -> bytes:
    data = json.dumps({"type": kind, "sequence_number": sequence, **fields}, ensure_ascii=False,
                      separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


def _usage(stats: GenerationStats) -> dict:
    return {"input_tokens": stats.prompt_tokens, "input_tokens_details": {"cached_tokens": stats.cached_tokens},
            "output_tokens": stats.tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": stats.prompt_tokens + stats.tokens}


class ResponseShaper:
    """One /v1/responses answer: its output items as they form, and the events that tell them."""

    def __init__(self, turn: Turn, model: str, store: Store):
        self.turn, self.model, self.store = turn, model, store
        self.id = turn.id
        self.created = int(time.time())
        self.sent = 0            # tokens sent so far (response.py counts them)
        self.items: list[dict] = []
        self.index: dict[str, int] = {}  # an item's id -> its output_index
        self.open: dict | None = None   # the reasoning or message item text is going into
        self.sequence = 0

    # -- the machine ---------------------------------------------------------------------------

    def _emit(self, kind: str, **fields) -> bytes:
        self.sequence += 1
        return _event(kind, self.sequence - 1, **fields)

    def _where(self, item: dict) -> dict:
        return {"item_id": item["id"], "output_index": self.index[item["id"]]}

    def _add(self, item: dict) -> bytes:
        """A new output item; the event shows it as it starts, without its text or arguments."""
        self.index[item["id"]] = len(self.items)
        self.items.append(item)
        shown = {**item, "status": "in_progress"}
        shown.update({"content": []} if "content" in item else {"arguments": ""} if "arguments" in item else {})
        return self._emit("response.output_item.added", output_index=len(self.items) - 1, item=shown)

    def _close(self, status: str = "completed") -> bytes:
        """The open item done; `status` "incomplete" for the last one of an answer cut short."""
        item, self.open = self.open, None
        if item is None:
            return b""
        item["status"] = status
        part = item["content"][0]
        if item["type"] == "reasoning":
            out = self._emit("response.reasoning_text.done", **self._where(item), content_index=0, text=part["text"])
        else:
            out = (self._emit("response.output_text.done", **self._where(item), content_index=0, text=part["text"],
                              logprobs=[])
                   + self._emit("response.content_part.done", **self._where(item), content_index=0, part=part))
        return out + self._emit("response.output_item.done", output_index=self.index[item["id"]], item=item)

    def _text(self, kind: str, text: str) -> bytes:
        """Text into the open item of `kind` (opening it, and closing another, first)."""
        if not text:
            return b""
        out = b""
        if self.open is None or self.open["type"] != kind:
            out += self._close()
            if kind == "reasoning":
                self.open = {"id": "rs_" + uuid.uuid4().hex, "type": "reasoning", "summary": [],
                             "content": [{"type": "reasoning_text", "text": ""}], "status": "completed"}
                out += self._add(self.open)
            else:
                self.open = {"id": "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant",
                             "status": "completed", "content": [{"type": "output_text", "text": "", "annotations": [],
                                                                 "logprobs": []}]}
                out += self._add(self.open)
                out += self._emit("response.content_part.added", **self._where(self.open), content_index=0,
                                  part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        self.open["content"][0]["text"] += text
        if kind == "reasoning":
            return out + self._emit("response.reasoning_text.delta", **self._where(self.open), content_index=0,
                                    delta=text)
        return out + self._emit("response.output_text.delta", **self._where(self.open), content_index=0, delta=text,
                                logprobs=[])

    def _call(self, call: dict) -> bytes:
        f = call["function"]
        item = {"id": "fc_" + uuid.uuid4().hex, "type": "function_call", "call_id": call["id"], "name": f["name"],
                "arguments": f["arguments"], "status": "completed"}
        out = self._close() + self._add(item)
        out += self._emit("response.function_call_arguments.delta", **self._where(item), delta=f["arguments"])
        out += self._emit("response.function_call_arguments.done", **self._where(item), name=f["name"],
                          arguments=f["arguments"])
        return out + self._emit("response.output_item.done", output_index=self.index[item["id"]], item=item)

    def _response(self, status: str, stats: GenerationStats | None = None) -> dict:
        incomplete = None
        if status == "incomplete":
            incomplete = {"reason": "max_output_tokens"}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": int(time.time()) if status == "completed" else None, "error": None,
                "incomplete_details": incomplete, "model": self.model, "output": list(self.items),
                **self.turn.echo, "usage": None if stats is None else _usage(stats)}

    @staticmethod
    def _status(stats: GenerationStats, calls: bool) -> str:
        return "incomplete" if finish_reason(stats, calls) == "length" else "completed"

    def _finish(self, status: str, stats: GenerationStats) -> dict:
        """The conversation stored (the last item closed): the response object."""
        if self.turn.store:
            self.store.put(self.id, self.turn.conversation + [self._message()])
        return self._response(status, stats)

    def _message(self) -> dict:
        """The answer as the assistant's chat message, for a later turn."""
        text = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "message")
        calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
                 for i in self.items if i["type"] == "function_call"]
        if calls:
            return {"role": "assistant", "content": text or None, "tool_calls": calls}
        return {"role": "assistant", "content": text}

    # -- what response.py calls ----------------------------------------------------------------

    def first_chunk(self) -> bytes:
        response = self._response("in_progress")
        return (self._emit("response.created", response=response)
                + self._emit("response.in_progress", response=response))

    def text_chunk(self, text: str, entries=()) -> bytes:
        return self._text("message", text)

    def delta_chunk(self, delta: Delta) -> bytes:
        if delta.tool_call is not None:
            return self._call(delta.tool_call)
        return self._text("reasoning", delta.reasoning) + self._text("message", delta.content)

    def last_chunks(self, stats: GenerationStats, calls: bool = False) -> bytes:
        status = self._status(stats, calls)
        out = self._close(status)
        return out + self._emit("response." + status, response=self._finish(status, stats))

    def error_event(self, error: dict) -> bytes:
        e = error["error"]
        return self._emit("error", code=e.get("code"), message=e["message"], param=e.get("param"))

    def body(self, text: str, stats: GenerationStats, answer=None, entries=None) -> dict:
        if answer is None:
            self._text("message", text)
        else:
            self.delta_chunk(Delta(reasoning=answer.reasoning, content=answer.content))
            for call in answer.tool_calls:
                self._call(call)
        status = self._status(stats, bool(answer and answer.tool_calls))
        self._close(status)
        return self._finish(status, stats)
