"""The answer to one job, whole or streamed (the application's, arcpy/serve/app.py): it waits
for the job's first event before it sends a status, so a request that fails before its first
token still gets its own status (400, 500, 503, 504); once the stream began, a failure is an
error event. While it waits it listens for the client leaving, and cancels the job then. A
completion's echo sends the prompt's text first, and its log-probabilities where asked for."""

from __future__ import annotations

import asyncio
import json
import time

from arcpy.loop.prompt import Piece
from arcpy.serve.schema import ApiError, Call
from arcpy.serve.shape import SSE_HEADERS, Shaper
from arcpy.serve.worker import FAULT, INTERNAL, INVALID, SHUTDOWN, Done, Echo, Failed, Job
from arcpy.text import StreamDecoder
from arcpy.text.answer import Splitter

_GONE, _TIMED_OUT = object(), object()  # the event loop's own marks in a job's channel

_FAILED_STATUS = {INVALID: (400, "invalid_request_error"), FAULT: (500, "server_error"),
                  INTERNAL: (500, "server_error"), SHUTDOWN: (503, "server_error")}


class JobResponse:
    """The answer to one job, whole or streamed; an ASGI application of its own."""

    def __init__(self, service, job: Job, call: Call, shaper: Shaper, splitter: Splitter | None = None,
                 echo: str | None = None):
        self.service, self.job, self.call, self.shaper = service, job, call, shaper
        self.splitter = splitter  # reasoning and tool calls read from the text, where the request has them
        self.echo = echo  # an echoed prompt's text, sent before the answer's
        self.ended = False     # the job's last event was read
        self.started = False   # the status was sent

    async def __call__(self, scope, receive, send) -> None:
        loop = asyncio.get_running_loop()
        watcher = loop.create_task(self._watch(receive))
        timeout = self.service.settings.timeout
        timer = None
        if timeout is not None:
            timer = loop.call_at(loop.time() + max(0.0, timeout - (time.perf_counter() - self.job.arrived)),
                                 self._cancel, _TIMED_OUT, "timeout")
        try:
            await (self._stream(send) if self.call.stream else self._whole(send))
        except OSError:  # the client is gone (the server's send raised)
            pass
        finally:
            watcher.cancel()
            if timer is not None:
                timer.cancel()
            if not self.ended:
                self.service.worker.cancel(self.job, "disconnect")

    async def _watch(self, receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._cancel(_GONE, "disconnect")

    def _cancel(self, mark, reason: str) -> None:
        self.job.channel.put(mark)
        self.service.worker.cancel(self.job, reason)

    def _error(self, item) -> ApiError | None:
        """The error a job's last event stands for; None for a sequence that ended by itself."""
        if isinstance(item, Failed):
            status, kind = _FAILED_STATUS.get(item.kind, (503, "server_error"))
            return ApiError(status, item.message, type=kind, code=item.kind)
        if item is _TIMED_OUT or (isinstance(item, Done) and item.stats.finish_reason == "cancelled"
                                  and self.job.cancelled == "timeout"):
            return ApiError(504, f"the request ran past the server's --timeout of "
                                 f"{self.service.settings.timeout:g} s", type="server_error", code="timeout")
        if isinstance(item, Done) and item.stats.finish_reason == "cancelled":
            return ApiError(503, "the server is shutting down", type="server_error", code=SHUTDOWN)
        return None

    def _echoed(self, item: Echo) -> list:
        """An echoed prompt's log-probability entries, each with the text it made final as the
        prompt streams through the decoder (so that they add up to the echo: a special token, or a
        character's first bytes, make none)."""
        words = StreamDecoder(self.service.text)
        out = [(tok, lp, words.push(tok)) for tok, lp in item.entries]
        if out:
            tok, lp, made = out[-1]
            out[-1] = (tok, lp, made + words.flush())
        return out

    def _collect(self, item, texts: list, entries: list) -> list | None:
        """A piece (its text, its log-probabilities, the splitter's deltas it makes) or an echo's
        entries into `texts` and `entries`; the deltas, or None where `item` ends the job."""
        if isinstance(item, Echo):
            entries.extend(self._echoed(item))
            return []
        if not isinstance(item, Piece):
            return None
        texts.append(item.text)
        if item.logprob is not None:
            entries.append((item.token, item.logprob, item.text))
        return self.splitter.push(item.text, item.token) if self.splitter is not None else []

    async def _whole(self, send) -> None:
        texts, entries = [self.echo or ""], []
        while True:
            for item in await self.job.channel.take():
                if self._collect(item, texts, entries) is not None:
                    continue
                self.ended = True
                if item is _GONE:
                    return
                error = self._error(item)
                if error is not None:
                    return await self._send_json(send, error.status, error.body())
                answer = None
                if self.splitter is not None:
                    self.splitter.finish()
                    answer = self.splitter.answer
                wanted = self.call.request.logprobs is not None
                return await self._send_json(send, 200, self.shaper.body("".join(texts), item.stats, answer,
                                                                          entries if wanted else None))

    async def _stream(self, send) -> None:
        deltas = []  # the splitter's, where the answer is split
        echo = self.echo
        while True:
            texts, entries, tokens, end = [], [], 0, None
            if echo is not None:  # the prompt's text opens the answer, its entries too when asked for
                texts.append(echo)
                echo = None
            for item in await self.job.channel.take():
                split = self._collect(item, texts, entries)
                if split is None:
                    end = item
                    break
                deltas.extend(split)
                tokens += isinstance(item, Piece) and item.token is not None
            if end is _GONE:
                self.ended = True
                return
            error = None if end is None else self._error(end)
            data = b""
            if not self.started:
                if error is not None:
                    self.ended = True
                    return await self._send_json(send, error.status, error.body())
                await send({"type": "http.response.start", "status": 200, "headers": self._headers(
                    b"text/event-stream; charset=utf-8", SSE_HEADERS)})
                self.started = True
                data = self.shaper.first_chunk()
            self.shaper.sent += tokens
            if self.splitter is None:
                text = "".join(texts)
                if text or entries:
                    data += self.shaper.text_chunk(text, entries)
            else:  # (log-probabilities are not split with the answer: a split answer carries none)
                if end is not None and error is None:
                    deltas += self.splitter.finish()
                data += b"".join(self.shaper.delta_chunk(d) for d in deltas)
                deltas.clear()
            if end is not None:
                self.ended = True
                calls = self.splitter is not None and bool(self.splitter.answer.tool_calls)
                data += self.shaper.error_event(error.body()) if error else self.shaper.last_chunks(end.stats, calls)
            if data or end is not None:
                await send({"type": "http.response.body", "body": data, "more_body": end is None})
            if end is not None:
                return

    def _headers(self, content_type: bytes, extra: dict) -> list:
        return ([(b"content-type", content_type), (b"x-request-id", self.shaper.id.encode())]
                + [(k.encode(), v.encode()) for k, v in extra.items()])

    async def _send_json(self, send, status: int, body: dict) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        headers = self._headers(b"application/json", {"content-length": str(len(data))})
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
