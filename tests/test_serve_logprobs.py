"""`arcpy serve`'s log-probabilities through the `openai` client, whole and streamed, chat and
completions; continuous usage; the first chunk; the fingerprint; /tokenize and /detokenize; the
logit bias (the NumPy backend)."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest
from serve_helpers import client, engine_alone, model_dir, server  # noqa: F401 (fixtures)

from arcpy.loop.prompt import request_ids
from arcpy.loop.request import Request
from arcpy.text import token_text

MESSAGES = [{"role": "system", "content": "general"}, {"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def alone(model_dir):
    """The same request's pieces from an engine of its own, and the model's text."""
    engine = engine_alone(model_dir)

    def pieces(**request):
        return [p for p in engine.stream(Request(**request)) if p.token is not None]

    yield pieces, engine.text
    engine.close()


def test_chat_logprobs_whole_are_the_engines(client, alone):
    pieces, text = alone
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                           logprobs=True, top_logprobs=3)
    want = pieces(messages=MESSAGES, max_new_tokens=8, logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == len(want) == reply.usage.completion_tokens
    for got, p in zip(content, want):
        assert got.token == token_text(text, p.token) and got.bytes == list(got.token.encode())
        assert math.isclose(got.logprob, p.logprob.logprob, abs_tol=1e-9) and got.logprob <= 0
        assert [t.token for t in got.top_logprobs] == [token_text(text, i) for i, _ in p.logprob.top]
        values = [t.logprob for t in got.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True) and values[0] >= got.logprob - 1e-9
    assert reply.system_fingerprint.startswith("arcpy-")


def test_chat_logprobs_streamed_equal_whole(client):
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                           logprobs=True, top_logprobs=2)
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                                 logprobs=True, top_logprobs=2, stream=True))
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content is None
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole.choices[0].logprobs.content]
    assert all(c.system_fingerprint == whole.system_fingerprint for c in chunks)


def test_without_logprobs_a_choice_says_null(client):
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0)
    assert reply.choices[0].logprobs is None


def test_completion_legacy_logprobs_whole_and_streamed(client, alone):
    pieces, text = alone
    whole = client.completions.create(model="tiny", prompt="general hello", max_tokens=6, temperature=0,
                                      logprobs=2)
    want = pieces(prompt="general hello", max_new_tokens=6, logprobs=2)
    lp = whole.choices[0].logprobs
    assert lp.tokens == [token_text(text, p.token) for p in want]
    assert all(math.isclose(a, p.logprob.logprob, abs_tol=1e-9) for a, p in zip(lp.token_logprobs, want))
    assert [list(d) for d in lp.top_logprobs] == [[token_text(text, i) for i, _ in p.logprob.top] for p in want]
    made = [len(p.text) for p in want]  # a token's offset: the text the tokens before it made final
    assert lp.text_offset == [sum(made[:k]) for k in range(len(made))]
    assert whole.choices[0].text == "".join(p.text for p in want)
    chunks = list(client.completions.create(model="tiny", prompt="general hello", max_tokens=6, temperature=0,
                                            logprobs=2, stream=True))
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert tokens == lp.tokens and offsets == lp.text_offset


def test_continuous_usage_stats_count_on_every_chunk(server):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert all(e["usage"] is not None for e in events) and counts == sorted(counts)
    assert counts[0] == 0 and counts[-1] == 6 and events[-1]["choices"] == []
    assert all(e["usage"]["prompt_tokens"] == events[-1]["usage"]["prompt_tokens"] > 0 for e in events)


def test_tokenize_and_detokenize_are_the_models_tokenizer(server, alone):
    _, text = alone
    from arcpy.loop.prompt import request_ids
    from arcpy.text import encode

    r = httpx.post(server.url + "/tokenize", json={"model": "tiny", "prompt": "general hello there"})
    assert r.status_code == 200, r.text
    ids = encode(text, "general hello there")
    assert r.json()["tokens"] == ids and r.json()["count"] == len(ids) and r.json()["max_model_len"] > 0
    assert httpx.post(server.url + "/tokenize", json={"content": "general hello there"}).json()["tokens"] == ids
    chat = httpx.post(server.url + "/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    assert chat == request_ids(text, Request(messages=MESSAGES))
    back = httpx.post(server.url + "/detokenize", json={"tokens": ids}).json()
    assert back["prompt"] == back["content"] == "general hello there"


@pytest.mark.parametrize("route,body,status,param", [
    ("/tokenize", {"prompt": 3}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": MESSAGES}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "colour": 1}, 400, "colour"),
    ("/tokenize", {"model": "other", "prompt": "a"}, 404, "model"),
    ("/detokenize", {"tokens": [1, "x"]}, 400, "tokens"),
    ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
])
def test_tokenize_refuses_bad_bodies_in_one_line(server, route, body, status, param):
    r = httpx.post(server.url + route, json=body)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text


def test_logit_bias_through_the_client_is_the_engines(client, alone):
    pieces, _ = alone
    plain = pieces(messages=MESSAGES, max_new_tokens=6)
    bias = {plain[0].token: -100, plain[1].token: 5}
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0,
                                           logit_bias={str(k): v for k, v in bias.items()})
    want = pieces(messages=MESSAGES, max_new_tokens=6, logit_bias=bias)
    assert plain[0].token not in [p.token for p in want]
    assert reply.choices[0].message.content == "".join(p.text for p in want)
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, logit_bias={"99999": 1})
    with pytest.raises(openai.BadRequestError, match="not a token id"):
        client.completions.create(model="tiny", prompt="hello", max_tokens=2, logit_bias={"x": 1})


@pytest.fixture(scope="module")
def scorer(model_dir):
    """An engine of its own, for the prompt's log-probabilities and the answer alone."""
    engine = engine_alone(model_dir)
    yield engine
    engine.close()


def test_completion_echo_puts_the_prompt_and_its_logprobs_first(client, scorer):
    text = scorer.text
    prompt = "general hello"
    ids = request_ids(text, Request(prompt=prompt))
    want = scorer.prompt_logprobs(ids, 2)
    answer = "".join(scorer.chat(Request(prompt=prompt, max_new_tokens=5)))
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0, logprobs=2, echo=True)
    choice = whole.choices[0]
    assert choice.text == prompt + answer
    lp = choice.logprobs
    assert lp.tokens[:len(ids)] == [token_text(text, t) for t in ids] and len(lp.tokens) == len(ids) + 5
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the first token has none
    assert all(math.isclose(a, w.logprob, abs_tol=1e-9) for a, w in zip(lp.token_logprobs[1:len(ids)], want))
    assert [list(d) for d in lp.top_logprobs[1:len(ids)]] == [[token_text(text, i) for i, _ in w.top] for w in want]
    assert lp.text_offset[len(ids)] == len(prompt)  # the answer's first token begins after the echo
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0, logprobs=2,
                                            echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    streamed = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == lp.token_logprobs
    plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0, echo=True)
    assert plain.choices[0].text == prompt + answer and plain.choices[0].logprobs is None


def test_a_chat_completion_has_no_echo(server):
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "echo": True})
    assert r.status_code == 400 and "echo" in r.text
