"""One sequence at a time, done well: a client that leaves mid-stream cancels its sequence and the
next request is served at once; a bounded queue (503 with Retry-After beyond it) from which a
client that leaves is dropped; a per-request timeout; a clean stop on SIGTERM and SIGINT.

The model here is slow on purpose (the stories15M shape with a tokenizer: about 12 ms a token on
the NumPy backend), so that a long answer is still running when the test acts."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time

import httpx
import pytest
from serve_helpers import Server, make_text_model

from arcpy.bench.http_client import metric

LONG = {"model": "slow", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 1000,
        "temperature": 0}
SHORT = {"model": "slow", "messages": [{"role": "user", "content": "general kenobi"}], "max_tokens": 2,
         "temperature": 0}


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory):
    return make_text_model(tmp_path_factory.mktemp("queue") / "slow", shape="stories15M")


@pytest.fixture(scope="module")
def server(slow_model):
    with Server("--model", str(slow_model), "--backend", "numpy", "--max-queue", "1") as s:
        yield s


def health(server) -> dict:
    return httpx.get(server.url + "/health", timeout=10).json()


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def raw_post(server, body) -> socket.socket:
    """A chat request sent on a bare socket, left unread: close() hangs up."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (host.encode(), len(data), data))
    return sock


class Streaming:
    """A streamed request on a connection of its own, read chunk by chunk; close() hangs up."""

    def __init__(self, server, body=LONG):
        self.client = httpx.Client(timeout=60)
        self.response = self.client.send(self.client.build_request(
            "POST", server.url + "/v1/chat/completions", json={**body, "stream": True}), stream=True)
        self.lines = self.response.iter_lines()

    def read_content(self, n: int) -> list[str]:
        texts = []
        for line in self.lines:
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content"):
                    texts.append(delta["content"])
                    if len(texts) == n:
                        return texts
        raise AssertionError(f"the stream ended after {len(texts)} pieces")

    def close(self) -> None:
        self.response.close()
        self.client.close()


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_cancels_its_sequence_and_the_next_request_starts(server, stream):
    cancelled = metric(server.url, 'arcpy_sequences_total{finish_reason="cancelled"}')
    if stream:
        leaving = Streaming(server)
        leaving.read_content(3)
    else:  # a whole answer: the server notices the hang-up while it decodes
        leaving = raw_post(server, LONG)
        wait_for(lambda: health(server)["running"] == 1, what="the request to run")
        time.sleep(0.1)
    left = time.perf_counter()
    leaving.close()
    r = httpx.post(server.url + "/v1/chat/completions", json=SHORT, timeout=60)
    served = time.perf_counter() - left
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    # The 1,000-token answer would have taken about 12 s more; the next request was served at once.
    assert served < 3.0, f"the next request took {served:.2f} s after the client left"
    assert metric(server.url, 'arcpy_sequences_total{finish_reason="cancelled"}') == cancelled + 1
    assert metric(server.url, "arcpy_cancel_seconds_count") >= 1
    assert re.search(r"chatcmpl-\w+: cancelled after \d+ tokens", server.log)
    freed = metric(server.url, "arcpy_cancel_seconds_sum") / metric(server.url, "arcpy_cancel_seconds_count")
    print(f"\nthe client left; the next request was answered {served * 1e3:.0f} ms later; engine free "
          f"{freed * 1e3:.1f} ms after a cancel, on average")


def test_beyond_the_queue_a_503_with_retry_after_and_a_queued_client_that_leaves_is_dropped(server):
    running = Streaming(server)
    running.read_content(1)
    results = {}
    waiting = threading.Thread(target=lambda: results.update(
        short=httpx.post(server.url + "/v1/chat/completions", json=SHORT, timeout=60)))
    waiting.start()
    wait_for(lambda: health(server)["queue_depth"] == 1, what="the second request to be queued")
    full = httpx.post(server.url + "/v1/chat/completions", json=SHORT, timeout=60)
    assert full.status_code == 503 and full.headers["retry-after"] == "1"
    assert full.json()["error"]["code"] == "queue_full" and "--max-queue" in full.json()["error"]["message"]
    running.close()  # the queued request runs next
    waiting.join(60)
    assert results["short"].status_code == 200

    # A queued client that leaves frees its place at once.
    running = Streaming(server)
    running.read_content(1)
    queued = raw_post(server, {**SHORT, "stream": True})  # its headers come with its first token
    wait_for(lambda: health(server)["queue_depth"] == 1, what="the request to be queued")
    queued.close()
    wait_for(lambda: health(server)["queue_depth"] == 0, timeout=5, what="the queue to drop the request")
    assert health(server)["running"] == 1
    running.close()
    wait_for(lambda: health(server)["running"] == 0, timeout=10, what="the engine to be free")


def test_a_request_past_the_timeout_is_a_504_and_the_server_goes_on(slow_model):
    with Server("--model", str(slow_model), "--backend", "numpy", "--timeout", "1") as s:
        started = time.perf_counter()
        r = httpx.post(s.url + "/v1/chat/completions", json=LONG, timeout=60)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout", r.text
        assert time.perf_counter() - started < 5
        stream = Streaming(s)
        events = [line for line in stream.lines if line.startswith("data: ")]
        stream.close()
        assert json.loads(events[-1][6:])["error"]["code"] == "timeout" and "[DONE]" not in events[-1]
        assert httpx.post(s.url + "/v1/chat/completions", json=SHORT, timeout=60).status_code == 200


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_cuts_the_stream_closes_the_engine_and_exits_0(slow_model, sig):
    with Server("--model", str(slow_model), "--backend", "numpy") as s:
        stream = Streaming(s)
        stream.read_content(2)
        started = time.perf_counter()
        s.proc.send_signal(sig)
        rest = [line for line in stream.lines if line.startswith("data: ")]
        stream.close()
        assert json.loads(rest[-1][6:])["error"]["code"] == "shutdown"
        assert s.stop(timeout=30) == 0, s.log
        assert time.perf_counter() - started < 10
        log = s.log
    assert "engine closed" in log and "arcpy serve: stopped; the engine is closed" in log
    assert "Traceback" not in log, log
