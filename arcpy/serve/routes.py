"""The routes of the application (arcpy/serve/app.py), each a function of the request; the service
they share (app.Service) is the application's `state.service`. Errors become OpenAI's error shape."""

from __future__ import annotations

import contextlib
import logging
from importlib import resources

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from arcpy.loop import gate
from arcpy.serve.metrics import CONTENT_TYPE
from arcpy.serve.schema import CHAT, COMPLETION, ApiError
from arcpy.serve.tokens import detokenize, tokenize

log = logging.getLogger("arcpy.serve")


def _service(request):
    return request.app.state.service


async def page(request):
    """The chat page: one HTML file of the package, which talks to /v1/chat/completions."""
    return HTMLResponse(PAGE, headers={"cache-control": "no-cache"})


PAGE = resources.files("arcpy.serve").joinpath("page.html").read_text(encoding="utf-8")


async def chat(request):
    return await _service(request).complete(request, CHAT)


async def completions(request):
    return await _service(request).complete(request, COMPLETION)


async def responses(request):
    return await _service(request).respond(request)


def _model_card(service) -> dict:
    return {"id": service.settings.model_name, "object": "model", "created": service.started,
            "owned_by": "arcpy", "max_model_len": service.worker.max_seq}


async def models(request):
    service = _service(request)
    service.authorize(request)
    return JSONResponse({"object": "list", "data": [_model_card(service)]})


async def model(request):
    service = _service(request)
    service.authorize(request)
    name = request.path_params["name"]
    if name != service.settings.model_name:
        raise ApiError(404, f"the model {name!r} does not exist", param="model", code="model_not_found")
    return JSONResponse(_model_card(service))


async def health(request):
    service = _service(request)
    w = service.worker
    state = w.state()
    ok = state["alive"] and not state["poisoned"]
    return JSONResponse({"status": "ok" if ok else "unavailable", "model": service.settings.model_name,
                         "backend": w.backend, "device": w.device_name, "max_seq": w.max_seq,
                         "device_loop_latched": gate.LATCH.reason, **state}, status_code=200 if ok else 503)


async def tokenize_route(request):
    service = _service(request)
    service.authorize(request)
    s, body = service.settings, await service.read_json(request)
    return JSONResponse(await run_in_threadpool(tokenize, body, s.model_name, service.text, service.worker.max_seq,
                                                s.defaults))


async def detokenize_route(request):
    service = _service(request)
    service.authorize(request)
    body = await service.read_json(request)
    return JSONResponse(detokenize(body, service.settings.model_name, service.text))


async def reset_prefix_cache(request):
    service = _service(request)
    service.authorize(request)
    service.worker.clear_cache()
    return JSONResponse({"status": "ok", "detail": "the next request prefills its whole prompt"})


async def metrics(request):
    return Response(await run_in_threadpool(_service(request).metrics.text), media_type=CONTENT_TYPE)


async def api_error(request, exc: ApiError):
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def http_error(request, exc: HTTPException):
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    error = ApiError(exc.status_code, message.get(exc.status_code, str(exc.detail)),
                     code="not_found" if exc.status_code == 404 else None)
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


async def internal_error(request, exc: Exception):
    log.exception("internal error on %s", request.url.path, exc_info=exc)
    error = ApiError(500, f"internal error: {type(exc).__name__}", type="server_error")
    return JSONResponse(error.body(), status_code=500)


@contextlib.asynccontextmanager
async def lifespan(app):
    service = app.state.service
    await run_in_threadpool(service.warm_up)  # the thread pool's first use costs ~15 ms
    yield
    await run_in_threadpool(service.worker.close)  # the worker thread closes the engine


ALL = [Route("/", page, methods=["GET"]),
       Route("/v1/chat/completions", chat, methods=["POST"]),
       Route("/v1/completions", completions, methods=["POST"]),
       Route("/v1/responses", responses, methods=["POST"]),
       Route("/v1/models", models, methods=["GET"]),
       Route("/v1/models/{name:path}", model, methods=["GET"]),
       Route("/health", health, methods=["GET"]),
       Route("/metrics", metrics, methods=["GET"]),
       # vLLM's name, and SGLang's: the ecosystem's two for forgetting cached prefixes
       Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
       Route("/flush_cache", reset_prefix_cache, methods=["POST"]),
       Route("/tokenize", tokenize_route, methods=["POST"]),
       Route("/detokenize", detokenize_route, methods=["POST"])]
ERRORS = {ApiError: api_error, HTTPException: http_error, Exception: internal_error}
