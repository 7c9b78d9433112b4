"""Agents against `arcpy serve`, through the `openai` client: the tool flow end to end (tools sent,
a call returned, its result sent back, the final answer), tool calls and reasoning streamed as
deltas that add up to the whole answer, JSON-schema answers, and the 400s of bad schemas and
tools. The model is the Typist (agent_helpers): it types what the test scripts, under Qwen2.5's
own chat template (llama.cpp's copy, tests/llamacpp_sdist.py), whose tool markup it reads."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from agent_helpers import family_text, typist_server
from llamacpp_sdist import llamacpp_models
from serve_helpers import client_of

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
FINAL = "It is 18 degrees in Paris."


def script(prompt: str) -> str:
    if "<tool_response>" in prompt:  # the tool's result came back: answer
        return FINAL
    if "reason first" in prompt:
        return "<think>\nThe user wants weather.\n</think>\n\nLet me look.\n" + CALL
    if "in JSON" in prompt:
        return '{"name": "Ada", "age": 36}'
    if "get_weather" in prompt:
        return CALL
    return "Hello there."


@pytest.fixture(scope="module")
def qwen_template():
    return (llamacpp_models() / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()


@pytest.fixture(scope="module")
def server(qwen_template):
    s = typist_server(family_text(qwen_template), script)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return client_of(server)


@pytest.fixture(scope="module")
def qwen3():
    """A server under Qwen3's template (reasoning tags and Hermes calls), and its client."""
    s = typist_server(family_text((llamacpp_models() / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text()), script)
    yield s, client_of(s)
    s.stop()


def test_the_openai_tool_flow_end_to_end(client, server):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model="typist", messages=messages, tools=[WEATHER], max_tokens=200)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    assert args == {"city": "Paris", "unit": "celsius"}
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    # The template saw the tools as Hugging Face templates receive them.
    assert '"name": "get_weather"' in server.engine.device.prompts[-1]
    assert "<tools>" in server.engine.device.prompts[-1]

    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})}]
    second = client.chat.completions.create(model="typist", messages=messages, tools=[WEATHER], max_tokens=200)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == FINAL and not second.choices[0].message.tool_calls
    prompt = server.engine.device.prompts[-1]
    # The assistant's call went back into the template as a call, and the result as the tool's turn.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}' in prompt
    assert '<tool_response>\n{"temperature": 18}\n</tool_response>' in prompt


def reassembled(stream) -> dict:
    out = {"content": "", "reasoning": "", "calls": {}, "finish": None}
    for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        d = c.delta
        out["content"] += d.content or ""
        out["reasoning"] += (d.model_extra or {}).get("reasoning_content") or ""
        for t in d.tool_calls or ():
            slot = out["calls"].setdefault(t.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += t.id or ""
            slot["name"] += t.function.name or ""
            slot["arguments"] += t.function.arguments or ""
        out["finish"] = c.finish_reason or out["finish"]
    return out


@pytest.mark.parametrize("ask, template", [("What is the weather in Paris?", "qwen2.5"),
                                           ("What is the weather in Paris?", "qwen3"),
                                           ("Weather in Paris; reason first.", "qwen3")])
def test_a_streamed_answer_adds_up_to_the_whole(request, ask, template):
    client = request.getfixturevalue("client") if template == "qwen2.5" else request.getfixturevalue("qwen3")[1]
    kw = dict(model="typist", messages=[{"role": "user", "content": ask}], tools=[WEATHER], max_tokens=300)
    whole = client.chat.completions.create(**kw).choices[0]
    streamed = reassembled(client.chat.completions.create(stream=True, **kw))
    assert streamed["finish"] == whole.finish_reason == "tool_calls"
    assert streamed["content"] == (whole.message.content or "")
    assert streamed["reasoning"] == ((whole.message.model_extra or {}).get("reasoning_content") or "")
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in whole.message.tool_calls]
    assert [{"name": c["name"], "arguments": c["arguments"]} for c in streamed["calls"].values()] == calls
    if "reason" in ask:
        assert streamed["reasoning"] == "\nThe user wants weather.\n" and streamed["content"] == "Let me look.\n"


def test_reasoning_without_tools_and_the_raw_flag(qwen3):
    s, client = qwen3
    kw = dict(model="typist", messages=[{"role": "user", "content": "Please reason first."}], max_tokens=300)
    m = client.chat.completions.create(**kw).choices[0].message
    assert m.model_extra["reasoning_content"] == "\nThe user wants weather.\n"
    assert m.content.startswith("Let me look.\n<tool_call>")  # no tools in the request: no calls read
    raw = typist_server(s.engine.text, script, raw_reasoning=True)
    try:
        r = httpx.post(raw.url + "/v1/chat/completions", json=kw, timeout=30).json()["choices"][0]["message"]
        assert r["content"] == script("reason first") and "reasoning_content" not in r
    finally:
        raw.stop()


def test_enable_thinking_false_reaches_qwen3s_template(qwen3):
    s, client = qwen3
    client.chat.completions.create(model="typist", messages=[{"role": "user", "content": "Hi"}], max_tokens=20,
                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert s.engine.device.prompts[-1].endswith("<think>\n\n</think>\n\n")


def test_tool_choice_none_hides_the_tools_and_reads_no_calls(client, server):
    r = client.chat.completions.create(model="typist", messages=[{"role": "user", "content": "Hi"}],
                                       tools=[WEATHER], tool_choice="none", max_tokens=50)
    assert "<tools>" not in server.engine.device.prompts[-1]
    assert r.choices[0].message.content == "Hello there." and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_a_named_function_are_enforced_by_the_grammar(client, choice):
    # The script answers "Hello there." here: the grammar makes it a call regardless.
    r = client.chat.completions.create(model="typist", messages=[{"role": "user", "content": "Hi"}],
                                       tools=[WEATHER], tool_choice=choice, max_tokens=200)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    (call,) = c.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.mark.parametrize("fmt", [{"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                                          "strict": True}},
                                 {"type": "json_object"}])
def test_response_format_gives_json_that_validates(client, fmt):
    for stream in (False, True):
        kw = dict(model="typist", messages=[{"role": "user", "content": "Who? Answer in JSON."}], response_format=fmt,
                  max_tokens=200)
        if stream:
            text = reassembled(client.chat.completions.create(stream=True, **kw))["content"]
        else:
            text = client.chat.completions.create(**kw).choices[0].message.content
        assert json.loads(text) == {"name": "Ada", "age": 36}


def test_a_schema_the_model_does_not_follow_still_gives_valid_json(client):
    # The script answers "Hello there."; the mask forbids it from the first token on.
    for seed in range(5):
        r = client.chat.completions.create(model="typist", messages=[{"role": "user", "content": "Hi"}], seed=seed,
                                           response_format={"type": "json_schema", "json_schema": {
                                               "name": "person", "schema": PERSON}}, max_tokens=200)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_a_gbnf_grammar_as_an_extension(server):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": "typist", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20,
        "grammar": 'root ::= ("yes" | "no") "."'})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] in ("yes.", "no.")


@pytest.mark.parametrize("change, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format", "not valid"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "response_format must be"),
    ({"grammar": "root ::= (("}, "grammar", "GBNF"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "letters, digits"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls", "must be True or False"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "which tools do not list"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "both constrain"),
])
def test_bad_schemas_and_tools_are_a_400_with_the_reason(server, change, param, words):
    body = {"model": "typist", "messages": [{"role": "user", "content": "Hi"}], **change}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert words in error["message"] and error["param"] == param, error


def test_a_constrained_answer_under_an_opened_think_is_content():
    """An R1 distill's template opens <think>; a schema's answer is JSON from its first token, so it is
    the content, not reasoning."""
    template = ("{% for m in messages %}{{ m.content }}{% endfor %}{% if false %}</think>{% endif %}"
                "{% if add_generation_prompt %}<think>\n{% endif %}")
    s = typist_server(family_text(template), script)
    try:
        body = {"model": "typist", "messages": [{"role": "user", "content": "Who? Answer in JSON."}],
                "max_tokens": 100, "response_format": {"type": "json_object"}}
        m = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=30).json()["choices"][0]["message"]
        assert json.loads(m["content"]) == {"name": "Ada", "age": 36} and "reasoning_content" not in m
        del body["response_format"]  # unconstrained, the same answer is read as reasoning never closed
        m = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=30).json()["choices"][0]["message"]
        assert m["reasoning_content"] == '{"name": "Ada", "age": 36}' and m["content"] == ""
    finally:
        s.stop()
