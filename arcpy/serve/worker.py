"""The worker: one thread owns the engine and decodes the jobs one at a time, first in, first out.

The engine is not thread-safe, and libarc keeps its error detail per thread: the worker thread
builds the engine, warms it up, decodes every job and closes it; no other thread touches it. The
engine and its captured graphs are built once and stay hot from job to job.

Pieces cross to the event loop through a Channel: the worker appends under a lock and wakes the
loop with call_soon_threadsafe only when no wake-up is pending, so a loop that falls behind takes
several pieces at once, and the worker never waits for it.

A job is cancelled from the event loop (the client went away, its time ran out, the server is
stopping): a queued job leaves the queue at once; the running one is cut at the next piece it
yields, and the engine ends the sequence (stats say "cancelled"); the rest of a burst in flight
retires on the device while the next sequence starts (Engine.start waits for it to reset the ring).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from arcpy.errors import ArcError, InvalidArgumentError
from arcpy.loop.request import Request
from arcpy.loop.stats import GenerationStats
from arcpy.sampling import Sampling
from arcpy.serve.metrics import Metrics

log = logging.getLogger("arcpy.serve")

# How a job failed (Failed.kind); the routes turn each into a status.
INVALID, FAULT, INTERNAL, SHUTDOWN, UNAVAILABLE = "invalid", "fault", "internal", "shutdown", "unavailable"


@dataclass(frozen=True)
class Done:
    """The sequence ended by itself (stats.finish_reason), or was cancelled."""

    stats: GenerationStats


@dataclass(frozen=True)
class Failed:
    kind: str       # INVALID, FAULT, INTERNAL, SHUTDOWN, UNAVAILABLE
    message: str


class Channel:
    """Items from any thread to one reader on the event loop, in order. put() never blocks."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list = []
        self._wake_pending = False
        self._waiter: asyncio.Future | None = None

    def put(self, item) -> None:
        with self._lock:
            self._items.append(item)
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list:
        """Everything put so far, waiting for at least one item (event loop only)."""
        while True:
            with self._lock:
                if self._items:
                    items, self._items = self._items, []
                    return items
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


@dataclass(eq=False)
class Job:
    request: Request        # the prompt as token ids, checked against the context
    channel: Channel
    name: str = ""          # the response's id, for the log
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: str = ""     # why it was cancelled ("disconnect", "timeout", "shutdown"); read per piece
    cancelled_at: float = 0.0
    echo_logprobs: int | None = None  # the prompt's own log-probabilities first (an echo), with these alternatives


@dataclass
class Echo:
    """The prompt's tokens, first on an echo's channel: (id, TokenLogprob or None for the first)."""
    entries: list


class QueueFull(Exception):
    pass


class Unavailable(Exception):
    pass


class Worker:
    """The engine's thread and its bounded FIFO queue of jobs (`max_queue` waiting, besides the
    one being decoded). `build()` makes the engine, in the worker thread."""

    def __init__(self, build: Callable[[], object], max_queue: int, metrics: Metrics | None = None,
                 warm_up: bool = True):
        self._build, self.max_queue, self._warm_up = build, max_queue, warm_up
        self.metrics = metrics or Metrics()
        self._cond = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._current: Job | None = None
        self._closing = False
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="arcpy-engine", daemon=True)
        # What the engine is, read once in the worker thread (immutable after start).
        self.backend = self.device_name = ""
        self.max_seq = self.vocab = 0
        self.poisoned: str | None = None
        self._clear_cache = False  # forget the engine's cached prefix before the next job

    # -- the event loop's side ---------------------------------------------------------------

    def start(self) -> "Worker":
        """Build the engine (and warm it up) in the worker thread; raise what building raised."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closing or not self._thread.is_alive():
                raise Unavailable("the server is shutting down")
            if self.poisoned:
                raise Unavailable(f"the engine is unusable: {self.poisoned}")
            if self._current is not None and len(self._queue) >= self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} waiting, --max-queue)")
            self._queue.append(job)
            self.metrics.queue_depth.set(len(self._queue))
            self._cond.notify()

    def cancel(self, job: Job, reason: str) -> None:
        """Cancel `job`: a queued one is dropped now and told so; the running one stops at its
        next piece. A job already finished is left alone."""
        with self._cond:
            if job.cancelled:
                return
            job.cancelled, job.cancelled_at = reason, time.perf_counter()
            queued = job in self._queue
            if queued:
                self._queue.remove(job)
                self.metrics.queue_depth.set(len(self._queue))
        if queued and reason == "shutdown":  # the client and the timer wake their handler themselves
            job.channel.put(Failed(SHUTDOWN, "the server is shutting down"))

    def clear_cache(self) -> None:
        """The next job prefills its whole prompt (and forgets the prefix the engine held): the
        worker thread clears it before it starts that job."""
        with self._cond:
            self._clear_cache = True
        self.metrics.cache_clears.inc()

    def stop(self) -> None:
        """Refuse new jobs and cancel every queued and running one (the server is stopping)."""
        with self._cond:
            self._closing = True
            jobs = list(self._queue) + ([self._current] if self._current else [])
            self._cond.notify_all()
        for job in jobs:
            self.cancel(job, "shutdown")

    def close(self) -> None:
        """stop(), then wait for the worker thread, which closes the engine."""
        self.stop()
        if self._thread.is_alive():
            self._thread.join()

    def state(self) -> dict:
        with self._cond:
            return {"queue_depth": len(self._queue), "running": int(self._current is not None),
                    "max_queue": self.max_queue, "alive": self._thread.is_alive() and not self._closing,
                    "poisoned": self.poisoned}

    # -- the worker thread -------------------------------------------------------------------

    def _main(self) -> None:
        try:
            engine = self._build()
        except BaseException as exc:  # noqa: BLE001 - handed to start(), which raises it
            self._error = exc
            self._ready.set()
            return
        try:
            self._describe(engine)
            if self._warm_up:
                self._warm(engine)
        except BaseException as exc:  # noqa: BLE001
            self._error = exc
            engine.close()
            self._ready.set()
            return
        self._ready.set()
        try:
            while (job := self._next()) is not None:
                self._serve(engine, job)
        finally:
            try:
                engine.close()
                log.info("engine closed")
            except ArcError as exc:
                log.error("closing the engine: %s", exc)

    def _describe(self, engine) -> None:
        dev = engine.device
        self.backend, self.max_seq, self.vocab = engine.backend, dev.max_seq, dev.vocab
        self.device_name = dev.capabilities.name

    def _warm(self, engine) -> None:
        """One short sequence per sampler, detokenized as a request's are, so that the first
        request meets no first-use costs (kernel modules load lazily on CUDA)."""
        for sampling in (Sampling(), Sampling(temperature=1.0, seed=0)):
            list(engine.stream(Request(prompt_ids=(0,), max_new_tokens=2, sampling=sampling)))

    def _next(self) -> Job | None:
        with self._cond:
            self._current = None
            self.metrics.running.set(0)
            while True:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return None
                job = self._queue.popleft()
                self.metrics.queue_depth.set(len(self._queue))
                if self.poisoned:  # queued before the engine became unusable
                    job.channel.put(Failed(UNAVAILABLE, f"the engine is unusable: {self.poisoned}"))
                    continue
                self._current = job
                self.metrics.running.set(1)
                return job

    def _serve(self, engine, job: Job) -> None:
        first = last = None
        with self._cond:
            clear, self._clear_cache = self._clear_cache, False
        if clear:
            engine.prefix.clear()
        try:
            if job.echo_logprobs is not None:
                ids = job.request.prompt_ids
                job.channel.put(Echo(list(zip(ids, [None, *engine.prompt_logprobs(ids, job.echo_logprobs)]))))
            with contextlib.closing(engine.stream(job.request)) as pieces:
                for piece in pieces:
                    job.channel.put(piece)
                    if piece.token is not None:
                        last = time.perf_counter()
                        first = first or last
                    if job.cancelled:
                        break
        except InvalidArgumentError as exc:  # checked before the job was queued; kept as a 400
            job.channel.put(Failed(INVALID, str(exc)))
        except ArcError as exc:
            self._failed(engine, job, FAULT, f"the engine failed on this request: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - a bug must cost one request, not the server
            log.exception("%s: internal error", job.name)
            self._failed(engine, job, INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
            return
        stats = dataclasses.replace(engine.stats)
        now = time.perf_counter()
        rate = (stats.tokens - 1) / (last - first) if first is not None and last > first else None
        self.metrics.sequence(stats, None if first is None else first - job.arrived, now - job.arrived, rate)
        if job.cancelled:
            self.metrics.cancel_seconds.observe(now - job.cancelled_at)
        job.channel.put(Done(stats))
        log.info("%s: %s after %d tokens in %.3f s%s; path %s, host waits %d%s", job.name, stats.finish_reason,
                 stats.tokens, now - job.arrived,
                 f", first token {(first - job.arrived) * 1e3:.1f} ms" if first is not None else "",
                 stats.path, stats.host_waits, f"; fell back: {stats.fallback}" if stats.fallback else "")

    def _failed(self, engine, job: Job, kind: str, message: str) -> None:
        self.metrics.faults.inc()
        if engine.stats is not None:
            stats = dataclasses.replace(engine.stats, finish_reason=engine.stats.finish_reason or "fault")
            self.metrics.sequence(stats, None, time.perf_counter() - job.arrived, None)
        if engine.poisoned:
            with self._cond:
                self.poisoned = engine.poisoned
        log.error("%s: %s", job.name, message)
        job.channel.put(Failed(kind, message))
