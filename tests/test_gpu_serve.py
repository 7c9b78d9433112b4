"""GPU tier: the server on the device loop (marker `gpu`). Through the server, the streamed text
equals Engine.chat's for the same request, greedy and seeded, and the host waits per token stay
0 (the server's metrics and its log say so). On SmolLM2-135M-Instruct (the `demo` extra)."""

from __future__ import annotations

import re

import httpx
import pytest
from serve_helpers import Server, client_of

from arcpy.backends import open_engine
from arcpy.demo import FETCH_HINT, demo_model_path
from arcpy.sampling import Sampling

FILE = demo_model_path()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(FILE is None, reason=f"the demo model is not fetched: {FETCH_HINT}")]
NAME = "SmolLM2-135M-Instruct.Q4_1"
MESSAGES = [{"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Name three colors and say one thing about each."}]


@pytest.fixture(scope="module")
def server():
    with Server("--model", str(FILE), "--backend", "cuda", "--device-loop", "--temperature", "0") as s:
        yield s


def streamed(server, **kw) -> str:
    client = client_of(server)
    chunks = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=128, stream=True, **kw)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def metric(server, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", httpx.get(server.url + "/metrics").text, re.M).group(1))


def test_the_stream_equals_engine_chat_and_no_host_waits_per_token(server):
    from arcpy.loading import load_gguf

    greedy = streamed(server, temperature=0)
    seeded = streamed(server, temperature=0.8, top_p=0.95, seed=3)
    model, text = load_gguf(FILE)
    with open_engine(model, "cuda", device_loop=True, text=text) as engine:
        assert greedy == "".join(engine.chat(MESSAGES, max_new_tokens=128))
        assert seeded == "".join(engine.chat(MESSAGES, max_new_tokens=128,
                                             sampling=Sampling(temperature=0.8, top_p=0.95, seed=3)))
    assert greedy and seeded
    assert metric(server, "arcpy_host_waits_total") == 0
    assert metric(server, "arcpy_host_waits_per_token") == 0
    assert metric(server, "arcpy_fallbacks_total") == 0 and metric(server, "arcpy_device_loop_latched") == 0
    paths = re.findall(r"chatcmpl-\w+: \w+ after \d+ tokens .*; path (\S+), host waits (\d+)", server.log)
    assert len(paths) == 2 and all(p == ("device-loop", "0") for p in paths), paths
