"""Qwen3.5's tool calls (Qwen3.6's, Qwen3-Coder's, Nemotron 3 Nano's): each function and argument in a tag.

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

A call may follow another (a line apart). A value is text, as many lines as it takes, with a line
break after its tag and before the closing one; the template writes an array or an object as its
JSON, any other value as its text (Python's: True, False and None for a boolean and null). So a
value's type is the tool's: where the parameter's schema allows no string, the value is read as
JSON (a number, a boolean, an array...), else it is the text as written. The tools' results come
back as <tool_response>...</tool_response> in a user turn, which the template writes.
"""

from __future__ import annotations

import json
import re

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER, PARAMETER_CLOSE = "<parameter=", "</parameter>"
_FUNCTION = re.compile(r"<function=([A-Za-z0-9_.\-]{1,64})>")
_PARAMETER = re.compile(r"<parameter=([^>\n]{1,256})>")
_PYTHON_WORDS = {"True": True, "False": False, "None": None}  # a template's `value | string`


def is_xml(chat_template: str | None) -> bool:
    """Whether a chat template writes calls in this format."""
    t = chat_template or ""
    return CALL_OPEN in t and FUNCTION in t and PARAMETER in t


def parameters(tools) -> dict[str, dict]:
    """Each tool's name -> its parameters' schemas (name -> schema), from OpenAI's tools."""
    out = {}
    for t in tools or ():
        f = t.get("function") or {}
        props = (f.get("parameters") or {}).get("properties")
        out[f.get("name")] = props if isinstance(props, dict) else {}
    return out


def parse_call(body: str, params: dict[str, dict] | None = None) -> tuple[str, str] | None:
    """One call's (name, arguments as JSON text) from the body between <tool_call> and
    </tool_call>, its values typed by `params` (parameters(tools)), or None where it is not one."""
    text = body.strip()
    m = _FUNCTION.match(text)
    if m is None:
        return None
    schemas = (params or {}).get(m.group(1), {})
    at, args = m.end(), {}
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if text.startswith(FUNCTION_CLOSE, at):
            at += len(FUNCTION_CLOSE)
            break
        p = _PARAMETER.match(text, at)
        if p is None:
            return None
        end = text.find(PARAMETER_CLOSE, p.end())
        if end < 0:
            return None
        key = p.group(1).strip()
        args[key] = typed(_unwrapped(text[p.end():end]), schemas.get(key))
        at = end + len(PARAMETER_CLOSE)
    if text[at:].strip():
        return None
    return m.group(1), json.dumps(args, ensure_ascii=False)


def _unwrapped(value: str) -> str:
    """A value less the line break after its tag and the one before its closing tag."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def typed(value: str, schema) -> object:
    """A value's text as the parameter's type: JSON where its schema allows no string (and the
    text parses), else the text."""
    if is_text(schema):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return _PYTHON_WORDS.get(value.strip(), value)


def is_text(schema) -> bool:
    """Whether a parameter's value is read as text: its schema allows a string, or says nothing
    of its type."""
    types = _types(schema)
    return not types or "string" in types


def _types(schema) -> set[str]:
    """The JSON types a schema allows, as far as its type, enum, const, anyOf and oneOf tell;
    empty where they tell nothing."""
    if not isinstance(schema, dict):
        return set()
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    if "enum" in schema or "const" in schema:
        values = schema.get("enum") if isinstance(schema.get("enum"), list) else [schema.get("const")]
        return {_json_type(v) for v in values}
    out = set()
    for key in ("anyOf", "oneOf"):
        for part in schema.get(key) or ():
            types = _types(part)
            if not types:
                return set()
            out |= types
    return out


def _json_type(value) -> str:
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if value is None:
        return "null"
    return "array" if isinstance(value, list) else "object"
