"""Qwen3.5's chat text (arcpy.text.xml_calls): its XML tool calls, typed by the tools' schemas, and
its reasoning, which the prompt opens unless enable_thinking is false. Under a small template of
this file's that writes the same constructs, and under llama.cpp's copy of Qwen3.5's own
(tests/llamacpp_sdist.py) on llama.cpp's Qwen3.5 vocabulary, as jinja2 renders it: a call's
arguments read back as the template wrote them; through the server and the `openai` client, a
call and its reasoning read from a typed answer, whole and streamed, its result sent back through
the template, and a required or named call forced by the grammar; in `arcpy chat`, a call and
enable_thinking. The splitter's cases at every split point are in test_answer."""

from __future__ import annotations

import dataclasses
import io
import json
import re

import jsonschema
import pytest
from agent_helpers import family_text, typist_engine, typist_server
from llamacpp_sdist import llamacpp_models
from serve_helpers import client_of
from test_agents_serve import reassembled
from test_chat_families import jinja2_render, read_spec
from test_harmony import render_messages

from arcpy.errors import InvalidArgumentError
from arcpy.loop.constrain import vocabulary
from arcpy.terminal_chat import Conversation, converse
from arcpy.text import chat_ids, encode, render_chat
from arcpy.text.answer import split, split_options, thinks
from arcpy.text.grammar import LARK, Grammar
from arcpy.text.tools import XML, call_grammar, tool_format
from arcpy.text.xml_calls import is_text, parameters, parse_call, typed

# The constructs of Qwen3.5's template, written anew: the tools as JSON in the system turn, the
# reasoning of a turn of calls, each call's arguments one <parameter=...> apiece (arrays and objects
# as JSON, other values as their text), the results in a user turn, the generation prompt opening
# <think> unless enable_thinking is false.
TEMPLATE = """
{%- if tools %}{{- '<|im_start|>system\\nFunctions:\\n' }}
{%- for t in tools %}{{- t | tojson }}{{- '\\n' }}{%- endfor %}
{{- 'Call one as <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>' }}
{{- '<|im_end|>\\n' }}{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if m.reasoning_content %}{{- '<think>\\n' + m.reasoning_content | trim + '\\n</think>\\n\\n' }}{%- endif %}
{%- if m.content | trim %}{{- m.content | trim + ('\\n\\n' if m.tool_calls else '') }}{%- endif %}
{%- for c in m.tool_calls or [] %}
{{- ('' if loop.first else '\\n') + '<tool_call>\\n<function=' + c.function.name + '>\\n' }}
{%- for key, value in c.function.arguments | items %}
{{- '<parameter=' + key + '>\\n' }}
{%- if value is mapping or (value is sequence and value is not string) %}{{- value | tojson }}
{%- else %}{{- value | string }}{%- endif %}
{{- '\\n</parameter>\\n' }}
{%- endfor %}
{{- '</function>\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif m.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}
{%- else %}{{- '<think>\\n' }}{%- endif %}
{%- endif %}
"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "ratio": {"type": "number"},
        "metric": {"type": "boolean"}, "hours": {"type": "array", "items": {"type": "integer"}},
        "where": {"type": "object"}, "note": {"type": ["string", "null"]}, "code": {"type": "string"},
        "nothing": {"type": "null"}, "either": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}}}}}
ARGUMENTS = {"city": "Paris,\n{France}", "days": 2, "ratio": -1.5e3, "metric": False, "hours": [6, 12],
             "where": {"lat": 48.9, "tags": ["a", None]}, "note": "null", "code": "42", "nothing": None,
             "either": True}
CALLED = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)}}
FLOW = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need the weather.", "tool_calls": [CALLED, CALLED]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temperature": 18}'},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temperature": 19}'}]


@pytest.fixture(scope="module")
def qwen35():
    """llama.cpp's Qwen3.5 vocabulary under its copy of Qwen3.5's chat template."""
    models = llamacpp_models()
    spec = read_spec(models / "ggml-vocab-qwen35.gguf")
    return dataclasses.replace(spec, chat_template=(models / "templates" / "Qwen3.5-4B.jinja").read_text(
        encoding="utf-8"))


@pytest.fixture(params=["own", "qwen3.5"])
def spec(request):
    return family_text(TEMPLATE) if request.param == "own" else request.getfixturevalue("qwen35")


def calls_written(text: str) -> list[str]:
    """The bodies of the calls in the assistant's turns of a rendered prompt."""
    turns = re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", text, re.S)
    return [body for turn in turns for body in re.findall("<tool_call>(.*?)</tool_call>", turn, re.S)]


def test_the_format_and_the_reasoning_come_from_the_template(spec):
    assert tool_format(spec.chat_template) == XML and thinks(spec)
    thinking = render_chat(spec, FLOW[:2], tools=[WEATHER])
    assert thinking.endswith("<|im_start|>assistant\n<think>\n")
    options = split_options(spec, chat_ids(spec, FLOW[:2], tools=[WEATHER]), [WEATHER])
    assert options["reasoning"] and options["opened"] and options["tools"] == XML
    assert options["params"] == parameters([WEATHER]) and options["params"]["get_weather"]["days"] == {
        "type": "integer"}
    off = {"enable_thinking": False}
    assert render_chat(spec, FLOW[:2], tools=[WEATHER], template_kwargs=off).endswith("<think>\n\n</think>\n\n")
    options = split_options(spec, chat_ids(spec, FLOW[:2], tools=[WEATHER], template_kwargs=off), [WEATHER])
    assert options["reasoning"] and not options["opened"]
    assert split_options(spec, chat_ids(spec, FLOW[:2]), None)["tools"] is None


def test_a_calls_arguments_read_back_typed_as_the_template_wrote_them(spec):
    text = render_chat(spec, FLOW, tools=[WEATHER])
    assert text == jinja2_render(spec.chat_template, spec, render_messages(FLOW), tools=[WEATHER])
    assert "\n<tool_response>\n{\"temperature\": 18}\n</tool_response>" in text
    assert "<think>\nNeed the weather.\n</think>\n\n" in text
    bodies = calls_written(text)
    assert len(bodies) == 2 and "<parameter=metric>\nFalse\n</parameter>" in bodies[0]  # Python's text
    for body in bodies:
        name, arguments = parse_call(body, parameters([WEATHER]))
        assert name == "get_weather" and json.loads(arguments) == ARGUMENTS
        # Without the tool's schema every value is the text as written.
        untyped = json.loads(parse_call(body)[1])
        assert untyped["days"] == "2" and untyped["metric"] == "False" and untyped["city"] == ARGUMENTS["city"]


def test_call_syntax_and_what_is_not_a_call():
    params = parameters([WEATHER])
    assert parse_call("<function=f>\n</function>") == ("f", "{}")
    assert parse_call("\n<function=f>\n<parameter=a>\n  two\nlines \n\n</parameter>\n</function>\n") == (
        "f", '{"a": "  two\\nlines \\n"}')
    assert parse_call("<function=f><parameter=a>x</parameter><parameter=b>\n</parameter></function>") == (
        "f", '{"a": "x", "b": ""}')
    assert parse_call("<function=get_weather>\n<parameter=days>\nsoon\n</parameter>\n</function>", params) == (
        "get_weather", '{"days": "soon"}')  # not the schema's type: the text, as written
    for text in ("<function=f>", "<function=f>\n<parameter=a>\nx\n</function>", "function=f></function>",
                 "<function=bad name>\n</function>", "<function=f>\n</function>\nafter",
                 "<function=f>\ntext\n</function>",
                 "{\"name\": \"f\", \"arguments\": {}}", "<function=f>\n<parameter=>\nx\n</parameter>\n</function>"):
        assert parse_call(text, params) is None, text


def test_a_value_is_json_only_where_its_schema_allows_no_string():
    assert typed("3", {"type": "integer"}) == 3 and typed("3", {"type": "string"}) == "3" and typed("3", None) == "3"
    assert typed("True", {"type": "boolean"}) is True and typed("None", {"type": ["null", "object"]}) is None
    assert typed('{"a": 1}', {"type": "object"}) == {"a": 1} and typed("[1]", {}) == "[1]"
    assert typed("2", {"enum": [1, 2]}) == 2 and typed("2", {"enum": ["1", "2"]}) == "2"
    assert typed("2", {"anyOf": [{"type": "integer"}, {"type": "string"}]}) == "2"
    assert typed("2", {"oneOf": [{"type": "integer"}, {}]}) == "2"  # a branch that says nothing: text
    assert typed("x", {"type": "integer"}) == "x"
    assert is_text({"const": "a"}) and not is_text({"const": 1}) and is_text({"type": ["integer", "string"]})


def xml_call(name: str, arguments: dict) -> str:
    """A call as the grammar writes it: text as it is, other values as compact JSON."""
    params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                     for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def accepts(grammar: Grammar, spec, text: str) -> bool:
    """Whether the grammar takes `text` (as the spec's tokens) as a whole answer."""
    matcher = grammar.matcher()
    try:
        for token in encode(spec, text, add_bos=False):
            matcher.consume(token)
    except InvalidArgumentError:
        return False
    return matcher.complete


def test_the_grammar_of_a_required_call_takes_the_calls_the_splitter_reads():
    spec = family_text(TEMPLATE)
    grammar = Grammar.compile(vocabulary(spec, spec.tokenizer.get_vocab_size()), LARK,
                              call_grammar(XML, [WEATHER, TIME], "required"))
    calls = [xml_call("get_weather", ARGUMENTS), xml_call("get_time", {"zone": "CET"}), xml_call("get_time", {})]
    text = "\n".join(calls)
    assert accepts(grammar, spec, text)
    answer = split(text, tools=XML, params=parameters([WEATHER, TIME]))
    assert [json.loads(c["function"]["arguments"]) for c in answer.tool_calls] == [ARGUMENTS, {"zone": "CET"}, {}]
    assert not answer.content
    for wrong in (text.replace("<parameter=days>\n2", "<parameter=days>\ntwo"),  # not an integer
                  xml_call("get_weather", {"days": 2}),                            # city is required
                  xml_call("get_weather", {"days": 2, "city": "Paris"}),           # out of the schema's order
                  xml_call("get_time", {"zone": "EST"}),                           # not in the enum
                  xml_call("get_weather", {"city": "a</parameter>b"}),             # the closing tag in a text
                  xml_call("get_weather", {"city": "Paris"}) + "Done."):
        assert not accepts(grammar, spec, wrong), wrong
    one = Grammar.compile(vocabulary(spec, spec.tokenizer.get_vocab_size()), LARK,
                          call_grammar(XML, [WEATHER, TIME], "get_time", parallel=False))
    assert accepts(one, spec, calls[1]) and not accepts(one, spec, calls[1] + "\n" + calls[2])
    assert not accepts(one, spec, calls[0])
    short = Grammar.compile(vocabulary(spec, spec.tokenizer.get_vocab_size()), LARK,
                            call_grammar(XML, [SHORT], "required"))
    assert accepts(short, spec, xml_call("get_weather", {"city": "x" * 12, "days": 7}))
    assert not accepts(short, spec, xml_call("get_weather", {"city": "x" * 13, "days": 7}))


# -- through the server -------------------------------------------------------------------------

THOUGHT = "The user wants the weather in Paris."
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
        "</parameter>\n<parameter=hours>\n[6, 12]\n</parameter>\n</function>\n</tool_call>")
FINAL = "It is 18 degrees."


def script(prompt: str) -> str:
    if "<tool_response>" in prompt.rpartition("<|im_start|>user")[2]:
        return f"It's warm.\n</think>\n\n{FINAL}"
    if "weather" in prompt.rpartition("<|im_start|>user")[2]:
        reasoning = "" if prompt.endswith("</think>\n\n") else f"{THOUGHT}\n</think>\n\n"
        return f"{reasoning}Let me check.\n\n{CALL}"
    return "A greeting.\n</think>\n\nHello there."


@pytest.fixture(scope="module", params=["own", "qwen3.5"])
def server(request):
    template = TEMPLATE if request.param == "own" else request.getfixturevalue("qwen35").chat_template
    s = typist_server(family_text(template), script)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return client_of(server)


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_round_trip_with_its_reasoning(client, server, stream):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(model="typist", tools=[WEATHER], max_tokens=300)
    if stream:
        got = reassembled(client.chat.completions.create(messages=messages, stream=True, **kw))
        (call,) = got["calls"].values()
        reasoning, content, finish, name, arguments, call_id = (got["reasoning"], got["content"], got["finish"],
                                                                call["name"], call["arguments"], call["id"])
        message = {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}
    else:
        choice = client.chat.completions.create(messages=messages, **kw).choices[0]
        (call,) = choice.message.tool_calls
        reasoning, content, finish, name, arguments, call_id = (choice.message.model_extra["reasoning_content"],
                                                                choice.message.content, choice.finish_reason,
                                                                call.function.name, call.function.arguments, call.id)
        message = choice.message.model_dump(exclude_none=True)
    assert finish == "tool_calls" and reasoning == THOUGHT + "\n" and content == "Let me check.\n\n"
    assert name == "get_weather" and json.loads(arguments) == {"city": "Paris", "days": 2, "hours": [6, 12]}
    assert call_id.startswith("call_")

    messages += [message, {"role": "tool", "tool_call_id": call_id, "content": '{"temperature": 18}'}]
    second = client.chat.completions.create(messages=messages, **kw).choices[0]
    assert second.finish_reason == "stop" and second.message.content == FINAL and not second.message.tool_calls
    assert second.message.model_extra["reasoning_content"] == "It's warm.\n"
    prompt = server.engine.device.prompts[-1]
    assert (f"<think>\n{THOUGHT}\n</think>\n\nLet me check.\n\n{CALL}<|im_end|>\n<|im_start|>user\n<tool_response>\n"
            '{"temperature": 18}\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n') in prompt


def test_enable_thinking_false_closes_the_reasoning(client, server):
    r = client.chat.completions.create(model="typist", tools=[WEATHER], max_tokens=300,
                                       messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    c = r.choices[0]
    assert server.engine.device.prompts[-1].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert c.finish_reason == "tool_calls" and not c.message.model_extra.get("reasoning_content")
    assert c.message.content == "Let me check.\n\n" and c.message.tool_calls[0].function.name == "get_weather"


SHORT = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city", "days"],
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                   "unit": {"enum": ["c", "f"]}}}}}  # a random string ends within the budget
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}}}}


@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_a_required_or_named_call_is_forced_into_the_xml_format(client, choice):
    tools = {"get_weather": SHORT, "get_time": TIME}
    named = {"type": "function", "function": {"name": choice}} if choice != "required" else choice
    for seed in range(4):
        r = client.chat.completions.create(model="typist", messages=[{"role": "user", "content": "Hi"}],
                                           tools=[SHORT, TIME], tool_choice=named, max_tokens=300, seed=seed)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and not c.message.content, c
        for call in c.message.tool_calls:
            assert call.function.name == choice or choice == "required"
            schema = tools[call.function.name]["function"]["parameters"]
            jsonschema.validate(json.loads(call.function.arguments), schema)


def test_the_terminal_chat_shows_a_call_and_passes_enable_thinking():
    engine = typist_engine(family_text(TEMPLATE), script)
    out, err = io.StringIO(), io.StringIO()
    conversation = Conversation(engine, template_kwargs={"enable_thinking": False}, tools=[WEATHER])
    lines = iter(["What is the weather in Paris?", '/tool {"temperature": 18}', "/exit"])
    assert converse(conversation, lambda prompt: next(lines), out=out, err=err) == 0, err.getvalue()
    assert '[tool call get_weather] {"city": "Paris", "days": 2, "hours": [6, 12]}' in out.getvalue()
    assert engine.device.prompts[0].endswith("<think>\n\n</think>\n\n")
    assert "<tool_response>\n{\"temperature\": 18}\n</tool_response>" in engine.device.prompts[-1]


@pytest.mark.parametrize("name", ["Qwen3.5-4B", "Qwen3-Coder", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
                                  "StepFun3.5-Flash"])
def test_the_other_xml_templates_calls_read_back_typed(name):
    """The templates in llama.cpp's copies that write the same calls (Qwen3-Coder's, Nemotron 3
    Nano's, Step 3.5 Flash's): their format is XML and their calls read back as written."""
    spec = family_text((llamacpp_models() / "templates" / f"{name}.jinja").read_text(encoding="utf-8"))
    assert tool_format(spec.chat_template) == XML
    text = render_chat(spec, FLOW, tools=[WEATHER])
    bodies = calls_written(text)
    assert len(bodies) == 2
    for body in bodies:
        assert parse_call(body, parameters([WEATHER])) == ("get_weather", json.dumps(ARGUMENTS, ensure_ascii=False))
