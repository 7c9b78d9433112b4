"""`arcpy serve` (and `python -m arcpy.serve`): the OpenAI-compatible HTTP server on uvicorn.

Start-up in order: every flag checked, the address bound (a busy port fails before the model
loads), the model and its tokenizer read, the engine built and warmed up in its worker thread,
then the server runs. SIGINT or SIGTERM stops it: no new requests, the running and queued ones
are cut (a 503, or an error event in a stream that began), the engine is closed, exit status 0.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
from dataclasses import dataclass

import click

from arcpy.errors import ArcError
from arcpy.front import check_backend, check_context, model_or_demo, note, one_line_errors, open_engine, open_model
from arcpy.loop import gate
from arcpy.loop.request import DEFAULT_MAX_NEW_TOKENS, TemplateKwargs
from arcpy.options import (EngineOptions, ModelOptions, SamplingOptions, as_records, check_model, engine_options,
                           model_options, parse_template_kwargs, sampling_options, template_options, with_options)
from arcpy.sampling import Sampling
from arcpy.serve.responses import STORED
from arcpy.serve.schema import Defaults

# The decoding thread spins on the ring while tokens land; Python hands the GIL to a waiting thread
# only after the switch interval (5 ms by default), so the event loop would wait that long to send
# each token. A short interval bounds that wait; it costs nothing while the event loop is idle.
SWITCH_INTERVAL = 1e-4
GRACEFUL_SECONDS = 5  # after a stop signal, how long open connections may take to close


@click.command("serve", context_settings={"help_option_names": ["-h", "--help"]})
@with_options(model_options("A Hugging Face model directory or a .gguf file, with a tokenizer",
                            "Default: the demo model."))
@click.option("--model-name", default=None,
              help="The id clients send as `model` [default: --model's name on the hub, else the model's file or "
                   "folder name].")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port to listen on (0: any free one, printed at start).")
@click.option("--api-key", envvar="ARCPY_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on /v1 (also read from ARCPY_API_KEY).")
@click.option("--max-queue", type=click.IntRange(0, 1_000_000), default=32, show_default=True,
              help="Requests that may wait while one is decoded; beyond that a 503 with Retry-After.")
@click.option("--timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="Seconds a request may take from its arrival (queue included); 0: no limit.")
@click.option("--max-body", type=click.IntRange(min=1024), default=1 << 20, show_default=True,
              help="Largest request body in bytes (beyond it: 413).")
@click.option("--stored-responses", type=click.IntRange(min=0), default=STORED, show_default=True,
              help="/v1/responses answers kept in memory for a later previous_response_id (the least recently "
                   "used forgotten first); 0: none.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=DEFAULT_MAX_NEW_TOKENS, show_default=True,
              help="New tokens for a request that sets no max_tokens.")
@with_options(sampling_options(1.0, 2.0, seed=False, helps={
    "temperature": "Temperature for a request that sets none (OpenAI's default is 1; 0 is greedy).",
    "top_p": "top_p for a request that sets none.", "top_k": "top_k for a request that sets none (0: off)."}))
@with_options(template_options("A keyword argument for the chat template of every chat request, under the "
                              "request's own chat_template_kwargs"))
@click.option("--raw-reasoning", is_flag=True, default=False,
              help="Keep a reasoning model's <think>...</think> in the content, as written, instead of in "
                   "reasoning_content.")
@with_options(engine_options("Device-loop steps enqueued per burst (a cancel takes effect within one)."))
@click.option("--prompt-cache-bytes", type=click.IntRange(min=0), default=None,
              help="Device memory for the KV rows of earlier prompts (their prefixes, least recently used "
                   "evicted first); 0: none. Default: a tenth of what is free after start-up, printed.")
@click.option("--switch-interval", type=click.FloatRange(1e-6, 1.0), default=SWITCH_INTERVAL, show_default=True,
              help="Python's thread switch interval in seconds: how long the event loop may wait for the "
                   "decoding thread to let go of the interpreter.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
@click.option("--access-log/--no-access-log", default=True, show_default=True, help="One line per HTTP request.")
@as_records
def main(**options):
    """Serve a model over the OpenAI HTTP API (chat and text completions, streamed or whole)."""
    sys.exit(run(ServeOptions(**options)))


@dataclass(frozen=True)
class ServeOptions:
    """What the serve command's options say, one record (main builds it)."""

    model_opts: ModelOptions = ModelOptions()
    model_name: str | None = None          # the id clients send as `model`
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_queue: int = 32                    # requests that may wait while one is decoded
    timeout: float = 600.0                 # seconds a request may take from its arrival; 0: no limit
    max_body: int = 1 << 20                # bytes
    max_tokens: int = DEFAULT_MAX_NEW_TOKENS  # for a request that sets none
    template_kwargs: tuple = ()            # --template-kwarg KEY=VALUE, as typed
    raw_reasoning: bool = False
    prompt_cache_bytes: int | None = None  # None: the device's default
    stored_responses: int = STORED
    switch_interval: float = SWITCH_INTERVAL
    log_level: str = "info"
    access_log: bool = True
    engine_opts: EngineOptions = EngineOptions()
    sampling_opts: SamplingOptions = SamplingOptions(1.0)


def run(options: ServeOptions) -> int:
    """The server, start to stop; the exit status. Mistakes are one line on stderr."""
    o = options
    try:
        if o.api_key is not None and not o.api_key.strip():
            raise click.UsageError("--api-key is empty")
        check_model(o.model_opts.model_path, o.model_opts.revision)
        model_path = model_or_demo(o.model_opts.model_path)
        s = o.sampling_opts
        defaults = Defaults(o.max_tokens, 0.0 if s.temperature < 1e-6 else s.temperature, s.top_p, s.top_k,
                            TemplateKwargs(parse_template_kwargs(o.template_kwargs)), o.raw_reasoning)
        Sampling(defaults.temperature, s.top_k, s.top_p)
        check_backend(o.engine_opts)
        sock = _bind(o.host, o.port)
    except click.UsageError as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        return 2
    except (ArcError, OSError) as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    _configure_logging(o.log_level)
    worker = None
    with one_line_errors() as errors:
        try:
            worker, app, name = _start(model_path, o, defaults)
            bound = sock.getsockname()
            where = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            click.echo(f"arcpy serve: {name} on http://{where}:{bound[1]}/v1 (backend {worker.backend}, "
                       f"{worker.device_name}; context {worker.max_seq}); a chat page at http://{where}:{bound[1]}/; "
                       "Ctrl-C stops", err=True)
            _serve(app, sock, worker, o)
        finally:
            if worker is not None:
                worker.close()
            sock.close()
    if errors.status:
        return errors.status
    click.echo("arcpy serve: stopped; the engine is closed", err=True)
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """The listening address, bound now (it listens once the server runs: until then a client is
    refused, not left waiting)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise OSError(f"--host {host}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def _start(model_path: str, o: ServeOptions, defaults: Defaults):
    """The model read, the worker started (it builds and warms up the engine in its thread), the
    application over them; and the name clients send as `model`."""
    from arcpy.serve.app import Service, Settings, create_app
    from arcpy.serve.metrics import Metrics
    from arcpy.serve.worker import Worker

    model, text = open_model(model_path, revision=o.model_opts.revision)
    if text is None:
        raise click.UsageError(f"{model.name} has no tokenizer (tokenizer.json): the server answers text")
    check_context(model, o.engine_opts)

    def build():
        engine = open_engine(model, text, o.engine_opts, prompt_cache_bytes=o.prompt_cache_bytes)
        p = engine.prefix
        if p.capacity:
            note(f"prompt cache: {p.capacity / 1e9:.2f} GB for earlier prompts' KV rows, "
                 f"{p.capacity // p.row_bytes} positions (--prompt-cache-bytes)")
        return engine

    worker = Worker(build, o.max_queue, Metrics(latched=lambda: gate.LATCH.latched)).start()
    name = o.model_name or model.name
    settings = Settings(name, model.config.max_seq, o.api_key, o.max_body, o.timeout or None, defaults,
                        o.stored_responses)
    return worker, create_app(Service(worker, text, settings)), name


def _serve(app, sock, worker, o: ServeOptions) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            worker.stop()  # cut the running and queued requests, so that connections close now
            await super().shutdown(sockets)

    config = uvicorn.Config(app, log_level=o.log_level, access_log=o.access_log, lifespan="on",
                            timeout_graceful_shutdown=GRACEFUL_SECONDS)
    sys.setswitchinterval(o.switch_interval)
    # uvicorn catches SIGINT and SIGTERM, stops, then raises the signal again for the handler it
    # found: this one, so that a clean stop ends in the `return 0` above.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        Server(config).run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    logger = logging.getLogger("arcpy")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


if __name__ == "__main__":
    main()
