"""The ASGI application (Starlette) and the service its routes share (the routes themselves are
arcpy/serve/routes.py).

A completion request (chat, text, or a Responses request read as a chat one) is read (at most
--max-body bytes), parsed (schema), its prompt rendered and encoded off the event loop and
checked against the context, then queued for the worker; its
response (arcpy/serve/response.py) waits for the first event before it sends a status, so a
request that fails before its first token still gets its own status (400, 500, 503, 504); once
the stream began, a failure is an error event, which OpenAI's clients raise. While it waits, the
response also listens for the client leaving: then the job is cancelled (dropped from the queue,
or cut at its next token).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from dataclasses import dataclass, replace

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from arcpy import __version__
from arcpy.errors import ArcError
from arcpy.loop.constrain import compile_constraint, resolve
from arcpy.loop.prompt import ContextFull, check_budget, check_prompt, request_ids, room_hint
from arcpy.loop.request import Request
from arcpy.text.answer import Splitter, split_options
from arcpy.serve import events, responses, routes
from arcpy.serve.schema import ApiError, Call, Defaults, bad, parse
from arcpy.serve.shape import Shaper
from arcpy.text import decode, token_text
from arcpy.serve.response import JobResponse
from arcpy.serve.worker import Channel, Job, QueueFull, Unavailable, Worker

# The paths /metrics counts responses by (a path with a parameter counts under its pattern)
COUNTED = {r.path for r in routes.ALL if "{" not in r.path}
INLINE_PROMPT_CHARS = 1024


@dataclass(frozen=True)
class Settings:
    model_name: str
    model_max_seq: int            # the model's own context, for the message of a too-long prompt
    api_key: str | None = None
    max_body: int = 1 << 20
    timeout: float | None = 600.0  # per request, from its arrival; None: none
    defaults: Defaults = Defaults()
    stored_responses: int = responses.STORED  # /v1/responses kept for previous_response_id


class Service:
    """What the routes share: the worker, the model's text, the settings."""

    def __init__(self, worker: Worker, text, settings: Settings):
        self.worker, self.text, self.settings = worker, text, settings
        self.metrics = worker.metrics
        self.started = int(time.time())
        self.fingerprint = f"arcpy-{__version__}-{worker.backend}"
        self.stored = responses.Store(settings.stored_responses)

    def warm_up(self) -> None:
        """Compile the chat template and run the tokenizer once, so that the first request does
        not pay for it (a thread)."""
        if self.text is None:
            return
        with contextlib.suppress(ArcError):
            request_ids(self.text, Request(messages=[{"role": "user", "content": "Hello."}]))
            request_ids(self.text, Request(prompt="Hello."))

    def authorize(self, request: HttpRequest) -> None:
        key = self.settings.api_key
        if key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(401, "no API key: send the header 'Authorization: Bearer KEY' (this server's --api-key)",
                           code="invalid_api_key")
        if not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise ApiError(401, "incorrect API key", code="invalid_api_key")

    async def read_json(self, request: HttpRequest):
        limit = self.settings.max_body
        length = request.headers.get("content-length", "")
        too_big = ApiError(413, f"the request body is larger than {limit} bytes (the server's --max-body)",
                           code="request_too_large")
        if length.isdigit() and int(length) > limit:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise bad(f"the request body is not valid JSON: {str(exc)[:200]}") from None

    def token_text(self, token: int) -> str:
        return token_text(self.text, token)

    def prepare(self, request: Request, budget_field: str | None = None,
                constraint_field: str = "tool_choice") -> tuple[list[int], Request, dict | None]:
        """The prompt's ids (prompt_ids, with the budget `budget_field` names checked), the request
        the worker decodes (the prompt as those ids, a constraint compiled once here so that a bad
        one is a 400 naming `constraint_field`, the body's field it came from), and how to split
        its answer (None: as plain text)."""
        ids = self.prompt_ids(request, budget_field)
        try:
            constraint = resolve(self.text, request)
            compile_constraint(self.text, self.worker.vocab, constraint)
        except ArcError as exc:
            raise bad(str(exc), param=constraint_field) from None
        job = replace(request, prompt=None, messages=None, template_kwargs={}, tools=None, tool_choice=None,
                      response_format=constraint, prompt_ids=ids)
        if request.messages is None:
            return ids, job, None
        return ids, job, split_options(self.text, ids, request.template_tools,
                                       reasoning=not self.settings.defaults.raw_reasoning,
                                       constrained=constraint is not None)

    def prompt_ids(self, request: Request, budget_field: str | None = None) -> list[int]:
        """The prompt as token ids, checked against the vocabulary and the context (arcpy.loop.prompt),
        and the budget too where the client gave one (`budget_field` names it)."""
        where = "messages" if request.messages else "prompt"
        try:
            ids = request_ids(self.text, request)
        except ArcError as exc:  # the chat template refused the messages, or they are too long for it
            raise bad(str(exc), param=where) from None
        context, larger = self.worker.max_seq, "the server's --max-seq sets it"
        try:
            check_prompt(ids, self.worker.vocab, context,
                         hint=f": {room_hint(len(ids) + 1, context, self.settings.model_max_seq, larger)}")
        except ContextFull as exc:
            raise bad(str(exc), param=where, code="context_length_exceeded") from None
        except ArcError as exc:
            raise bad(f"prompt: {exc}", param="prompt") from None
        for t, _ in request.logit_bias:
            if t >= self.worker.vocab:
                raise bad(f"logit_bias: token id {t} is outside the vocabulary [0, {self.worker.vocab})",
                          param="logit_bias")
        if budget_field is not None:
            try:
                check_budget(ids, request.max_new_tokens, context, budget_field)
            except ContextFull as exc:
                fix = room_hint(len(ids) + request.max_new_tokens, context, self.settings.model_max_seq, larger,
                                "ask for fewer or shorten the prompt")
                raise bad(f"{exc}; {fix}", param=budget_field, code="context_length_exceeded") from None
        return ids

    async def _body(self, request: HttpRequest):
        """The request's JSON, once its key is checked; None where the client left while sending it."""
        self.authorize(request)
        try:
            return await self.read_json(request)
        except ClientDisconnect:
            return None

    async def complete(self, request: HttpRequest, kind: str):
        """POST /v1/chat/completions and /v1/completions."""
        arrived = time.perf_counter()
        body = await self._body(request)
        if body is None:
            return Response(status_code=499)  # nobody to answer
        s = self.settings
        call = parse(kind, body, s.model_name, s.defaults)
        return await self.submit(call, arrived, lambda prompt_tokens: Shaper(
            kind, s.model_name, self.fingerprint, call.include_usage, self.token_text, call.continuous_usage,
            prompt_tokens))

    async def respond(self, request: HttpRequest):
        """POST /v1/responses: the request read as a chat completion's (arcpy/serve/responses.py),
        its answer in the Responses API's shape (arcpy/serve/events.py)."""
        arrived = time.perf_counter()
        body = await self._body(request)
        if body is None:
            return Response(status_code=499)
        turn = responses.parse(body, self.settings.model_name, self.settings.defaults, self.stored)
        try:
            return await self.submit(turn.call, arrived, lambda prompt_tokens: events.ResponseShaper(
                turn, self.settings.model_name, self.stored))
        except ApiError as exc:  # the prompt, the budget or a constraint refused: in the Responses API's names
            raise responses.renamed(exc) from None

    async def submit(self, call: Call, arrived: float, shaper_of) -> JobResponse:
        """Queue the job of a parsed request; its response, shaped by `shaper_of(prompt_tokens)`."""
        r = call.request
        size = len(r.prompt or "") + sum(len(m.content) for m in r.messages or ())
        # A short prompt is rendered and encoded here (well under a millisecond): a thread's
        # round trip would cost more than it saves. A long one goes to the thread pool.
        inline = size <= INLINE_PROMPT_CHARS and r.response_format is None and not r.tools
        ids, request, split = (self.prepare(r, call.budget_field, call.constraint_field) if inline
                               else await run_in_threadpool(self.prepare, r, call.budget_field, call.constraint_field))
        shaper = shaper_of(len(ids))
        job = Job(request, Channel(asyncio.get_running_loop()), name=shaper.id, arrived=arrived,
                  echo_logprobs=r.logprobs if call.echo else None)
        try:
            self.worker.submit(job)
        except QueueFull as exc:
            raise ApiError(503, f"{exc}: try again shortly", type="server_error", code="queue_full",
                           headers={"retry-after": "1"}) from None
        except Unavailable as exc:
            raise ApiError(503, str(exc), type="server_error", code="unavailable") from None
        echo = decode(self.text, ids) if call.echo else None  # what the echoed tokens make, as they stream
        return JobResponse(self, job, call, shaper, None if split is None else Splitter(**split), echo)


def create_app(service: Service) -> Starlette:
    app = Starlette(routes=routes.ALL, lifespan=routes.lifespan, exception_handlers=routes.ERRORS)
    app.state.service = service
    return _Counted(app, service.metrics)


class _Counted:
    """Counts every response by route and status (arcpy_http_responses_total)."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        route = path if path in COUNTED else "/v1/models/{name}" if path.startswith("/v1/models/") else "other"

        async def counted(message):
            if message["type"] == "http.response.start":
                self.metrics.responses.labels(route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)
