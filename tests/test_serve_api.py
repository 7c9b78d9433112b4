"""`arcpy serve` through real clients (the `openai` package, httpx), on the NumPy backend: the text
it answers is what the engine answers alone, streamed or whole; finish reasons, usage, stop
sequences, seeds, the model list, /health and /metrics."""

from __future__ import annotations

import json

import httpx
import pytest
from serve_helpers import Server, client, engine_alone, make_text_model, model_dir, server  # noqa: F401 (fixtures)

from arcpy.loop.request import Request
from arcpy.sampling import Sampling

MESSAGES = [{"role": "system", "content": "general"}, {"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def alone(model_dir):
    """The same request answered by an engine of its own: (text, finish reason, tokens)."""
    engine = engine_alone(model_dir)

    def answer(**request):
        pieces = list(engine.stream(Request(**request)))
        return "".join(p.text for p in pieces), engine.stats.finish_reason, engine.stats.tokens

    yield answer
    engine.close()


def sse_events(response: httpx.Response) -> list:
    """The data of each server-sent event; the last must be [DONE]."""
    events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]


def test_chat_answers_what_the_engine_answers_alone(client, alone):
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    want, reason, tokens = alone(messages=MESSAGES, max_new_tokens=12)
    assert reply.choices[0].message.content == want and want
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "length" and reason == "token_budget"
    assert reply.usage.completion_tokens == tokens == 12
    assert reply.usage.prompt_tokens == 3 and reply.usage.total_tokens == 15  # "general hello there"
    assert reply.object == "chat.completion" and reply.model == "tiny" and reply.id.startswith("chatcmpl-")


def test_chat_template_kwargs_reach_the_template(client, alone):
    lead = {"lead": "general kenobi"}
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0,
                                           extra_body={"chat_template_kwargs": lead})
    want, _, _ = alone(messages=MESSAGES, max_new_tokens=6, template_kwargs=lead)
    assert reply.choices[0].message.content == want and want != alone(messages=MESSAGES, max_new_tokens=6)[0]
    assert reply.usage.prompt_tokens == 5  # "general kenobi general hello there"


def test_a_streamed_chat_is_the_same_text(client, alone):
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == alone(messages=MESSAGES, max_new_tokens=12)[0]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


def test_a_stream_ends_with_done_and_has_usage_only_when_asked(server):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert all("usage" not in e for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_text_completions_whole_and_streamed(client, alone):
    want = alone(prompt="hello there general", max_new_tokens=10)[0]
    whole = client.completions.create(model="tiny", prompt="hello there general", max_tokens=10, temperature=0)
    assert whole.choices[0].text == want and whole.object == "text_completion"
    streamed = client.completions.create(model="tiny", prompt="hello there general", max_tokens=10, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want


def test_a_prompt_of_token_ids(client, alone):
    want = alone(prompt_ids=[1, 2, 3], max_new_tokens=6)[0]
    assert client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=6, temperature=0).choices[0].text == want


def test_a_stop_sequence_ends_the_answer_with_stop_and_is_not_shown(client, alone):
    words = alone(messages=MESSAGES, max_new_tokens=12)[0].split()
    k = next(i for i in range(2, len(words)) if words[i] not in words[:i])
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0,
                                           stop=[words[k], "never there"])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content.split() == words[:k]


def test_the_end_of_sequence_id_ends_the_answer_with_stop(tmp_path, alone):
    # A copy of the model whose end-of-sequence token is a word its answer to [1, 2, 3] holds.
    words = alone(prompt_ids=[1, 2, 3], max_new_tokens=12)[0].split()
    k = next(i for i in range(2, len(words)) if words[i] not in words[:i])
    d = make_text_model(tmp_path / "tiny", eos=words[k])
    with Server("--model", str(d), "--backend", "numpy") as s:
        reply = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 12,
                                                            "temperature": 0}, timeout=60).json()
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["choices"][0]["text"].split() == words[:k]
    assert reply["usage"]["completion_tokens"] == k + 1  # the end-of-sequence token was produced, not shown


def test_a_seed_gives_the_same_sampled_answer_as_the_engine(client, alone):
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=10, temperature=1.0, top_p=0.9, seed=7)
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    again = client.chat.completions.create(**kwargs).choices[0].message.content
    want = alone(messages=MESSAGES, max_new_tokens=10, sampling=Sampling(1.0, 0, 0.9, 7))[0]
    assert first == again == want
    other = client.chat.completions.create(**{**kwargs, "seed": 8}).choices[0].message.content
    assert other != first


def test_content_as_text_parts_and_the_developer_role(client, alone):
    parts = [{"role": "developer", "content": "general"},
             {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]}]
    reply = client.chat.completions.create(model="tiny", messages=parts, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content == alone(messages=MESSAGES, max_new_tokens=8)[0]


def test_models_health_and_metrics(client, server):
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["backend"] == "numpy" and health["max_seq"] == 512
    client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, temperature=0)
    metrics = httpx.get(server.url + "/metrics").text
    for name in ("arcpy_time_to_first_token_seconds_bucket", "arcpy_request_duration_seconds_bucket",
                 "arcpy_decode_tokens_per_second_bucket", "arcpy_queue_depth", "arcpy_host_waits_per_token",
                 "arcpy_faults_total", "arcpy_fallbacks_total", "arcpy_device_loop_latched"):
        assert name in metrics, name
    assert 'arcpy_sequences_total{finish_reason="token_budget"}' in metrics
    assert 'arcpy_http_responses_total{route="/v1/chat/completions",status="200"}' in metrics
