"""The OpenAI API's request bodies -> an arcpy Request: /v1/chat/completions and /v1/completions.

Every field OpenAI defines for these endpoints is used, or accepted at its neutral value (null,
0, false, ...), or refused with a 400 that names it; a field OpenAI does not define is refused
too, as OpenAI refuses it, but for the extensions on chat completions: `chat_template_kwargs`,
which vLLM and other servers take: keyword arguments for the model's chat template (e.g.
{"enable_thinking": false}), over the server's own (--template-kwarg); and `grammar`, llama.cpp's
GBNF grammar for the answer. OpenAI's `reasoning_effort` is the template's keyword argument of that
name (gpt-oss's template reads it), under chat_template_kwargs. `tools`, `tool_choice` and
`response_format` are OpenAI's (arcpy.loop.request). Nothing here raises anything but ApiError at
a client mistake.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from arcpy.checks import is_int, quoted
from arcpy.codes import MAX_TOP_LOGPROBS
from arcpy.errors import ArcError
from arcpy.loop.request import Request, TemplateKwargs
from arcpy.text import check_template_kwargs
from arcpy.sampling import MIN_TEMPERATURE, Sampling

CHAT, COMPLETION = "chat", "completion"
MAX_STOPS = 4              # OpenAI's limit on stop sequences
MAX_TEMPERATURE = 2.0      # OpenAI's range is [0, 2]
ROLE_ALIASES = {"developer": "system"}  # OpenAI's newer name for the system message
ROLES = ("system", "user", "assistant", "tool")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")  # OpenAI's reasoning_effort


@dataclass
class ApiError(Exception):
    """A reply in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        # What a client sent goes into the message and the param: a lone surrogate in it (a JSON
        # escape such as \ud800) is written as its escape, or the body could not be encoded.
        self.message, self.param = _printable(self.message), _printable(self.param)

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _printable(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class Defaults:
    """What a request that leaves a field out gets (the server's flags)."""

    max_tokens: int = 256
    temperature: float = 1.0   # OpenAI's default
    top_p: float = 1.0
    top_k: int = 0
    template_kwargs: TemplateKwargs = field(default_factory=TemplateKwargs)  # for a chat request
    raw_reasoning: bool = False  # keep <think>...</think> in the content, as written (--raw-reasoning)


@dataclass(frozen=True)
class Call:
    """One parsed request: what to ask the engine, and how to answer."""

    kind: str            # CHAT or COMPLETION
    request: Request     # messages (chat) or a prompt: text, or token ids
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the token counts
    budget_field: str | None = None  # max_tokens or max_completion_tokens, where the client gave one
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: the counts on every chunk
    echo: bool = False   # a completion's `echo`: the prompt's text (and log-probabilities) before the answer's
    constraint_field: str = "tool_choice"  # the field a constraint came from: response_format, grammar or tool_choice


def _neutral_zero(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0


# Fields OpenAI defines that arcpy does not implement: accepted only at these values (and null).
_CHAT_NEUTRAL = {
    "frequency_penalty": _neutral_zero,
    "presence_penalty": _neutral_zero,
    "modalities": lambda v: v == ["text"],
    "store": lambda v: v is False,
    "metadata": lambda v: isinstance(v, dict),
    "service_tier": lambda v: isinstance(v, str),
    "user": lambda v: isinstance(v, str),
}
_COMPLETION_NEUTRAL = {
    "frequency_penalty": _neutral_zero,
    "presence_penalty": _neutral_zero,
    "best_of": lambda v: v == 1,
    "suffix": lambda v: v == "",
    "user": lambda v: isinstance(v, str),
}
_COMMON = ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream", "stream_options")
_AGENT = ("tools", "tool_choice", "response_format", "grammar", "parallel_tool_calls")
_USED = {CHAT: set(_COMMON) | {"messages", "max_completion_tokens", "chat_template_kwargs", "logprobs",
                               "top_logprobs", "logit_bias", "reasoning_effort", *_AGENT},
         COMPLETION: set(_COMMON) | {"prompt", "logprobs", "logit_bias", "echo"}}
_NEUTRAL = {CHAT: _CHAT_NEUTRAL, COMPLETION: _COMPLETION_NEUTRAL}


def parse(kind: str, body, model: str, defaults: Defaults) -> Call:
    """A request body (parsed JSON) -> Call. `model` is the name this server answers to."""
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {_kind(body)}")
    for name in body:
        if name not in _USED[kind] and name not in _NEUTRAL[kind]:
            raise bad(f"unrecognized request argument supplied: {quoted(name)}", param=name)
    for name, neutral in _NEUTRAL[kind].items():
        if body.get(name) is not None and not neutral(body[name]):
            raise bad(f"{name} {quoted(body[name])} is not supported by arcpy (leave it out)", param=name)
    check_model(body, model)
    n = _optional(body, "n", _int)
    if n is not None and n != 1:
        raise bad(f"n must be 1: arcpy decodes one sequence per request, got {quoted(n)}", param="n")
    stream = _optional(body, "stream", _bool) or False
    include_usage, continuous_usage = _stream_options(body, stream)
    if kind == CHAT:
        source = {**messages_of(body), "template_kwargs": template_kwargs_of(body, defaults), **_agent(body)}
    else:
        source = _prompt(body)
    try:
        budget, budget_field = _budget(body, kind, defaults)
        request = Request(**source, max_new_tokens=budget, stop=_stop(body), sampling=_sampling(body, defaults),
                          logprobs=_logprobs(body, kind), logit_bias=_logit_bias(body))
    except ArcError as exc:  # what Request and Message check themselves (a lone surrogate, tools, ...)
        text = str(exc)
        raise bad(text, param=next((n for n in _AGENT if text.startswith(n)), None)) from None
    echo = kind == COMPLETION and (_optional(body, "echo", _bool) or False)
    constrained_by = next((n for n in ("grammar", "response_format") if body.get(n) is not None), "tool_choice")
    return Call(kind, request, stream, include_usage, budget_field, continuous_usage, echo, constrained_by)


def check_model(body: dict, model: str, required: bool = True) -> None:
    """The body's `model` names this server's (GET /v1/models); else 400, or 404 for another."""
    given = body.get("model")
    if given is None and not required:
        return
    if not isinstance(given, str):
        raise bad("model: required, a string (GET /v1/models lists the one this server answers to)"
                  if given is None else f"model must be a string, got {_kind(given)}", param="model")
    if given != model:
        raise ApiError(404, f"the model {quoted(given)} does not exist: this server answers to {quoted(model)}",
                       param="model", code="model_not_found")


def _kind(v) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(v), "a number")


def _optional(body: dict, name: str, read):
    value = body.get(name)
    return None if value is None else read(value, name)


def _int(v, name: str) -> int:
    if not is_int(v):
        raise bad(f"{name} must be an integer, got {quoted(v)}", param=name)
    return int(v)


def _number(v, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(f"{name} must be a number, got {quoted(v)}", param=name)
    try:
        v = float(v)
    except OverflowError:
        v = math.inf
    if not math.isfinite(v):
        raise bad(f"{name} must be a finite number", param=name)
    return v


def _bool(v, name: str) -> bool:
    if not isinstance(v, bool):
        raise bad(f"{name} must be true or false, got {quoted(v)}", param=name)
    return v


def _logit_bias(body: dict) -> dict:
    """`logit_bias`: token ids (as JSON keys, strings) -> values added to their logits."""
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise bad(f"logit_bias must be an object of token ids to numbers, got {_kind(bias)}", param="logit_bias")
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()):
            raise bad(f"logit_bias: {quoted(key)} is not a token id", param="logit_bias")
        out[int(key)] = value
    return out


def _logprobs(body: dict, kind: str) -> int | None:
    """Request.logprobs: chat's `logprobs` (true) with `top_logprobs` alternatives, or a
    completion's `logprobs` (the alternatives, the legacy form)."""
    if kind == COMPLETION:
        n = _optional(body, "logprobs", _int)
        if n is not None and not 0 <= n <= MAX_TOP_LOGPROBS:
            raise bad(f"logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {n}", param="logprobs")
        return n
    wanted = _optional(body, "logprobs", _bool) or False
    top = _optional(body, "top_logprobs", _int)
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise bad(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {top}", param="top_logprobs")
    if top and not wanted:
        raise bad("top_logprobs needs logprobs to be true", param="top_logprobs")
    return (top or 0) if wanted else None


def _stream_options(body: dict, stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats)."""
    options = body.get("stream_options")
    if options is None:
        return False, False
    if not stream:
        raise bad("stream_options is only allowed when stream is true", param="stream_options")
    if not isinstance(options, dict):
        raise bad(f"stream_options must be an object, got {_kind(options)}", param="stream_options")
    unknown = sorted(set(options) - {"include_usage", "continuous_usage_stats"})
    if unknown:
        raise bad(f"stream_options: unrecognized field {quoted(unknown[0])}", param="stream_options")
    return (_optional(options, "include_usage", _bool) or False,
            _optional(options, "continuous_usage_stats", _bool) or False)


def _budget(body: dict, kind: str, defaults: Defaults) -> tuple[int, str | None]:
    """The budget of new tokens, and the field that gave it (None: the server's default)."""
    given = {name: _optional(body, name, _int) for name in ("max_tokens", "max_completion_tokens")}
    values = {v for v in given.values() if v is not None}
    if len(values) > 1:
        raise bad("max_tokens and max_completion_tokens disagree: give one of them", param="max_tokens")
    if not values:
        return defaults.max_tokens, None
    budget = values.pop()
    name = "max_tokens" if given["max_tokens"] is not None else "max_completion_tokens"
    if budget < 1:
        raise bad(f"{name} must be at least 1, got {budget}", param=name)
    return budget, name


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad(f"stop must be a string or an array of strings, got {quoted(stop)}", param="stop")
    if len(stops) > MAX_STOPS:
        raise bad(f"stop takes at most {MAX_STOPS} sequences, got {len(stops)}", param="stop")
    if any(not s for s in stops):
        raise bad("a stop sequence must not be empty", param="stop")
    return tuple(stops)


def _sampling(body: dict, defaults: Defaults) -> Sampling:
    temperature = _optional(body, "temperature", _number)
    temperature = defaults.temperature if temperature is None else temperature
    if not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise bad(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {temperature:g}", param="temperature")
    if temperature < MIN_TEMPERATURE:
        temperature = 0.0  # greedy in all but name (arcpy.sampling)
    top_p = _optional(body, "top_p", _number)
    top_p = defaults.top_p if top_p is None else top_p
    if not 0.0 < top_p <= 1.0:
        raise bad(f"top_p must be in (0, 1], got {top_p:g}", param="top_p")
    top_k = _optional(body, "top_k", _int)
    top_k = defaults.top_k if top_k is None else top_k
    if top_k == -1:
        top_k = 0  # -1 is "off" in other servers' dialect
    if top_k < 0:
        raise bad(f"top_k must be 0 (off) or a positive integer, got {top_k}", param="top_k")
    seed = _optional(body, "seed", _int)
    if seed is not None:
        if not -2**63 <= seed < 2**64:
            raise bad(f"seed must be a 64-bit integer, got {quoted(seed)}", param="seed")
        seed %= 2**64  # OpenAI's seeds are signed
    return Sampling(temperature, top_k, top_p, seed)


def messages_of(body: dict) -> dict:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages: required, a non-empty array of {\"role\", \"content\"} objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object with role and content, got {_kind(m)}", param=where)
        extra = sorted(set(m) - {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"})
        if extra:
            raise bad(f"{where}: unsupported field {quoted(extra[0])} (arcpy takes role, content, name, tool_calls, "
                      "tool_call_id and reasoning_content)", param=f"{where}.{extra[0]}")
        role = m.get("role")
        role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        if role not in ROLES:
            raise bad(f"{where}: unknown role {quoted(m.get('role'))} (known: {', '.join(ROLES)}, developer)",
                      param=f"{where}.role")
        message = {"role": role}
        if m.get("tool_calls") is not None and role != "assistant":
            raise bad(f"{where}: only an assistant's message has tool_calls", param=f"{where}.tool_calls")
        if m.get("reasoning_content") is not None:
            if role != "assistant":
                raise bad(f"{where}: only an assistant's message has reasoning_content",
                          param=f"{where}.reasoning_content")
            if not isinstance(m["reasoning_content"], str):
                raise bad(f"{where}.reasoning_content must be a string, got {_kind(m['reasoning_content'])}",
                          param=f"{where}.reasoning_content")
            message["reasoning_content"] = m["reasoning_content"]
        if role == "assistant" and m.get("tool_calls") is not None:
            message["tool_calls"] = m["tool_calls"]
            message["content"] = "" if m.get("content") is None else _content(m.get("content"), where)
        else:
            message["content"] = _content(m.get("content"), where)
        if role == "tool":  # a user's or system's name is OpenAI's participant name: not for the template
            message.update({k: m[k] for k in ("tool_call_id", "name") if m.get(k) is not None})
        elif m.get("tool_call_id") is not None:
            raise bad(f"{where}: only a tool message has tool_call_id", param=f"{where}.tool_call_id")
        out.append(message)
    return {"messages": out}


def _agent(body: dict) -> dict:
    """tools, tool_choice and response_format as Request takes them (it checks them); `grammar`
    becomes a response_format of its own kind."""
    names = ("tools", "tool_choice", "response_format", "parallel_tool_calls")
    out = {name: body[name] for name in names if body.get(name) is not None}
    grammar = body.get("grammar")
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise bad("grammar must be a non-empty string (GBNF)", param="grammar")
        if "response_format" in out:
            raise bad("grammar and response_format both constrain the answer: give one of them", param="grammar")
        out["response_format"] = {"type": "grammar", "grammar": grammar}
    return out


def template_kwargs_of(body: dict, defaults: Defaults) -> dict:
    """chat_template_kwargs over reasoning_effort over the server's own, checked."""
    given = body.get("chat_template_kwargs")
    if given is not None and not isinstance(given, dict):
        raise bad(f"chat_template_kwargs must be an object, got {_kind(given)}", param="chat_template_kwargs")
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise bad(f"reasoning_effort must be one of {', '.join(EFFORTS)}, got {quoted(effort)}",
                  param="reasoning_effort")
    effort = {} if effort is None else {"reasoning_effort": effort}
    try:
        return check_template_kwargs({**defaults.template_kwargs, **effort, **(given or {})}, "chat_template_kwargs")
    except ArcError as exc:
        raise bad(str(exc), param="chat_template_kwargs") from None


def _content(content, where: str) -> str:
    """A message's text: a string, or an array of text parts, joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else None
                raise bad(f"{where}.content[{j}]: only text parts are supported"
                          + (f", got type {quoted(kind)}" if kind is not None else ""), param=f"{where}.content")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"{where}.content must be a string or an array of text parts, got {_kind(content)}",
              param=f"{where}.content")


def _prompt(body: dict) -> dict:
    """A completion's prompt: a string, or token ids; a one-item array of either."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt is empty", param="prompt")
        return {"prompt": prompt}
    if isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        if any(t < 0 for t in prompt):
            raise bad("prompt: a token id must be >= 0", param="prompt")
        return {"prompt_ids": prompt}
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise bad(f"prompt holds {len(prompt)} prompts: arcpy answers one prompt per request", param="prompt")
    raise bad("prompt: required, a string or an array of token ids" if prompt is None or prompt == []
              else f"prompt must be a string or an array of token ids, got {quoted(prompt)}", param="prompt")
