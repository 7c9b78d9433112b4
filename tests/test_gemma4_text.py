"""Gemma 4's chat template and its answers (arcpy.text.gemma4): the system turn with tools and
thinking, a call with its reasoning and the tool's result, rendered by llama.cpp's copy of Gemma 4's
template on llama.cpp's Gemma 4 vocabulary (tests/llamacpp_sdist.py) as jinja2 renders it; a call's
arguments read back from what the template writes; <turn|> and <|tool_response> end an answer;
and, through the server and the `openai` client, a call and reasoning read from a typed answer
and a required call forced by the grammar. The splitter's cases at every split point are in
test_answer."""

from __future__ import annotations

import dataclasses
import json
import re

import jsonschema
import pytest
from agent_helpers import family_text, typist_server
from llamacpp_sdist import llamacpp_models
from serve_helpers import client_of
from test_agents_serve import reassembled
from test_chat_families import jinja2_render, read_spec
from test_harmony import render_messages

from arcpy.text import chat_ids, render_chat
from arcpy.text.answer import reasoning_tags, split_options, thinks
from arcpy.text.gemma4 import CALL_CLOSE, CALL_OPEN, RESPONSE, THOUGHT_CLOSE, THOUGHT_OPEN, TURN_END, parse_call
from arcpy.text.tools import GEMMA4, tool_format

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city's name."},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
ARGUMENTS = {"city": "Paris, {France}", "days": 2, "ratio": -1.5e3, "flags": [True, False, None], "empty": "",
             "nested": {"a": [1, {"b": "x:y"}], "quote": 'say "hi"'}}
CALLED = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)}}
FLOW = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need the weather.", "tool_calls": [CALLED]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temperature": 18}'}]


@pytest.fixture(scope="module")
def gemma4():
    models = llamacpp_models()
    spec = read_spec(models / "ggml-vocab-gemma-4.gguf")
    return dataclasses.replace(spec, chat_template=(models / "templates" / "google-gemma-4-31B-it.jinja").read_text(
        encoding="utf-8"))


def test_the_format_reasoning_and_turn_ends_come_from_the_template_and_the_vocabulary(gemma4):
    assert tool_format(gemma4.chat_template) == GEMMA4 and thinks(gemma4)
    assert reasoning_tags(gemma4) == (THOUGHT_OPEN, THOUGHT_CLOSE)
    assert [gemma4.token_text(i) for i in gemma4.eos_ids] == ["<eos>", TURN_END, RESPONSE]


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": True}])
def test_the_system_turn_tools_a_call_and_its_result_render_as_jinja2_does(gemma4, kwargs):
    text = render_chat(gemma4, FLOW, tools=[WEATHER], template_kwargs=kwargs)
    assert text == jinja2_render(gemma4.chat_template, gemma4, render_messages(FLOW), tools=[WEATHER], **kwargs)
    think = "<|think|>\n" if kwargs else ""
    assert text.startswith(f"<bos><|turn>system\n{think}Be brief.<|tool>declaration:get_weather{{description:"
                           '<|"|>The weather now in a city.<|"|>,parameters:{properties:{city:{description:'
                           '<|"|>The city\'s name.<|"|>,type:<|"|>STRING<|"|>},unit:{enum:[<|"|>celsius<|"|>,'
                           '<|"|>fahrenheit<|"|>],type:<|"|>STRING<|"|>}},required:[<|"|>city<|"|>,<|"|>unit<|"|>],'
                           'type:<|"|>OBJECT<|"|>}}<tool|><turn|>\n')
    assert ("<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n<|channel>thought\nNeed the weather.\n<channel|>"
            "<|tool_call>call:get_weather{") in text
    assert text.endswith('<tool_call|><|tool_response>response:get_weather{value:<|"|>{"temperature": 18}<|"|>}'
                         "<tool_response|>")  # the answer goes on in the same turn
    ids = chat_ids(gemma4, FLOW, tools=[WEATHER], template_kwargs=kwargs)
    assert ids[0] == gemma4.bos_id and ids.count(gemma4.bos_id) == 1


def test_without_thinking_the_prompt_closes_an_empty_thought(gemma4):
    text = render_chat(gemma4, FLOW[:2])
    assert text == "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n" + (
        "<|channel>thought\n<channel|>")
    options = split_options(gemma4, chat_ids(gemma4, FLOW[:2]), tools=True)
    assert options["reasoning"] and not options["opened"] and options["tools"] == GEMMA4
    thinking = split_options(gemma4, chat_ids(gemma4, FLOW[:2], template_kwargs={"enable_thinking": True}), True)
    assert not thinking["opened"]  # the model opens its thought itself


def test_a_calls_arguments_read_back_as_the_template_wrote_them(gemma4):
    text = render_chat(gemma4, FLOW, tools=[WEATHER])
    (body,) = re.findall(re.escape(CALL_OPEN) + "(.*?)" + re.escape(CALL_CLOSE), text)
    name, arguments = parse_call(body)
    assert name == "get_weather" and json.loads(arguments) == ARGUMENTS


def test_call_syntax_and_what_is_not_a_call():
    assert parse_call('call:f{a:<|"|>x, y<|"|>,b:[1,2.5,-3],c:{d:true,e:None}}') == (
        "f", '{"a": "x, y", "b": [1, 2.5, -3], "c": {"d": true, "e": null}}')
    assert parse_call('call:f{"a": "x", "b": 1}') == ("f", '{"a": "x", "b": 1}')  # the grammar's JSON
    assert parse_call("call:f{}") == ("f", "{}")
    assert parse_call("call:f{a:bare words}") == ("f", '{"a": "bare words"}')
    for text in ("call:f", "call:f{a:1", 'call:f{a:<|"|>open}', "call:f{a}", "f{a:1}", "call:f{a:1}x", "call:f[1]",
                 "call:bad name{}", "call:f{a:1,}", "call:f{:1}"):
        assert parse_call(text) is None, text


# -- through the server -------------------------------------------------------------------------

REASONED_CALL = (f"{THOUGHT_OPEN}Weather, then.{THOUGHT_CLOSE}{CALL_OPEN}call:get_weather{{city:<|\"|>Paris<|\"|>,"
                 f"unit:<|\"|>celsius<|\"|>}}{CALL_CLOSE}")


def script(prompt: str) -> str:
    if "<|tool_response>response:" in prompt:
        return "It is 18 degrees."
    if "weather" in prompt.rpartition("<|turn>user")[2]:
        return REASONED_CALL
    return "Hello there."


@pytest.fixture(scope="module")
def client(gemma4):
    s = typist_server(family_text(gemma4.chat_template), script)
    yield client_of(s)
    s.stop()


def test_a_call_and_its_reasoning_come_back_whole_and_streamed(client):
    kw = dict(model="typist", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
              tools=[WEATHER], max_tokens=300, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    assert whole.message.model_extra["reasoning_content"] == "Weather, then."
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    streamed = reassembled(client.chat.completions.create(stream=True, **kw))
    assert streamed["finish"] == "tool_calls" and streamed["reasoning"] == "Weather, then." and not streamed["content"]
    assert [(c["name"], c["arguments"]) for c in streamed["calls"].values()] == [
        ("get_weather", call.function.arguments)]
    messages = [*kw["messages"], whole.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "18"}]
    second = client.chat.completions.create(**{**kw, "messages": messages}).choices[0]
    assert second.finish_reason == "stop" and second.message.content == "It is 18 degrees."


def test_a_required_call_is_forced_into_gemma4s_syntax(client):
    short = {"type": "function", "function": {**WEATHER["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}  # a random string ends within the budget
    for seed in range(3):
        r = client.chat.completions.create(model="typist", messages=[{"role": "user", "content": "Hi"}], tools=[short],
                                           tool_choice="required", max_tokens=300, seed=seed)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        (call,) = c.message.tool_calls
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), short["function"]["parameters"])
