"""POST /v1/responses (OpenAI's Responses API) read as the chat completion it asks for.

A Responses body becomes a chat completion's body (`instructions` a system message first, the
`input` items messages, function tools in chat's shape, `max_output_tokens` the budget, `text.format`
the response_format) and goes through the chat route's own parser (schema.parse), so the same
template, tool-call reading, reasoning split and constraints answer both. `previous_response_id`
continues a stored conversation: the Store keeps the last `STORED` responses' conversations (their
input and output as chat messages; instructions are not carried over, as OpenAI's are not), the
least recently used forgotten first. The answer's shape is arcpy/serve/events.py's.
"""

from __future__ import annotations

import collections
import uuid
from dataclasses import dataclass, replace

from arcpy.checks import quoted
from arcpy.serve.schema import CHAT, ApiError, Call, Defaults, bad
from arcpy.serve.schema import parse as parse_chat

STORED = 100  # responses kept for previous_response_id (arcpy serve --stored-responses)

_USED = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
         "parallel_tool_calls", "previous_response_id", "stream", "store", "text"}
# Fields of OpenAI's that arcpy does not implement: accepted only at these values (and null).
_NEUTRAL = {
    "metadata": lambda v: isinstance(v, dict),
    "user": lambda v: isinstance(v, str),
    "safety_identifier": lambda v: isinstance(v, str),
    "prompt_cache_key": lambda v: isinstance(v, str),
    "service_tier": lambda v: isinstance(v, str),
    "truncation": lambda v: v == "disabled",
    "include": lambda v: v == [],
    "background": lambda v: v is False,
    "top_logprobs": lambda v: v == 0 and not isinstance(v, bool),
    "reasoning": lambda v: isinstance(v, dict) and all(v.get(k) is None for k in v),
}
_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")
# What the chat parser names -> what a Responses client sent.
_PARAMS = {"max_tokens": "max_output_tokens", "response_format": "text.format"}


@dataclass(frozen=True)
class Turn:
    """One parsed Responses request: the chat call to decode, the conversation to store with its
    answer, and the request's fields the response object repeats."""

    call: Call
    id: str
    conversation: list   # chat messages without the instructions: what a later turn continues
    echo: dict           # the request's fields, as the response object repeats them
    store: bool


class Store:
    """The last `size` responses' conversations by id, least recently used forgotten first."""

    def __init__(self, size: int = STORED):
        self.size = size
        self._items: collections.OrderedDict[str, list] = collections.OrderedDict()

    def put(self, response_id: str, conversation: list) -> None:
        if self.size <= 0:
            return
        self._items[response_id] = conversation
        self._items.move_to_end(response_id)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def get(self, response_id) -> list:
        if not isinstance(response_id, str):
            raise bad(f"previous_response_id must be a string, got {quoted(response_id)}", param="previous_response_id")
        if response_id not in self._items:
            raise ApiError(404, f"Previous response with id {quoted(response_id)} not found (this server keeps the "
                                f"last {self.size} responses, in memory, until it stops)",
                           param="previous_response_id", code="previous_response_not_found")
        self._items.move_to_end(response_id)
        return self._items[response_id]


def parse(body, model: str, defaults: Defaults, store: Store) -> Turn:
    """A Responses body -> Turn; ApiError (OpenAI's error shape) for anything it cannot take."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    for name in body:
        if name not in _USED and name not in _NEUTRAL:
            raise bad(f"unrecognized request argument supplied: {quoted(name)}", param=name)
    for name, neutral in _NEUTRAL.items():
        if body.get(name) is not None and not neutral(body[name]):
            raise bad(f"{name} {quoted(body[name])} is not supported by arcpy (leave it out)", param=name)
    earlier = [] if body.get("previous_response_id") is None else store.get(body["previous_response_id"])
    conversation = earlier + _input(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad(f"instructions must be a string, got {quoted(instructions)}", param="instructions")
    chat = {"model": body.get("model"), "stream": body.get("stream"),
            "messages": ([{"role": "system", "content": instructions}] if instructions else []) + conversation,
            "max_tokens": body.get("max_output_tokens"), "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "tools": _tools(body.get("tools")), "tool_choice": _tool_choice(body),
            "parallel_tool_calls": body.get("parallel_tool_calls"), "response_format": _format(body.get("text"))}
    try:
        call = parse_chat(CHAT, {k: v for k, v in chat.items() if v is not None}, model, defaults)
    except ApiError as exc:
        raise renamed(exc) from None
    if call.budget_field is not None:
        call = replace(call, budget_field="max_output_tokens")
    store_it = body.get("store")
    if store_it is not None and not isinstance(store_it, bool):
        raise bad(f"store must be true or false, got {quoted(store_it)}", param="store")
    s = call.request.sampling
    echo = {"instructions": instructions, "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {}, "parallel_tool_calls": call.request.parallel_tool_calls,
            "previous_response_id": body.get("previous_response_id"), "temperature": s.temperature,
            "top_p": s.top_p, "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
            "text": body.get("text") or {"format": {"type": "text"}}, "user": body.get("user"),
            "truncation": "disabled", "reasoning": {"effort": None, "summary": None},
            "store": store_it is not False}
    return Turn(call, "resp_" + uuid.uuid4().hex, conversation, echo, store_it is not False)


def renamed(exc: ApiError) -> ApiError:
    """An error of the chat parser in the Responses API's names."""
    message, param = exc.message.replace(".function.", "."), exc.param
    for chat, ours in _PARAMS.items():
        message = message.replace(chat, ours)
        param = ours if param == chat else param
    return replace(exc, message=message, param=param)


def _text(content, where: str) -> str:
    """A message's or an output's text: a string, or text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else None
                raise bad(f"{where}[{j}]: only text parts ({', '.join(_TEXT_PARTS)}) are supported"
                          + (f", got type {quoted(kind)}" if kind is not None else ""), param=where)
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"{where} must be a string or an array of text parts, got {quoted(content)}", param=where)


def _string(item: dict, name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value and name != "arguments":
        raise bad(f"{where}.{name}: required, a string, got {quoted(value)}", param=f"{where}.{name}")
    return value


def _input(given) -> list:
    """`input` (a string, or message, function_call, function_call_output and reasoning items)
    -> chat messages. A function call joins the assistant's message before it (or opens one);
    a reasoning item is left out of the prompt, as chat templates leave out earlier reasoning."""
    if isinstance(given, str):
        if not given:
            raise bad("input is empty", param="input")
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise bad("input: required, a string or a non-empty array of items", param="input")
    out, names = [], {}
    for i, item in enumerate(given):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(f"{where} must be an object, got {quoted(item)}", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise bad(f"{where}: unknown role {quoted(role)} (known: {', '.join(_ROLES)})", param=f"{where}.role")
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call_id, name = _string(item, "call_id", where), _string(item, "name", where)
            call = {"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": _string(item, "arguments", where)}}
            names[call_id] = name
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            message = {"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), f"{where}.output")}
            if call_id in names:
                message["name"] = names[call_id]
            out.append(message)
        elif kind != "reasoning":
            raise bad(f"{where}: unsupported item type {quoted(kind)} (arcpy takes message, function_call, "
                      "function_call_output and reasoning items)", param=f"{where}.type")
    return out


def _tools(tools):
    """Function tools in the Responses API's shape -> chat's (the chat parser checks the rest)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad(f"tools must be an array of function tools, got {quoted(tools)}", param="tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise bad(f"tools[{i}]: only function tools are supported"
                      + (f", got type {quoted(kind)}" if kind is not None else ""), param=f"tools[{i}]")
        out.append({"type": "function", "function": {k: v for k, v in t.items() if k != "type"}})
    return out


def _tool_choice(body: dict):
    """tool_choice: "none", "auto", "required", or {"type": "function", "name"} -> chat's."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _format(text):
    """text.format -> chat's response_format (None: plain text)."""
    if text is None:
        return None
    if not isinstance(text, dict) or sorted(set(text) - {"format"}):
        raise bad(f"text must be an object with a format, got {quoted(text)}", param="text")
    fmt = text.get("format")
    if fmt is None or fmt == {"type": "text"}:
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    return fmt  # json_object, or a mistake the chat parser names
