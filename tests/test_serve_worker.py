"""The worker and its hand-off, against the fake GPU: pieces cross threads in order, the queue is
FIFO and bounded, a cancel drops a queued job or cuts the running one at its next piece, a fault
costs one request (a 500) and the server goes on, a lost context makes the server say so (503)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from scripted_tokens import scripted_tokens
from serve_helpers import InProcess

from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.devices.scripted import scripted_next
from arcpy.loop import gate
from arcpy.loop.engine import Engine
from arcpy.loop.prompt import Piece
from arcpy.loop.request import Request
from arcpy.loop.settings import EngineSettings
from arcpy.serve.app import Service, Settings, create_app
from arcpy.serve.worker import FAULT, SHUTDOWN, Channel, Done, Failed, Job, QueueFull, Unavailable, Worker

PROMPT = (1, 2, 3)


def reference(n, prompt=PROMPT):
    return scripted_tokens(prompt, n, 64)


def fake_worker(script=None, max_queue=4, **kw) -> Worker:
    def build():
        return Engine(FakeDevice(script or FakeScript()), "fake", EngineSettings(device_loop=True, burst=4, **kw),
                      environ={}, latch=gate.FallbackLatch())
    return Worker(build, max_queue, warm_up=False).start()  # the script counts steps from the first job


async def collect(job: Job) -> tuple[list[int], object]:
    tokens = []
    while True:
        for item in await job.channel.take():
            if isinstance(item, Piece):
                tokens.append(item.token)
            else:
                return tokens, item


def test_pieces_cross_from_a_thread_in_order_and_none_is_lost():
    async def main():
        channel = Channel(asyncio.get_running_loop())
        n = 20_000
        thread = threading.Thread(target=lambda: [channel.put(i) for i in range(n)])
        thread.start()
        got, takes = [], 0
        while not got or got[-1] != n - 1:  # the last one put
            got += await asyncio.wait_for(channel.take(), 30)
            takes += 1
        thread.join()
        return got, takes, n

    got, takes, n = asyncio.run(main())
    assert got == list(range(n))
    assert takes < n  # a reader that falls behind takes several at once


def test_jobs_are_answered_first_in_first_out_by_one_engine():
    worker = fake_worker()

    async def main():
        loop = asyncio.get_running_loop()
        jobs = [Job(Request(prompt_ids=PROMPT, max_new_tokens=n), Channel(loop)) for n in (5, 7, 9)]
        for job in jobs:
            worker.submit(job)
        return [await collect(job) for job in jobs]

    try:
        for (tokens, end), n in zip(asyncio.run(main()), (5, 7, 9)):
            assert tokens == reference(n) and isinstance(end, Done) and end.stats.finish_reason == "token_budget"
    finally:
        worker.close()


def slow_next(token: int, position: int) -> int:
    time.sleep(0.002)  # a token every 2 ms or so: a long answer is still running when the test acts
    return scripted_next(token, position, 64)


def test_the_queue_is_bounded_a_cancelled_job_leaves_it_and_stop_ends_everything():
    worker = fake_worker(FakeScript(next_token=slow_next), max_queue=1)

    async def main():
        loop = asyncio.get_running_loop()
        running, queued, third = (Job(Request(prompt_ids=PROMPT, max_new_tokens=4000), Channel(loop))
                                  for _ in range(3))
        worker.submit(running)
        while worker.state()["running"] == 0:
            await asyncio.sleep(0.001)
        worker.submit(queued)
        with pytest.raises(QueueFull, match="1 waiting"):
            worker.submit(third)
        worker.cancel(queued, "disconnect")
        assert worker.state()["queue_depth"] == 0
        worker.submit(third)  # its place is free
        started = time.perf_counter()
        worker.stop()
        third_end = (await collect(third))[1]
        running_tokens, running_end = await collect(running)
        with pytest.raises(Unavailable, match="shutting down"):
            worker.submit(queued)
        return third_end, running_tokens, running_end, time.perf_counter() - started

    try:
        third_end, tokens, end, seconds = asyncio.run(main())
        assert isinstance(third_end, Failed) and third_end.kind == SHUTDOWN
        # The running job was cut at its next piece, well before its 4,000 tokens.
        assert isinstance(end, Done) and end.stats.finish_reason == "cancelled" and len(tokens) < 1000
        assert seconds < 1.0
    finally:
        worker.close()
    assert not worker._thread.is_alive()


def test_a_fault_costs_one_request_and_a_lost_context_makes_the_engine_unavailable():
    worker = fake_worker(FakeScript(nan_at_position=12))

    async def main():
        loop = asyncio.get_running_loop()
        bad = Job(Request(prompt_ids=PROMPT, max_new_tokens=20), Channel(loop))  # reaches position 12
        good = Job(Request(prompt_ids=PROMPT, max_new_tokens=5), Channel(loop))
        worker.submit(bad)
        worker.submit(good)
        return await collect(bad), await collect(good)

    try:
        (bad_tokens, bad_end), (good_tokens, good_end) = asyncio.run(main())
        assert isinstance(bad_end, Failed) and bad_end.kind == FAULT and "position" in bad_end.message
        assert bad_tokens == reference(20)[:len(bad_tokens)]
        assert good_tokens == reference(5) and isinstance(good_end, Done)
        assert worker.metrics.faults._value.get() == 1
    finally:
        worker.close()

    worker = fake_worker(FakeScript(sticky_fault_at=3))

    async def lost():
        loop = asyncio.get_running_loop()
        first = Job(Request(prompt_ids=PROMPT, max_new_tokens=20), Channel(loop))
        worker.submit(first)
        end = (await collect(first))[1]
        with pytest.raises(Unavailable, match="unusable"):
            worker.submit(Job(Request(prompt_ids=PROMPT, max_new_tokens=2), Channel(loop)))
        return end

    try:
        end = asyncio.run(lost())
        assert isinstance(end, Failed) and end.kind == FAULT and worker.state()["poisoned"]
    finally:
        worker.close()


@pytest.fixture
def faulty_server():
    worker = fake_worker(FakeScript(nan_at_position=12, next_token=slow_next))  # tokens are sent before it
    server = InProcess(create_app(Service(worker, None, Settings("fake", 4096))))
    yield server
    server.stop()
    assert not worker._thread.is_alive()  # the lifespan's shutdown closed the engine


@pytest.mark.parametrize("stream", [False, True])
def test_a_fault_is_a_500_for_that_request_alone_and_the_server_goes_on(faulty_server, stream):
    url = faulty_server.url + "/v1/completions"
    bad = httpx.post(url, json={"model": "fake", "prompt": list(PROMPT), "max_tokens": 20, "stream": stream},
                     timeout=30)
    if stream:  # the stream began: the error is its last event
        assert bad.status_code == 200
        last = [line for line in bad.text.splitlines() if line.startswith("data: ")][-1]
        assert json.loads(last[6:])["error"]["code"] == FAULT and "[DONE]" not in bad.text
    else:
        assert bad.status_code == 500 and bad.json()["error"]["code"] == FAULT
        assert "the engine failed on this request" in bad.json()["error"]["message"]
    good = httpx.post(url, json={"model": "fake", "prompt": list(PROMPT), "max_tokens": 5}, timeout=30)
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 5
    assert httpx.get(faulty_server.url + "/health").json()["status"] == "ok"
    assert "arcpy_faults_total 1.0" in httpx.get(faulty_server.url + "/metrics").text
