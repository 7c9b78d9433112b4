"""Request: what a front end asks the engine for. The CLI, the server and the chat builds one; the
engine's `stream`, `generate` and `chat` take it.

One of three prompts: `prompt_ids` (token ids, fed as they are), `prompt` (text, encoded with
special-token strings as ordinary text) or `messages` (a conversation, rendered through the
model's chat template: only the template's own markup becomes special tokens), with the template's
keyword arguments where it takes some (`template_kwargs`, e.g. {"enable_thinking": False}). Then
the budget of new tokens, what stops the answer (token ids, on the device; strings, on the host,
never shown), the sampling (temperature, top-k, top-p and the seed; arcpy.sampling), and whether
each token comes with its log-probabilities (`logprobs`: how many alternatives), with a logit
bias (`logit_bias`).

For agents: `tools` (OpenAI's function tools, for the chat template) and `tool_choice` ("auto",
"none", "required" or a function's name: the last two are enforced by a grammar), and
`response_format` (OpenAI's {"type": "json_object"} or {"type": "json_schema", "json_schema":
{"schema": ...}}, or {"type": "grammar", "grammar": GBNF text}): the answer is then constrained
token by token to what the format allows (arcpy.text.grammar).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from arcpy.checks import is_int, quoted
from arcpy.codes import MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS
from arcpy.errors import InvalidArgumentError
from arcpy.sampling import Sampling
from arcpy.text import check_template_kwargs
from arcpy.text.grammar import GBNF, JSON_OBJECT, JSON_SCHEMA
from arcpy.text.tools import AUTO, NONE, check_tool_calls, check_tool_choice, check_tools

ROLES = ("system", "user", "assistant", "tool")  # the roles chat templates know
DEFAULT_MAX_NEW_TOKENS = 256


class Frozen:
    """A JSON value, read-only (a copy is handed out) and hashable, equal by its JSON."""

    def __init__(self, value):
        self._json = json.dumps(value, sort_keys=True)
        self._value = copy.deepcopy(value)

    @property
    def value(self):
        return copy.deepcopy(self._value)

    def __eq__(self, other) -> bool:
        return isinstance(other, Frozen) and self._json == other._json

    def __hash__(self) -> int:
        return hash(self._json)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return f"Frozen({self._value!r})"


@dataclass(frozen=True)
class Message:
    role: str     # one of ROLES
    content: str
    tool_calls: Frozen | None = None   # an assistant's calls, OpenAI's shape (arguments as JSON text)
    tool_call_id: str | None = None    # a tool's answer: the call it answers
    name: str | None = None            # a tool's answer: the function's name
    reasoning_content: str | None = None  # an assistant's reasoning, as the answer's reasoning_content gave it

    def __post_init__(self):
        if self.role not in ROLES:
            raise InvalidArgumentError(f"unknown message role {quoted(self.role)} (known: {', '.join(ROLES)})")
        if self.content is None and self.tool_calls:
            object.__setattr__(self, "content", "")
        if not isinstance(self.content, str):
            raise InvalidArgumentError(f"a message's content must be a string, got {quoted(self.content)}")
        check_unicode(self.content, f"the {self.role} message")
        if self.tool_calls is not None and not isinstance(self.tool_calls, Frozen):
            if self.role != "assistant":
                raise InvalidArgumentError("only an assistant's message has tool_calls")
            calls = check_tool_calls(self.tool_calls, f"the {self.role} message")
            object.__setattr__(self, "tool_calls", Frozen(calls))
        if self.reasoning_content is not None and self.role != "assistant":
            raise InvalidArgumentError("only an assistant's message has reasoning_content")
        for key in ("tool_call_id", "name", "reasoning_content"):
            v = getattr(self, key)
            if v is not None:
                if not isinstance(v, str):
                    raise InvalidArgumentError(f"a message's {key} must be a string, got {quoted(v)}")
                check_unicode(v, f"the {self.role} message's {key}")

    def as_dict(self) -> dict:
        out = {"role": self.role, "content": self.content}
        if self.tool_calls is not None:
            out["tool_calls"] = self.tool_calls.value
        for key in ("tool_call_id", "name", "reasoning_content"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True)
class Constraint:
    """What an answer must be: kind JSON_SCHEMA (source: the schema), JSON_OBJECT, or GBNF
    (source: the grammar's text)."""

    kind: str
    source: Frozen | str | None = None

    @classmethod
    def of(cls, response_format) -> "Constraint | None":
        """OpenAI's response_format (and arcpy's {"type": "grammar", "grammar": ...}) -> a
        Constraint, or None for {"type": "text"} or nothing."""
        if response_format is None or isinstance(response_format, Constraint):
            return response_format
        rf = response_format
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "text" and set(rf) == {"type"}:
            return None
        if kind == JSON_OBJECT and set(rf) == {"type"}:
            return cls(JSON_OBJECT)
        if kind == JSON_SCHEMA and set(rf) == {"type", "json_schema"} and isinstance(rf["json_schema"], dict):
            js = rf["json_schema"]
            unknown = sorted(set(js) - {"name", "description", "schema", "strict"})
            if unknown:
                raise InvalidArgumentError(f"response_format.json_schema: unsupported field {quoted(unknown[0])}")
            if not isinstance(js.get("schema"), dict):
                raise InvalidArgumentError("response_format.json_schema.schema: required, a JSON schema object")
            return cls(JSON_SCHEMA, Frozen(js["schema"]))
        if kind == "grammar" and set(rf) == {"type", "grammar"} and isinstance(rf["grammar"], str):
            return cls(GBNF, rf["grammar"])
        raise InvalidArgumentError("response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"}, "
                                   "{\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\", \"strict\"}} or "
                                   f"{{\"type\": \"grammar\", \"grammar\": GBNF}}, got {quoted(rf)}")


class TemplateKwargs(Mapping):
    """A request's keyword arguments for the chat template, checked (arcpy.text.check_template_kwargs):
    read-only, hashable like the rest of a Request, equal to a dict of the same items."""

    def __init__(self, values: Mapping | None = None):
        self._items = check_template_kwargs(values)
        self._json = json.dumps(self._items, sort_keys=True)

    def __getitem__(self, name: str):
        return copy.deepcopy(self._items[name])

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other) -> bool:
        if isinstance(other, TemplateKwargs):
            return self._json == other._json
        return isinstance(other, Mapping) and self._items == dict(other)

    def __hash__(self) -> int:
        return hash(self._json)

    def __repr__(self) -> str:
        return f"TemplateKwargs({self._items!r})"


@dataclass(frozen=True)
class Request:
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    messages: tuple[Message, ...] | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    stop_ids: tuple[int, ...] = ()   # besides the model's end-of-sequence ids, which always stop
    stop: tuple[str, ...] = ()       # stop strings: the answer ends before the first one
    sampling: Sampling = field(default_factory=Sampling)
    template_kwargs: Mapping = field(default_factory=TemplateKwargs)  # names -> JSON values, for the template
    logprobs: int | None = None      # each token's log-probability and this many alternatives (0..20); None: off
    logit_bias: Mapping = field(default_factory=dict)  # token id -> a value in [-100, 100] added to its logit
    tools: Frozen | None = None       # OpenAI's function tools, for the chat template
    tool_choice: str | None = None    # "auto" (with tools), "none" (without), "required", or a function's name
    parallel_tool_calls: bool = True  # False: a required choice is one call
    response_format: Constraint | None = None  # Constraint.of(OpenAI's response_format)

    def __post_init__(self):
        given = [name for name in ("prompt", "prompt_ids", "messages") if getattr(self, name) is not None]
        if len(given) != 1:
            raise InvalidArgumentError("a request takes exactly one of prompt, prompt_ids and messages, "
                                       f"got {', '.join(given) or 'none'}")
        if self.prompt is not None:
            if not isinstance(self.prompt, str):
                raise InvalidArgumentError(f"prompt must be a string, got {type(self.prompt).__name__}")
            check_unicode(self.prompt, "the prompt")
        if self.prompt_ids is not None:
            object.__setattr__(self, "prompt_ids", _ids(self.prompt_ids, "prompt_ids"))
            if not self.prompt_ids:
                raise InvalidArgumentError("prompt_ids is empty: give at least one token id")
        if self.messages is not None:
            object.__setattr__(self, "messages", _messages(self.messages))
        if not (is_int(self.max_new_tokens) and self.max_new_tokens >= 0):
            raise InvalidArgumentError(f"max_new_tokens must be an integer >= 0, got {quoted(self.max_new_tokens)}")
        object.__setattr__(self, "stop_ids", _ids(self.stop_ids, "stop_ids"))
        object.__setattr__(self, "stop", _stops(self.stop))
        if not isinstance(self.template_kwargs, TemplateKwargs):
            object.__setattr__(self, "template_kwargs", TemplateKwargs(self.template_kwargs))
        if self.template_kwargs and self.messages is None:
            raise InvalidArgumentError("template_kwargs are for the chat template: give messages, not a prompt")
        if self.logprobs is not None and not (is_int(self.logprobs) and 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise InvalidArgumentError(f"logprobs must be None or an integer in 0..{MAX_TOP_LOGPROBS} (the "
                                       f"alternatives listed), got {quoted(self.logprobs)}")
        object.__setattr__(self, "logit_bias", logit_bias_pairs(self.logit_bias))
        self._agent_fields()
        if not isinstance(self.sampling, Sampling):
            raise InvalidArgumentError(f"sampling must be an arcpy.sampling.Sampling, got "
                                       f"{type(self.sampling).__name__}")

    def _agent_fields(self) -> None:
        tools = self.tools.value if isinstance(self.tools, Frozen) else check_tools(self.tools)
        choice = self.tool_choice
        if not (isinstance(choice, str) and choice not in ("auto", "none", "required")
                and any(t["function"]["name"] == choice for t in tools)):
            choice = check_tool_choice(choice, tools)
        object.__setattr__(self, "tools", Frozen(tools) if tools else None)
        object.__setattr__(self, "tool_choice", choice)
        object.__setattr__(self, "response_format", Constraint.of(self.response_format))
        if not isinstance(self.parallel_tool_calls, bool):
            raise InvalidArgumentError("parallel_tool_calls must be True or False, got "
                                       f"{quoted(self.parallel_tool_calls)}")
        if tools and self.messages is None:
            raise InvalidArgumentError("tools are for the chat template: give messages, not a prompt")
        if self.response_format is not None and choice not in (AUTO, NONE):
            raise InvalidArgumentError(f"response_format and tool_choice {quoted(choice)} both constrain the answer: "
                                       "give one of them")

    @property
    def template_tools(self) -> list[dict] | None:
        """The tools the template sees: none where tool_choice is "none"."""
        return self.tools.value if self.tools and self.tool_choice != NONE else None

    @property
    def is_text(self) -> bool:
        """Whether the prompt needs the model's tokenizer."""
        return self.prompt_ids is None


def logit_bias_pairs(bias) -> tuple[tuple[int, float], ...]:
    """A logit bias (a mapping, or (id, value) pairs) checked -> (id, value) pairs by id: at most
    MAX_LOGIT_BIAS, ids >= 0 and distinct, values finite in [-100, 100] (as OpenAI takes them)."""
    items = list(bias.items()) if isinstance(bias, Mapping) else list(bias) if isinstance(bias, (list, tuple)) else None
    if items is None or not all(isinstance(p, tuple) and len(p) == 2 for p in items):
        raise InvalidArgumentError(f"logit_bias must map token ids to numbers, got {quoted(bias)}")
    if len(items) > MAX_LOGIT_BIAS:
        raise InvalidArgumentError(f"logit_bias takes at most {MAX_LOGIT_BIAS} token ids, got {len(items)}")
    out = {}
    for tok, value in items:
        if not (is_int(tok) and tok >= 0) or int(tok) in out:
            raise InvalidArgumentError(f"logit_bias: {quoted(tok)} is not a token id (an integer >= 0, once)")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise InvalidArgumentError(f"logit_bias of token {tok}: {quoted(value)} is not a number in [-100, 100]")
        out[int(tok)] = float(value)
    return tuple(sorted(out.items()))


def check_unicode(text: str, what: str) -> None:
    """Refuse a string with a lone surrogate: what bytes that are not UTF-8 become in a command
    line argument, and what no tokenizer takes. The error points into `text` itself."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"{what} is not valid UTF-8: character {e.start} is a byte that is not UTF-8, "
                                   f"after {quoted(text[max(0, e.start - 20):e.start])}") from None


def _ids(value, what: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InvalidArgumentError(f"{what} must be a list of token ids, got {type(value).__name__}")
    ids = tuple(value)
    if set(map(type, ids)) <= {int} and (not ids or min(ids) >= 0):  # plain ints: the common case, at C speed
        return ids
    for t in ids:
        if not (is_int(t) and t >= 0):
            raise InvalidArgumentError(f"{what}: a token id must be an integer >= 0, got {quoted(t)}")
    return tuple(int(t) for t in ids)


def _messages(value) -> tuple[Message, ...]:
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise InvalidArgumentError("messages must be a list of {'role': ..., 'content': ...}")
    out = []
    for i, m in enumerate(value):
        if isinstance(m, dict):
            extra = sorted(set(m) - {"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content"})
            if extra:
                raise InvalidArgumentError(f"messages[{i}]: unsupported key {quoted(extra[0])} "
                                           "(a message has 'role' and 'content'; an assistant's may have "
                                           "'tool_calls' and 'reasoning_content', a tool's 'tool_call_id' and 'name')")
            m = Message(m.get("role"), m.get("content"), m.get("tool_calls"), m.get("tool_call_id"), m.get("name"),
                        m.get("reasoning_content"))
        elif not isinstance(m, Message):
            raise InvalidArgumentError(f"messages[{i}] must be a dict with 'role' and 'content', "
                                       f"got {type(m).__name__}")
        out.append(m)
    if not out:
        raise InvalidArgumentError("messages is empty: give at least one message")
    return tuple(out)


def _stops(value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not hasattr(value, "__iter__"):
        raise InvalidArgumentError(f"stop must be a string or a list of strings, got {type(value).__name__}")
    stops = tuple(value)
    for i, s in enumerate(stops):
        if not isinstance(s, str) or not s:
            raise InvalidArgumentError(f"a stop string must be a non-empty string, got {quoted(s)}")
        check_unicode(s, f"stop string {i}")
    return stops
