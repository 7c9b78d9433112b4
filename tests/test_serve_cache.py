"""`arcpy serve` with the prefix cache, through the `openai` client, on the NumPy backend: a turn
that extends the last reports its cached tokens and answers what a cold engine answers; the cache
can be cleared; /metrics counts it."""

from __future__ import annotations

import httpx
import pytest
from serve_helpers import Server, client, client_of, engine_alone, model_dir, server  # noqa: F401 (fixtures)

from arcpy.loop.request import Request

# More than one chunk of the NumPy backend's prefill (64 tokens): whole chunks are what is reused.
FIRST = [{"role": "system", "content": " ".join(f"w{i % 50}" for i in range(100))},
         {"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def cold(model_dir):
    """A request answered by an engine without the cache: (text, prompt tokens)."""
    engine = engine_alone(model_dir, prefix_cache=False)

    def answer(**request):
        pieces = list(engine.stream(Request(**request)))
        return "".join(p.text for p in pieces), engine.stats.prompt_tokens

    yield answer
    engine.close()


def cached(reply) -> int:
    return reply.usage.prompt_tokens_details.cached_tokens


def test_a_second_turn_reuses_the_first_and_answers_as_cold(server, client, cold):
    one = client.chat.completions.create(model="tiny", messages=FIRST, max_tokens=8, temperature=0)
    second = FIRST + [{"role": "assistant", "content": one.choices[0].message.content},
                      {"role": "user", "content": "general kenobi"}]
    two = client.chat.completions.create(model="tiny", messages=second, max_tokens=8, temperature=0)
    want, prompt_tokens = cold(messages=second, max_new_tokens=8)
    assert two.choices[0].message.content == want
    assert two.usage.prompt_tokens == prompt_tokens
    assert 0 < cached(two) < prompt_tokens
    # Streamed, with usage: the same turn again reuses its whole chunks.
    chunks = list(client.chat.completions.create(model="tiny", messages=second, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert cached(chunks[-1]) == (prompt_tokens - 1) // 64 * 64
    metrics = httpx.get(server.url + "/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith("arcpy_prompt_cached_tokens_total"))
    assert float(line.split()[-1]) >= cached(two) + cached(chunks[-1])


@pytest.mark.parametrize("route", ["/reset_prefix_cache", "/flush_cache"])
def test_clearing_the_cache_makes_the_next_request_cold(server, client, route):
    client.chat.completions.create(model="tiny", messages=FIRST, max_tokens=4, temperature=0)
    again = client.chat.completions.create(model="tiny", messages=FIRST, max_tokens=4, temperature=0)
    assert cached(again) == (again.usage.prompt_tokens - 1) // 64 * 64 > 0
    r = httpx.post(server.url + route)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    after = client.chat.completions.create(model="tiny", messages=FIRST, max_tokens=4, temperature=0)
    assert cached(after) == 0
    assert httpx.get(server.url + route).status_code == 405


@pytest.fixture(scope="module")
def stored_server(model_dir):
    with Server("--model", str(model_dir), "--backend", "numpy", "--temperature", "0",
                "--prompt-cache-bytes", str(8 << 20)) as s:
        yield s


def test_with_a_store_alternating_conversations_each_reuse_their_own(stored_server, cold):
    client = client_of(stored_server)
    systems = [" ".join(f"w{(i * k) % 50}" for i in range(100)) for k in (1, 3)]
    histories = [[{"role": "system", "content": s}, {"role": "user", "content": "hello there"}] for s in systems]
    for turn in range(2):
        for history in histories:
            reply = client.chat.completions.create(model="tiny", messages=history, max_tokens=5, temperature=0)
            want, _ = cold(messages=history, max_new_tokens=5)
            assert reply.choices[0].message.content == want
            assert (cached(reply) >= 64) == (turn > 0), (turn, cached(reply))
            history += [{"role": "assistant", "content": want}, {"role": "user", "content": "general kenobi"}]
