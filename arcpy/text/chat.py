"""Chat messages -> prompt text, through the model's Jinja chat template.

The template runs in arcpy.text.sandbox: jinja2's immutable sandbox, bounded in time and in what it
builds. It sees the names Hugging Face templates use: messages, add_generation_prompt, bos_token
and eos_token (where the model has them), and the request's template keyword arguments
(`template_kwargs`, e.g. Qwen3's enable_thinking=False): names of JSON values, none of them one
that arcpy sets or that the sandbox defines.

`chat_ids` is the prompt to decode: the template's markup becomes the model's control tokens, and
the text the messages carry (and the strings of the keyword arguments and tools) stays text,
whatever it holds (arcpy.text.specials); the messages' keys and roles and the arguments' names
are the template's structure, read as the template reads them. `render_chat` is the same prompt as text, to show.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from arcpy.checks import is_int, quoted
from arcpy.errors import InvalidArgumentError
from arcpy.text.codec import led_by_bos
from arcpy.text.sandbox import GLOBALS, render_template
from arcpy.text.spec import TextSpec
from arcpy.text.specials import Marks
from arcpy.text.tools import check_tool_calls, check_tools, for_template

__all__ = ["chat_ids", "check_template_kwargs", "render_chat"]

SET_BY_ARCPY = ("messages", "add_generation_prompt", "bos_token", "eos_token", "tools")  # what _context writes
MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")
MAX_KWARG_DEPTH = 16   # arrays and objects nested in a keyword argument, at most
MAX_KWARG_INT_BITS = 64


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidArgumentError("messages must be a non-empty list of {'role': str, 'content': str} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidArgumentError(f"messages[{i}] must be a dict with 'role' and 'content', "
                                       f"got {type(m).__name__}")
        extra = [k for k in m if k not in MESSAGE_KEYS]
        if extra:
            raise InvalidArgumentError(f"messages[{i}]: unsupported key {quoted(extra[0])} "
                                       "(a message has 'role' and 'content'; an assistant's may have 'tool_calls', "
                                       "a tool's 'tool_call_id' and 'name')")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise InvalidArgumentError(f"messages[{i}]: 'role' must be a non-empty string, got {quoted(role)}")
        if content is None and m.get("tool_calls"):
            content = ""  # an assistant's message of calls alone
        if not isinstance(content, str):
            raise InvalidArgumentError(f"messages[{i}]: 'content' must be a string, got {quoted(content)}")
        for key, text in (("role", role), ("content", content)):
            _check_unicode(text, f"messages[{i}]: '{key}'")
        message = {"role": role, "content": content}
        for key in ("tool_calls", "reasoning_content"):
            if m.get(key) is not None and role != "assistant":
                raise InvalidArgumentError(f"messages[{i}]: only an assistant's message has {key}")
        if m.get("tool_calls") is not None:
            message["tool_calls"] = for_template(check_tool_calls(m["tool_calls"], f"messages[{i}]"))
        for key in ("tool_call_id", "name", "reasoning_content"):
            if m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise InvalidArgumentError(f"messages[{i}]: {quoted(key)} must be a string")
                message[key] = m[key]
        if "reasoning_content" in message:  # Qwen3's templates read reasoning_content, gpt-oss's thinking
            message["thinking"] = message["reasoning_content"]
        out.append(_json(message, f"messages[{i}]", 1))
    return out


def check_template_kwargs(value, what: str = "template_kwargs") -> dict:
    """`value` (None, or a mapping of names to JSON values: null, booleans, numbers, strings,
    arrays, objects) checked and copied, as the template's keyword arguments. A name that arcpy
    sets itself (SET_BY_ARCPY) or that the sandbox defines (raise_exception, namespace, ...) is
    refused, as is anything that is not JSON. `what` names the argument in errors."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{what} must be an object of names to JSON values, got {_kind(value)}")
    out = {}
    for name, v in value.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"{what}: a name must be a non-empty string, got {quoted(name)}")
        _check_unicode(name, f"{what}: the name {quoted(name)}")
        if name in SET_BY_ARCPY:
            raise InvalidArgumentError(f"{what}: {quoted(name)} cannot be given: arcpy sets it for the template "
                                       f"itself (from the messages and the model)")
        if name in GLOBALS:
            raise InvalidArgumentError(f"{what}: {quoted(name)} cannot be given: it is a function the template "
                                       "sandbox provides")
        out[name] = _json(v, f"{what}: {name}", 1)
    return out


def _json(value, where: str, depth: int):
    """A copy of `value`, a JSON value (arrays as lists), or one error line naming where it fails."""
    if value is None or isinstance(value, bool):
        return value
    if is_int(value):
        if int(value).bit_length() > MAX_KWARG_INT_BITS:
            raise InvalidArgumentError(f"{where}: the integer is too large (at most {MAX_KWARG_INT_BITS} bits)")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgumentError(f"{where}: the number must be finite, got {quoted(value)}")
        return value
    if isinstance(value, str):
        _check_unicode(value, where)
        return value
    if not isinstance(value, (list, tuple, Mapping)):
        raise InvalidArgumentError(f"{where} must be a JSON value (null, true/false, a number, a string, an array "
                                   f"or an object), got {_kind(value)}")
    if depth >= MAX_KWARG_DEPTH:
        raise InvalidArgumentError(f"{where}: arrays and objects are nested more than {MAX_KWARG_DEPTH} deep")
    if not isinstance(value, Mapping):
        return [_json(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    out = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise InvalidArgumentError(f"{where}: an object's keys must be strings, got {quoted(k)}")
        _check_unicode(k, f"{where}: the key {quoted(k)}")
        out[k] = _json(v, f"{where}.{k}", depth + 1)
    return out


def _check_unicode(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate: no tokenizer takes it
        raise InvalidArgumentError(f"{what} is not valid Unicode ({e.reason} at index {e.start})") from None


def _kind(value) -> str:
    return {dict: "an object", list: "an array", str: "a string"}.get(type(value), type(value).__name__)


def _strings(value):
    """Every string in a JSON value, the keys of its objects too."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _marked(marks: Marks, value, keys: bool = True):
    """A JSON value with each of its strings marked (its special-token strings stay text), and
    its objects' keys too where `keys` (data, as a call's arguments are; not a record's fields)."""
    if isinstance(value, str):
        return marks.mark(value)
    if isinstance(value, dict):
        return {(marks.mark(k) if keys else k): _marked(marks, v, keys) for k, v in value.items()}
    if isinstance(value, list):
        return [_marked(marks, v, keys) for v in value]
    return value


def _marked_message(marks: Marks, message: dict) -> dict:
    """A message with the text it carries marked: its content, name and tool_call_id, its calls'
    ids, names and arguments. Its keys and its role are the template's structure (a template
    compares message.role == 'user'): they stay as the template reads them."""
    out = {}
    for key, value in message.items():
        if key == "role":
            out[key] = value
        elif key == "tool_calls":
            out[key] = [{"id": marks.mark(call["id"]), "type": call["type"],
                         "function": {"name": marks.mark(call["function"]["name"]),
                                      "arguments": _marked(marks, call["function"]["arguments"])}}
                        for call in value]  # the shape check_tool_calls gives
        else:
            out[key] = _marked(marks, value)
    return out


def render_chat(spec: TextSpec, messages, add_generation_prompt: bool = True, template_kwargs=None,
                tools=None) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]; an assistant's may
    carry OpenAI's `tool_calls` and the `reasoning_content` of its answer (the template sees it as
    `thinking` too), a tool's `tool_call_id`) by the model's chat template, ending with
    the assistant's header when `add_generation_prompt`; `template_kwargs` are more names for the
    template (check_template_kwargs); `tools` (OpenAI's function tools, arcpy.text.tools) are the
    template's `tools`, where given. To show: the ids to decode are `chat_ids`."""
    return render_template(spec.chat_template, _context(spec, messages, add_generation_prompt, template_kwargs,
                                                        tools))


def chat_ids(spec: TextSpec, messages, add_generation_prompt: bool = True, template_kwargs=None,
             tools=None) -> list[int]:
    """The prompt's token ids for `messages`, led by BOS where the model wants it and the template
    wrote none. The template's markup becomes control tokens; a special-token string inside a
    message ('<|im_start|>' typed by a user) or inside a string of `template_kwargs` is encoded
    as the characters it is, as though the tokenizer did not know it. Messages and arguments
    without one give exactly encode(spec, render_chat(...), parse_special=True)."""
    context = _context(spec, messages, add_generation_prompt, template_kwargs, tools)
    kwargs = {k: v for k, v in context.items() if k not in SET_BY_ARCPY or k == "tools"}
    given = [context.get("bos_token") or "", context.get("eos_token") or ""]
    given += list(_strings(context["messages"])) + list(_strings(kwargs))
    marks = Marks(spec.tokenizer, [spec.chat_template, *given])
    context["messages"] = [_marked_message(marks, m) for m in context["messages"]]
    # Names are the template's; their values are the caller's text (a tool's too, but not its fields).
    context.update({name: _marked(marks, value, keys=name != "tools") for name, value in kwargs.items()})
    ids = marks.encode(render_template(spec.chat_template, context))
    return led_by_bos(spec, ids, spec.add_bos)


def _context(spec: TextSpec, messages, add_generation_prompt, template_kwargs, tools=None) -> dict:
    """What the template sees."""
    if spec.chat_template is None:
        raise InvalidArgumentError("this model has no chat template: give it a plain-text prompt")
    if not isinstance(add_generation_prompt, bool):
        raise InvalidArgumentError(f"add_generation_prompt must be True or False, got {quoted(add_generation_prompt)}")
    context = check_template_kwargs(template_kwargs)
    context.update(messages=_check_messages(messages), add_generation_prompt=add_generation_prompt)
    if tools:  # left undefined without: templates test `tools is defined`
        context["tools"] = _json(check_tools(tools), "tools", 1)
    # A token the model lacks stays undefined, as in transformers: `bos_token is defined` holds.
    if spec.bos_id is not None:
        context["bos_token"] = spec.token_text(spec.bos_id)
    if spec.eos_ids:
        context["eos_token"] = spec.token_text(spec.eos_ids[0])
    return context
