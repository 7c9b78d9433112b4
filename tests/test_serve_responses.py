"""POST /v1/responses through the `openai` client's `responses.create`, whole and streamed: on the
demo model (the NumPy backend) the text equals the chat route's for the same conversation; on
the Typist (agent_helpers) under Qwen3's template, instructions, function tools and their
outputs, reasoning items, previous_response_id from the bounded store, text.format, and the
errors, in OpenAI's shape."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest
from agent_helpers import Typist, family_text, typist_server
from llamacpp_sdist import llamacpp_models
from serve_helpers import Server, client_of

from arcpy.demo import FETCH_HINT, demo_model_path
from arcpy.errors import ArcError

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather now in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FINAL = "It is 18 degrees in Paris."
REASONING = "\nThe user wants weather.\n"


def script(prompt: str) -> str:
    if "<tool_response>" in prompt:
        return FINAL
    if "reason first" in prompt:
        return f"<think>{REASONING}</think>\n\nLet me look.\n" + CALL
    if "in JSON" in prompt:
        return '{"name": "Ada", "age": 36}'
    if "get_weather" in prompt:
        return CALL
    return "Hello there."


def qwen3_text():
    return family_text((llamacpp_models() / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text())


@pytest.fixture(scope="module")
def typist():
    s = typist_server(qwen3_text(), script, settings={"stored_responses": 3})
    yield s, client_of(s)
    s.stop()


class Failing(Typist):
    """The Typist, whose device fails at its fourth forward of an answer, a while after the
    third (so that the answer's first tokens were sent)."""

    def enqueue_forward(self, eager: bool = False) -> None:
        if self.position - self.start >= 3:
            time.sleep(0.5)
            raise ArcError("the device failed (a test's)")
        super().enqueue_forward(eager)


def test_a_failure_before_the_stream_is_a_status_and_after_it_an_error_event():
    s = typist_server(qwen3_text(), lambda prompt: "Hello there, and a long answer to it, word by word.",
                      device=Failing)
    try:
        client = client_of(s)
        with pytest.raises(openai.InternalServerError) as caught:
            client.responses.create(model="typist", input="Hi")
        assert caught.value.body["code"] == "fault"
        events = list(client.responses.create(model="typist", input="Hi", stream=True))
        assert events[0].type == "response.created" and events[-1].type == "error"
        assert events[-1].code == "fault" and "the device failed" in events[-1].message
        assert "response.completed" not in [e.type for e in events]
    finally:
        s.stop()


def streamed(client, **kw):
    """A streamed response: its events, and the response of its last event."""
    events = list(client.responses.create(stream=True, **kw))
    return events, events[-1].response


def test_events_come_in_order_and_add_up_to_the_response(typist):
    server, client = typist
    events, last = streamed(client, model="typist", input="Weather in Paris; reason first.", tools=[WEATHER],
                            max_output_tokens=300)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    whole = client.responses.create(model="typist", input="Weather in Paris; reason first.", tools=[WEATHER],
                                    max_output_tokens=300)
    assert [i.type for i in whole.output] == [i.type for i in last.output] == ["reasoning", "message", "function_call"]
    reasoning, message, call = last.output
    # Each item: added, its deltas, its done events, in that order; deltas add up to the item.
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == REASONING
    assert reasoning.content[0].text == whole.output[0].content[0].text == REASONING
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Let me look.\n"
    assert message.content[0].text == whole.output_text == last.output_text == "Let me look.\n"
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(done.arguments) == json.loads(call.arguments) == {"city": "Paris"}
    assert call.name == whole.output[2].name == "get_weather" and call.call_id.startswith("call_")
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 3
    for item in last.output:
        mine = [k for k, e in zip(kinds, events) if getattr(e, "item_id", None) == item.id
                or getattr(getattr(e, "item", None), "id", None) == item.id]
        assert mine[0] == "response.output_item.added" and mine[-1] == "response.output_item.done", mine
    assert whole.status == last.status == "completed"
    assert whole.usage.output_tokens == last.usage.output_tokens > 0 and whole.usage.input_tokens > 0


def test_the_tool_flow_by_previous_response_id_and_by_items(typist):
    server, client = typist
    first = client.responses.create(model="typist", input="What is the weather in Paris?", tools=[WEATHER],
                                    instructions="You are terse.")
    (call,) = first.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    assert "You are terse." in server.engine.device.prompts[-1] and '"name": "get_weather"' in \
        server.engine.device.prompts[-1]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temperature": 18})}
    second = client.responses.create(model="typist", previous_response_id=first.id, input=[output], tools=[WEATHER])
    assert second.output_text == FINAL and second.previous_response_id == first.id
    by_id = server.engine.device.prompts[-1]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in by_id
    assert '<tool_response>\n{"temperature": 18}\n</tool_response>' in by_id
    assert "You are terse." not in by_id  # instructions are not carried over
    # The same conversation given whole, as items: the same prompt.
    items = [{"role": "user", "content": "What is the weather in Paris?"},
             {"type": "function_call", "call_id": call.call_id, "name": "get_weather", "arguments": call.arguments},
             output]
    _, again = streamed(client, model="typist", input=items, tools=[WEATHER])
    assert again.output_text == FINAL and server.engine.device.prompts[-1] == by_id


def test_a_message_continues_by_previous_response_id(typist):
    server, client = typist
    first = client.responses.create(model="typist", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Hi"}]}])
    assert first.output_text == "Hello there."
    client.responses.create(model="typist", input="And you?", previous_response_id=first.id,
                            instructions="Be kind.")
    prompt = server.engine.device.prompts[-1]
    assert prompt.index("Be kind.") < prompt.index("Hi") < prompt.index("Hello there.") < prompt.index("And you?")


def test_the_store_keeps_the_last_responses(typist):
    server, client = typist
    ids = [client.responses.create(model="typist", input="Hi").id for _ in range(4)]  # the store holds 3
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="typist", input="Hi", previous_response_id=ids[0])
    error = caught.value.body
    assert error["code"] == "previous_response_not_found" and error["param"] == "previous_response_id"
    assert ids[0] in error["message"]
    client.responses.create(model="typist", input="Hi", previous_response_id=ids[3])
    unstored = client.responses.create(model="typist", input="Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="typist", input="Hi", previous_response_id=unstored.id)


def test_text_format_json_schema_constrains_the_answer(typist):
    server, client = typist
    # The Typist writes {"name": "Ada", "age": 36}: the schema's maximum holds all the same.
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "maximum": 30}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.responses.create(model="typist", input="Who? Answer in JSON.", max_output_tokens=200, temperature=0,
                                text={"format": {"type": "json_schema", "name": "person", "schema": schema}})
    answer = json.loads(r.output_text)
    jsonschema.validate(answer, schema)
    assert answer["name"] == "Ada"


@pytest.mark.parametrize("body, param, words", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content",
     "only text parts"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0]", "only function tools"),
    ({"input": "Hi", "tools": [{"type": "function", "name": "bad name!"}]}, "tools", "tools[0].name"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "unsupported item type"),
    ({"input": []}, "input", "required"),
    ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens must be at least 1"),
    ({"input": "Hi", "max_output_tokens": 100000}, "max_output_tokens", "max_output_tokens"),
    ({"input": "Hi", "temperature": 3}, "temperature", "temperature"),
    ({"input": "Hi", "conversation": "c"}, "conversation", "unrecognized"),
    ({"input": "Hi", "truncation": "auto"}, "truncation", "not supported"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}}, "text.format",
     ""),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "required"),
])
def test_bad_requests_get_one_clear_error(typist, body, param, words):
    server, _ = typist
    r = httpx.post(server.url + "/v1/responses", json={"model": "typist", **body}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and words in error["message"], error


def test_an_unknown_model_is_a_404(typist):
    server, _ = typist
    r = httpx.post(server.url + "/v1/responses", json={"model": "other", "input": "Hi"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.skipif(demo_model_path() is None, reason=f"the demo model is not fetched: {FETCH_HINT}")
def test_the_demo_model_answers_as_on_the_chat_route():
    question = "What is the capital of France?"
    with Server("--model", str(demo_model_path()), "--backend", "numpy", "--max-seq", "256") as s:
        client = client_of(s)
        name = "SmolLM2-135M-Instruct.Q4_1"
        chat = client.chat.completions.create(model=name, max_tokens=6, temperature=0, messages=[
            {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}])
        want = chat.choices[0].message.content
        whole = client.responses.create(model=name, input=question, instructions="Answer briefly.",
                                        max_output_tokens=6, temperature=0)
        assert whole.output_text == want and whole.status == "incomplete"
        assert whole.incomplete_details.reason == "max_output_tokens" and whole.usage.output_tokens == 6
        assert whole.output[-1].status == "incomplete"
        events, last = streamed(client, model=name, input=question, instructions="Answer briefly.",
                                max_output_tokens=6, temperature=0)
        assert events[-1].type == "response.incomplete" and last.output_text == want
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want
        (done,) = [e for e in events if e.type == "response.output_text.done"]
        assert done.text == want
