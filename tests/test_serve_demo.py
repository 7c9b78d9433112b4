"""The server on a real trained model, SmolLM2-135M-Instruct (the `demo` extra), on the NumPy
backend: streamed and whole answers equal the engine's alone for the same request. Requests are
short (the model makes about 7 tokens a second here). Skipped, saying why, without the package."""

from __future__ import annotations

import pytest
from serve_helpers import Server, client_of

from arcpy.backends import open_engine
from arcpy.demo import FETCH_HINT, demo_model_path

FILE = demo_model_path()
pytestmark = pytest.mark.skipif(FILE is None, reason=f"the demo model is not fetched: {FETCH_HINT}")
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
NAME = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def client():
    with Server("--model", str(FILE), "--backend", "numpy", "--max-seq", "256") as s:
        yield client_of(s)


@pytest.fixture(scope="module")
def engine():
    from arcpy.loading import load_gguf
    model, text = load_gguf(FILE)
    with open_engine(model, "numpy", max_seq=256, text=text) as e:
        yield e


def test_the_demo_model_answers_through_the_server_as_alone(client, engine):
    want = "".join(engine.chat(MESSAGES, max_new_tokens=6))
    assert "Paris" in want or want  # what the model says; the server must say the same
    whole = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=6, temperature=0)
    assert whole.choices[0].message.content == want and whole.choices[0].finish_reason == "length"
    streamed = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=6, temperature=0,
                                              stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == want


def test_the_demo_model_stops_at_a_stop_sequence(client, engine):
    want = "".join(engine.chat(MESSAGES, max_new_tokens=8))
    word = want.split()[2]
    reply = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=8, temperature=0, stop=word)
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content == want[:want.index(word)]
