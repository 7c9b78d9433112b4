"""gpt-oss's harmony format against `arcpy serve`, through the `openai` client, and in `arcpy chat`:
the Typist (agent_helpers) types harmony's messages token by token, their tags as the special
tokens, under llama.cpp's copy of gpt-oss's chat template (tests/llamacpp_sdist.py). Its reasoning
comes back as reasoning_content, its call as tool_calls, whole and streamed; the call, its
reasoning and the tool's result go back through the template; reasoning_effort reaches it."""

from __future__ import annotations

import io
import json

import httpx
import pytest
from agent_helpers import Typist, harmony_text, typist_engine, typist_server
from llamacpp_sdist import llamacpp_models
from serve_helpers import client_of
from test_agents_serve import WEATHER, reassembled

from arcpy.terminal_chat import Conversation, converse

THOUGHT = "The user wants the weather in Paris."
CALL = (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "unit": "celsius"}<|call|>')
FINAL = "It is 18 degrees in Paris."
ANSWER = (f"<|channel|>analysis<|message|>18, so say so.<|end|><|start|>assistant<|channel|>final<|message|>{FINAL}"
          "<|return|>")
HELLO = ("<|channel|>analysis<|message|>A greeting.<|end|><|start|>assistant<|channel|>final<|message|>Hello there."
         "<|return|>")


def script(prompt: str) -> str:
    if "to=assistant<|channel|>commentary" in prompt:  # the tool's result came back: answer
        return ANSWER
    if "weather" in prompt.rpartition("<|start|>user")[2]:
        return CALL
    return HELLO


class HarmonyTypist(Typist):
    parse_special = True  # the script's tags are the tokens, as the model writes them


@pytest.fixture(scope="module")
def text():
    return harmony_text((llamacpp_models() / "templates" / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def server(text):
    s = typist_server(text, script, device=HarmonyTypist)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return client_of(server)


def test_the_tool_flow_end_to_end(client, server):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model="typist", messages=messages, tools=[WEATHER], max_tokens=200)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == THOUGHT
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    assert "type get_weather = (_: {\ncity: string,\nunit: " in server.engine.device.prompts[-1]

    # The message as the client has it, reasoning_content and all, goes back with the result.
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})}]
    second = client.chat.completions.create(model="typist", messages=messages, tools=[WEATHER], max_tokens=200)
    c = second.choices[0]
    assert c.finish_reason == "stop" and c.message.content == FINAL and not c.message.tool_calls
    assert c.message.model_extra["reasoning_content"] == "18, so say so."
    prompt = server.engine.device.prompts[-1]
    assert prompt.endswith(f"<|start|>user<|message|>What is the weather in Paris?<|end|>"
                           f"<|start|>assistant<|channel|>analysis<|message|>{THOUGHT}<|end|>"
                           "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
                           '{"city": "Paris", "unit": "celsius"}<|call|>'
                           "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
                           '"{\\"temperature\\": 18}"<|end|><|start|>assistant')


@pytest.mark.parametrize("ask, tools", [("What is the weather in Paris?", True), ("Hi", True), ("Hi", False)])
def test_a_streamed_answer_adds_up_to_the_whole(client, ask, tools):
    kw = dict(model="typist", messages=[{"role": "user", "content": ask}], max_tokens=300,
              **({"tools": [WEATHER]} if tools else {}))
    whole = client.chat.completions.create(**kw).choices[0]
    streamed = reassembled(client.chat.completions.create(stream=True, **kw))
    assert streamed["finish"] == whole.finish_reason
    assert streamed["content"] == (whole.message.content or "")
    assert streamed["reasoning"] == whole.message.model_extra["reasoning_content"]
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in whole.message.tool_calls or ()]
    assert [{"name": c["name"], "arguments": c["arguments"]} for c in streamed["calls"].values()] == calls
    if "weather" in ask:
        assert whole.finish_reason == "tool_calls" and streamed["reasoning"] == THOUGHT and streamed["content"] == ""
    else:
        assert whole.finish_reason == "stop" and streamed["content"] == "Hello there." and not calls
        assert streamed["reasoning"] == "A greeting."


def test_reasoning_effort_and_the_developers_instructions_reach_the_template(client, server):
    messages = [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
    client.chat.completions.create(model="typist", messages=messages, reasoning_effort="high", max_tokens=50)
    prompt = server.engine.device.prompts[-1]
    assert "Reasoning: high\n\n" in prompt
    assert "<|start|>developer<|message|># Instructions\n\nAnswer in French." in prompt
    client.chat.completions.create(model="typist", messages=messages, reasoning_effort="high", max_tokens=50,
                                   extra_body={"chat_template_kwargs": {"reasoning_effort": "low"}})
    assert "Reasoning: low\n\n" in server.engine.device.prompts[-1]  # chat_template_kwargs win
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": "typist", "messages": messages, "reasoning_effort": "extreme"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort", r.text


def test_a_required_call_is_forced_into_harmonys_call_message(client):
    r = client.chat.completions.create(model="typist", messages=[{"role": "user", "content": "Hi"}], tools=[WEATHER],
                                       tool_choice="required", max_tokens=300, seed=1)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city", "unit"}


def test_reasoning_content_on_another_role_is_a_400(server):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": "typist", "messages": [{"role": "user", "content": "Hi", "reasoning_content": "no"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].reasoning_content", r.text


def test_the_terminal_chat_shows_the_messages_text_and_keeps_a_calls_reasoning(text):
    engine = typist_engine(text, script, device=HarmonyTypist)
    out, err = io.StringIO(), io.StringIO()
    lines = iter(["Hi", "/exit"])
    assert converse(Conversation(engine), lambda prompt: next(lines), out=out, err=err) == 0
    assert "A greeting.Hello there." in out.getvalue() and "assistantfinal" not in out.getvalue()
    conversation = Conversation(engine, tools=[WEATHER])
    lines = iter(["What is the weather in Paris?", '/tool {"temperature": 18}', "/exit"])
    assert converse(conversation, lambda prompt: next(lines), out=out, err=err) == 0
    assert '[tool call get_weather] {"city": "Paris", "unit": "celsius"}' in out.getvalue() and FINAL in out.getvalue()
    (asked, messages), = conversation.turns
    assert messages[0]["reasoning_content"] == THOUGHT and messages[2]["content"] == FINAL
    assert (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant to=functions.get_weather"
            in engine.device.prompts[-1])
