"""Tools for the chat template, and how each family writes a call to one.

OpenAI's `tools` ([{"type": "function", "function": {"name", "description", "parameters"}}]) go to
the template as the list they are, as Hugging Face templates receive them; `tool_choice` is
"none" (the template sees no tools), "auto", "required" or one function by name. A model writes
its calls in its family's format, which the template's markup names:

    HERMES   Qwen2.5, Qwen3, Hermes:  <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    MISTRAL  Mistral:                 [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
                                      or [TOOL_CALLS]name[ARGS]{...} (Mistral Small 3.2 and later)
    JSON     Llama 3.x, and a template that names none of these: the answer is one JSON object
             {"name": ..., "parameters" (or "arguments"): {...}}, calls apart by ";"
    HARMONY  gpt-oss: a message of its own to the function, its arguments the message
             (<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>;
             arcpy.text.harmony)
    GEMMA4   Gemma 4: <|tool_call>call:NAME{key:<|"|>text<|"|>,...}<tool_call|> (arcpy.text.gemma4)
    XML      Qwen3.5, Qwen3.6, Qwen3-Coder, Nemotron 3 Nano:
             <tool_call>\n<function=NAME>\n<parameter=KEY>\nvalue\n</parameter>\n...</function>\n</tool_call>,
             a value typed by the tool's schema (arcpy.text.xml_calls)

`call_grammar` is the grammar (arcpy.text.grammar, Lark) that makes "required" or a named function
certain: the answer is a call in the family's format, its arguments valid by the function's
parameters schema.
"""

from __future__ import annotations

import json
import re
import secrets
import string

from arcpy.checks import quoted
from arcpy.errors import InvalidArgumentError
from arcpy.text import gemma4, harmony, xml_calls

HERMES, MISTRAL, JSON, HARMONY, GEMMA4, XML = "hermes", "mistral", "json", "harmony", "gemma4", "xml"
NONE, AUTO, REQUIRED = "none", "auto", "required"
MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}\Z")
_ALNUM = string.ascii_letters + string.digits


def tool_format(chat_template: str | None) -> str:
    """The call format a chat template's markup names."""
    t = chat_template or ""
    if harmony.is_harmony(t):
        return HARMONY
    if gemma4.is_gemma4(t):
        return GEMMA4
    if xml_calls.is_xml(t):
        return XML
    if "<tool_call>" in t:
        return HERMES
    if "[TOOL_CALLS]" in t:
        return MISTRAL
    return JSON


def call_id(fmt: str) -> str:
    """A fresh id for a call: nine letters and digits for Mistral (its templates refuse others),
    call_ and 24 hex digits elsewhere."""
    if fmt == MISTRAL:
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return "call_" + secrets.token_hex(12)


def check_tools(tools) -> list[dict]:
    """OpenAI's tools, checked: a list of {"type": "function", "function": {"name", ...}}."""
    if tools is None:
        return []
    if not isinstance(tools, (list, tuple)):
        raise InvalidArgumentError(f"tools must be an array of function tools, got {quoted(tools)}")
    if len(tools) > MAX_TOOLS:
        raise InvalidArgumentError(f"tools holds {len(tools)} tools; at most {MAX_TOOLS}")
    out, names = [], set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise InvalidArgumentError(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}")
        extra = sorted(set(t) - {"type", "function"})
        if extra:
            raise InvalidArgumentError(f"{where}: unsupported field {quoted(extra[0])}")
        f = t["function"]
        unknown = sorted(set(f) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise InvalidArgumentError(f"{where}.function: unsupported field {quoted(unknown[0])}")
        name = f.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidArgumentError(f"{where}.function.name must be 1 to 64 letters, digits, '_', '.' or '-', "
                                       f"got {quoted(name)}")
        if name in names:
            raise InvalidArgumentError(f"{where}: the function {quoted(name)} is listed twice")
        names.add(name)
        if "description" in f and not isinstance(f["description"], str):
            raise InvalidArgumentError(f"{where}.function.description must be a string")
        if "parameters" in f and not isinstance(f["parameters"], dict):
            raise InvalidArgumentError(f"{where}.function.parameters must be a JSON schema object")
        if "strict" in f and not isinstance(f["strict"], (bool, type(None))):
            raise InvalidArgumentError(f"{where}.function.strict must be true or false")
        out.append({"type": "function", "function": dict(f)})
    return out


def check_tool_choice(choice, tools: list[dict]) -> str:
    """tool_choice -> NONE, AUTO, REQUIRED, or the name of the function it names. Without tools
    only "none" (or nothing) is taken."""
    if choice is None:
        return AUTO if tools else NONE
    if choice in (NONE, AUTO, REQUIRED):
        if choice != NONE and not tools:
            raise InvalidArgumentError(f"tool_choice {quoted(choice)} needs tools")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise InvalidArgumentError(f"tool_choice names the function {quoted(name)}, which tools do not list")
        return name
    raise InvalidArgumentError("tool_choice must be \"none\", \"auto\", \"required\" or "
                               f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {quoted(choice)}")


def check_tool_calls(calls, where: str) -> list[dict]:
    """An assistant message's tool_calls, checked, in OpenAI's shape (arguments a JSON string)."""
    if not isinstance(calls, (list, tuple)) or not calls:
        raise InvalidArgumentError(f"{where}.tool_calls must be a non-empty array of calls")
    out = []
    for j, c in enumerate(calls):
        w = f"{where}.tool_calls[{j}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or c.get("type", "function") != "function":
            raise InvalidArgumentError(f"{w} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                                       "\"arguments\"}}}}")
        if not isinstance(c.get("id"), str) or not isinstance(f.get("name"), str):
            raise InvalidArgumentError(f"{w}: id and function.name must be strings")
        args = f.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        out.append({"id": c["id"], "type": "function", "function": {"name": f["name"], "arguments": args}})
    return out


def for_template(calls: list[dict]) -> list[dict]:
    """Calls as templates take them: the arguments an object where they parse as JSON (Llama's
    and Mistral's templates write `arguments | tojson`), else the string."""
    out = []
    for c in calls:
        args = c["function"]["arguments"]
        try:
            args = json.loads(args)
        except ValueError:
            pass
        out.append({**c, "function": {"name": c["function"]["name"], "arguments": args}})
    return out


def parse_calls(fmt: str, text: str) -> list[tuple[str, str]] | None:
    """The calls in `text`, the body of one call's markup (HERMES: between the tags), or all that
    follows [TOOL_CALLS] (MISTRAL), or the answer (JSON): [(name, arguments as JSON text)], or
    None where it is not calls."""
    text = text.strip()
    if fmt == MISTRAL and not text.startswith("["):
        calls = []
        for part in text.split("[TOOL_CALLS]"):
            name, sep, args = part.partition("[ARGS]")
            one = _object(args) if sep else None
            if one is None or not _NAME.match(name.strip()):
                return None
            calls.append((name.strip(), json.dumps(one, ensure_ascii=False)))
        return calls
    try:
        value = json.loads(text)
        values = value if isinstance(value, list) else [value]
    except ValueError:
        if fmt != JSON:
            return None
        values = [_object(part) for part in text.split(";")]
    calls = []
    for v in values:
        if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not _NAME.match(v["name"]):
            return None
        args = v.get("arguments", v.get("parameters", {}))
        if isinstance(args, str):
            args = _object(args)
        if not isinstance(args, dict) or set(v) - {"name", "arguments", "parameters", "id"}:
            return None
        calls.append((v["name"], json.dumps(args, ensure_ascii=False)))
    return calls or None


def _object(text: str):
    try:
        v = json.loads(text)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


def call_grammar(fmt: str, tools: list[dict], choice: str, marks: dict[str, int] | None = None,
                 parallel: bool = True) -> str:
    """A Lark grammar (llguidance's dialect) whose answers are one call, or for REQUIRED one or
    more (one, unless `parallel`; HARMONY: one, a message holds one call), of the functions
    `choice` allows, in the format `fmt`. `marks` are the ids of the format's tags that are
    special tokens ([TOOL_CALLS], harmony's <|channel|> ...): each is written as that token."""
    marks = marks or {}

    def tag(text: str) -> str:
        return f"<[{marks[text]}]>" if text in marks else json.dumps(text)

    many = choice == REQUIRED and parallel
    chosen = [t["function"] for t in tools if choice == REQUIRED or t["function"]["name"] == choice]
    if fmt == HARMONY:
        return _harmony_call(chosen, tag)
    if fmt == XML:
        return _xml_calls(chosen, tag, many)
    key = "parameters" if fmt == JSON else "arguments"
    schemas = [{"type": "object", "additionalProperties": False, "required": ["name", key],
                "properties": {"name": {"const": f["name"]}, key: _parameters(f)}} for f in chosen]
    one = {"anyOf": schemas} if len(schemas) > 1 else schemas[0]
    one["x-guidance"] = _LAYOUT
    rules = f"call: %json {json.dumps(one)}\n"
    if fmt == HERMES:
        block, sep = '"<tool_call>\\n" call "\\n</tool_call>"', '"\\n"'
    elif fmt == GEMMA4:  # the arguments as JSON, which Gemma 4's call syntax reads too
        return _gemma4_calls(chosen, tag, many)
    elif fmt == MISTRAL:
        head = tag("[TOOL_CALLS]")
        body = 'call (", " call)*' if many else "call"
        return f'start: {head} "[" {body} "]"\n' + rules
    else:
        block, sep = "call", '"; "'
    return (f"start: {block} ({sep} {block})*\n" if many else f"start: {block}\n") + rules


def _harmony_call(chosen: list[dict], tag) -> str:
    """The answer's first message is a call of one of `chosen`, in the header the model writes
    (<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>), its body the arguments;
    the model's <|call|> (an end-of-sequence id) follows."""
    head = f"{tag(harmony.CHANNEL)} \"commentary to=functions.\""
    rules = []
    for k, f in enumerate(chosen):
        rules.append(f"call{k}: {head} {json.dumps(f['name'] + ' ')} {tag(harmony.CONSTRAIN)} \"json\" "
                     f"{tag(harmony.MESSAGE)} args{k}\n")
        rules.append(f"args{k}: %json {json.dumps({**_parameters(f), 'x-guidance': _LAYOUT})}\n")
    return "start: " + " | ".join(f"call{k}" for k in range(len(chosen))) + "\n" + "".join(rules)


def _gemma4_calls(chosen: list[dict], tag, many: bool) -> str:
    """One call (or, `many`, calls in a row) of `chosen`: <|tool_call>call:NAME{...}<tool_call|>,
    the arguments a JSON object (keys and strings quoted)."""
    rules = []
    for k, f in enumerate(chosen):
        rules.append(f"call{k}: {tag(gemma4.CALL_OPEN)} {json.dumps('call:' + f['name'])} args{k} "
                     f"{tag(gemma4.CALL_CLOSE)}\n")
        rules.append(f"args{k}: %json {json.dumps({**_parameters(f), 'x-guidance': _LAYOUT})}\n")
    call = "(" + " | ".join(f"call{k}" for k in range(len(chosen))) + ")"
    return f"start: {call}{'+' if many else ''}\n" + "".join(rules)


def _xml_calls(chosen: list[dict], tag, many: bool) -> str:
    """One call (or, `many`, calls a line apart) of `chosen` in XML's tags: the parameters in
    their schema's order, the required ones always there; a value read as text (xml_calls.is_text)
    one of its enum's strings or any text without </parameter> (as long as its schema allows),
    any other its schema's JSON."""
    rules, calls = [], []
    for k, f in enumerate(chosen):
        params = _parameters(f)
        props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
        required = set(params.get("required") or ())
        parts = []
        for j, (key, schema) in enumerate(props.items()):
            head = json.dumps(f"{xml_calls.PARAMETER}{key}>\n")
            tail = json.dumps(f"\n{xml_calls.PARAMETER_CLOSE}\n")
            enum = schema.get("enum") if isinstance(schema, dict) else None
            if not xml_calls.is_text(schema):
                rules.append(f"p{k}_{j}: {head} v{k}_{j} {tail}\n")
                rules.append(f"v{k}_{j}: %json {json.dumps({**schema, 'x-guidance': _LAYOUT})}\n")
            elif isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
                ends = " | ".join(json.dumps(f"{v}\n{xml_calls.PARAMETER_CLOSE}\n") for v in enum)
                rules.append(f"p{k}_{j}: {head} ({ends})\n")
            else:
                rules.append(f"p{k}_{j}: {head} T{k}_{j}\n")
                rules.append(f"T{k}_{j}: {_text_value(schema)}\n")
            parts.append(f"p{k}_{j}" + ("" if key in required else "?"))
        name = json.dumps(f"\n{xml_calls.FUNCTION}{f['name']}>\n")
        close = json.dumps(f"{xml_calls.FUNCTION_CLOSE}\n")
        rules.append(f"call{k}: {tag(xml_calls.CALL_OPEN)} {name} {' '.join(parts)} {close} "
                     f"{tag(xml_calls.CALL_CLOSE)}\n")
        calls.append(f"call{k}")
    call = "(" + " | ".join(calls) + ")"
    start = f'start: {call} ("\\n" {call})*\n' if many else f"start: {call}\n"
    return start + "".join(rules)


def _text_value(schema) -> str:
    """A text value and its closing tag as one lexeme, which ends at the first closing tag: its
    text as long as the schema's minLength and maxLength allow, </parameter> nowhere in it."""
    schema = schema if isinstance(schema, dict) else {}
    low, high = schema.get("minLength"), schema.get("maxLength")
    low = low if isinstance(low, int) and not isinstance(low, bool) and low > 0 else 0
    high = high if isinstance(high, int) and not isinstance(high, bool) and high >= low else None
    count = "*" if not low and high is None else f"{{{low},{'' if high is None else high}}}"
    return f"/(?s:.){count}\\n<\\/parameter>\\n/ & ~/(?s:.)*<\\/parameter>(?s:.)(?s:.)+/"


_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _parameters(f: dict) -> dict:
    p = f.get("parameters") or {"type": "object", "properties": {}}
    return p
