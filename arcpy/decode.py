"""The main job: give a model a prompt, stream the answer, report how fast and by which path.

    python -m arcpy.decode                                  # the demo model answers a question
    python -m arcpy.decode --model DIR_OR_GGUF --chat --prompt "Why is the sky blue?"
    python -m arcpy.decode --model org/name-GGUF:Q4_K_M --chat --prompt "Hi"   # a name of the hub
    python -m arcpy.decode --model QWEN3.gguf --chat --template-kwarg enable_thinking=false --prompt "Hi"
    python -m arcpy.decode --shape stories15M --prompt-ids "1 2 3"
    python -m arcpy.decode --help

The generated text goes to stdout as it lands; everything else (the model, notes, statistics)
goes to stderr. A model without a tokenizer (the synthetic presets) prints token ids instead.
Errors are one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import dataclasses
import os
import re
import select
import stat
import sys
import time
from pathlib import Path

import click

from arcpy import __version__, _lib, backends, demo
from arcpy.checks import quoted
from arcpy.codes import FORMAT_BF16, FORMAT_NAMES, MAX_TOP_LOGPROBS
from arcpy.errors import ArcError, NoDeviceError
from arcpy.files import read_json_file
from arcpy.loading import load_checkpoint
from arcpy.loop import gate
from arcpy.loop.constrain import check_constraint, compile_constraint, resolve
from arcpy.loop.engine import Engine
from arcpy.loop.prompt import Piece, check_prompt, context_of, request_ids, room_hint
from arcpy.loop.request import Request
from arcpy.loop.stats import DEVICE_LOOP
from arcpy.model import SHAPES, Model, is_matrix, synthetic_model
from arcpy.model.hub import resolve_model
from arcpy.options import (EngineOptions, PrefillProgress, SamplingOptions, about, as_engine_options, check_model,
                            engine_options, model_options, parse_template_kwargs, sampling_options, template_options,
                            with_options)
from arcpy.text import TextSpec, token_text

DEMO_QUESTION = "What is the capital of France? Answer in one sentence."
DEMO_MAX_NEW = 48
WEIGHTS = {"auto": None, "quantized": True, "bf16": False}  # --weights -> load_checkpoint's `quantized`
_IDS = re.compile(r"[0-9]+(?:[ ,]+[0-9]+)*")
MAX_ID_DIGITS = 10  # a token id is below 2**31


def parse_ids(text: str) -> list[int]:
    """Token ids as ASCII digits separated by spaces or commas; nothing else is read as a number
    (Python's int() would take '1_0' as 10 and other scripts' digits)."""
    stripped = text.strip(" ,")
    if not _IDS.fullmatch(stripped):
        raise click.UsageError(f"expected token ids (digits 0-9) separated by spaces or commas, got {quoted(text)}")
    ids = []
    for word in re.split(r"[ ,]+", stripped):
        digits = word.lstrip("0") or "0"
        if len(digits) > MAX_ID_DIGITS or int(digits) >= 2**31:
            raise click.UsageError(f"token id {quoted(word, 24)} is too large (at most {2**31 - 1})")
        ids.append(int(digits))
    return ids


def open_engine(model: Model, text: TextSpec | None, options: EngineOptions, **load) -> Engine:
    """The engine `options` ask for (the CUDA one where "auto" finds a GPU), with the notes a user
    of the command line is owed: the slow NumPy backend, a --speculate that cannot take effect.
    `load`: more of Engine.load's arguments (the server's prompt_cache_bytes, a prefill_progress)."""
    backend = _lib.auto_backend() if options.backend == "auto" else options.backend
    if backend == "numpy":
        note(f"decoding on the NumPy reference backend, which is slow ({_lib.cuda_available()[1]})")
    engine = backends.open_engine(model, backend, text, max_seq=options.max_seq, device_loop=options.device_loop,
                                  burst=options.burst, speculate=options.drafts, draft_memory=options.draft_memory,
                                  devices=list(range(options.tensor_parallel)) if options.tensor_parallel > 1 else None,
                                  **load)
    speculation_note(options.drafts, engine)
    return engine


def speculation_note(drafts: int | None, engine) -> None:
    """A note where --speculate N was asked for and the engine cannot take it (the default, where
    it cannot, is silent: `engine.stats.speculation` says why)."""
    caps = engine.device.capabilities
    if drafts and not caps.speculate_k:
        why = caps.speculation_refused or f"the {engine.backend} backend has no device loop to run it"
        note(f"--speculate {drafts} has no effect: {why}")


def decode_options(f):
    options = [
        click.version_option(__version__, "--version", prog_name="arcpy"),
        *model_options("A Hugging Face model directory (config.json, safetensors, tokenizer.json), a .gguf file "
                       "or a folder holding one", "Default: the demo model (fetched on first use unless ARC_OFFLINE "
                       "is on), else --shape."),
        click.option("--shape", type=click.Choice(sorted(SHAPES)), default=None,
                     help="A synthetic preset (random weights, fixed seed, no tokenizer) instead of a model."),
        click.option("--prompt", default=None, help="The prompt, as text (needs a model with a tokenizer)."),
        click.option("--prompt-ids", default=None, help="The prompt as token ids, e.g. '1 450 4996'."),
        click.option("--chat", is_flag=True, help="Render the prompt through the model's chat template."),
        click.option("--system", default=None, help="A system message for --chat."),
        *template_options(),
        click.option("-n", "--max-new-tokens", type=click.IntRange(min=0), default=None,
                     help=f"At most this many new tokens [default: 64; {DEMO_MAX_NEW} for the demo question]."),
        click.option("--stop-id", "stop_ids", type=click.IntRange(min=0), multiple=True,
                     help="Also stop at this token id (repeatable); the model's end-of-sequence ids always stop."),
        click.option("--stop", "stop_strings", multiple=True,
                     help="Stop at this text (repeatable); no part of it is printed."),
        click.option("--json-schema", "json_schema", type=click.Path(dir_okay=False), default=None,
                     help="A JSON schema file: the answer is JSON valid by it (constrained token by token)."),
        click.option("--weights", type=click.Choice(sorted(WEIGHTS)), default="auto", show_default=True,
                     help="A GGUF file's quantized matrices: kept quantized, made bf16, or auto (quantized where the "
                          "model reads 1 GiB a token or more in bf16; below that bf16 decodes faster)."),
        *engine_options(),
        *sampling_options(helps={"seed": "Seed of the sampler (non-greedy sampling): the same tokens on either "
                                         "path. Default: a fresh one."}),
        click.option("--logprobs", type=click.IntRange(0, MAX_TOP_LOGPROBS), default=None, metavar="N",
                     help="After the answer, each token's log-probability and its N likeliest alternatives, on "
                          "stderr (computed in the device loop's step)."),
    ]
    return with_options(options)(as_engine_options(f))


def note(message: str) -> None:
    click.echo(f"note: {message}", err=True)


class ProgressBar:
    """A progress bar on stderr while a model loads, drawn only when stderr is a terminal. Called
    as progress(done, total)."""

    def __init__(self, label: str):
        self.label, self.bar, self.done = label, None, 0

    def __enter__(self) -> "ProgressBar":
        return self

    def __call__(self, done: int, total: int) -> None:
        if not sys.stderr.isatty():
            return
        if self.bar is None:
            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr)
            self.bar.__enter__()
        self.bar.update(done - self.done)
        self.done = done

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


def demo_model(offline: bool) -> Path | None:
    """The demo model's file, fetched first where it is absent; None, said in a note, where it is
    absent and ARC_OFFLINE forbids the fetch."""
    path = demo.demo_model_path()
    if path is not None:
        return path
    if offline:
        note(f"the demo model is not fetched and {demo.OFFLINE} is on ({demo.FETCH_HINT}): "
             "decoding the synthetic stories15M")
        return None
    note(demo.fetch_note())
    try:
        return demo.fetch_demo_model(progress=True)
    except ArcError as exc:
        raise ArcError(f"{exc} ({demo.OFFLINE}=1 decodes the synthetic stories15M instead)") from exc


def model_or_demo(model_path: str | None) -> str:
    """--model, or for a command that needs a real model the demo model's file, fetched first where
    it is absent (unless ARC_OFFLINE forbids it: then a usage error)."""
    if model_path is not None:
        return model_path
    if demo.demo_model_path() is None and demo.offline():
        raise click.UsageError(f"give --model: the demo model is not fetched and {demo.OFFLINE} is on "
                               f"({demo.FETCH_HINT})")
    return str(demo_model(False))


def load(model_path: str | None, shape: str | None, weights: str = "auto",
         revision: str | None = None) -> tuple[Model, TextSpec | None]:
    """The model and its text (None without a tokenizer); the demo model where neither is given.
    `model_path` is a path here or a name of the hub (fetched where it is not in the cache:
    arcpy.model.hub), `revision` its branch, tag or commit. `weights` (WEIGHTS) says how a GGUF
    file's quantized tensors are held. Nothing is on the GPU yet."""
    if model_path is None and shape is None:
        path = demo_model(demo.offline())
        if path is None:
            shape = "stories15M"
        else:
            model_path = str(path)
    if shape is not None:
        return synthetic_model(shape), None
    resolved = resolve_model(model_path, revision, f"{demo.OFFLINE} is on" if demo.offline() else None)
    if resolved.note is not None:
        note(resolved.note)
    started = time.perf_counter()
    with ProgressBar(f"loading {resolved.name or Path(model_path).name}") as bar:
        model, text = load_checkpoint(resolved.path, progress=bar, quantized=WEIGHTS[weights])
    if resolved.name is not None:
        model.name = resolved.name
    click.echo(f"loaded {model.name} in {time.perf_counter() - started:.1f} s", err=True)
    for line in model.notes:
        note(line)
    return model, text


def held(model: Model) -> str:
    """How a quantized model's matrices are held, e.g. ", matrices 192 Q4_K, 33 Q6_K"; "" for bf16."""
    formats = [model.format_of(name) for name in model.tensors if is_matrix(name)]
    if all(f == FORMAT_BF16 for f in formats):
        return ""
    return ", matrices " + ", ".join(f"{formats.count(f)} {FORMAT_NAMES[f]}" for f in sorted(set(formats)))


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How to run a request: which model, on which backend and path."""

    model_path: str | None
    shape: str | None
    engine: EngineOptions = EngineOptions()
    weights: str = "auto"       # WEIGHTS
    question: bool = False      # no prompt was given: ask the built-in question, where the model has text
    budget_given: bool = True   # -n was given (else the built-in question has a budget of its own)
    template_kwargs: dict = dataclasses.field(default_factory=dict)  # --template-kwarg, for the question
    revision: str | None = None  # of a model named on the hub


def read_prompt(prompt: str | None, prompt_ids: str | None, stdin=None) -> str | None:
    """The prompt text: `--prompt -` reads standard input; so does a prompt piped in without
    --prompt (what is there already, or a file: an open terminal or an idle pipe is not read)."""
    stdin = stdin or sys.stdin
    if prompt == "-":
        return stdin.read()
    if prompt is None and prompt_ids is None and stdin is not None and not stdin.isatty() and _ready(stdin):
        piped = stdin.read()
        return piped if piped.strip() else None
    return prompt


def _ready(stream) -> bool:
    try:
        fd = stream.fileno()
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return True
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):  # no descriptor (a test's stream) or a closed one
        return False


def plan(model_path, shape, prompt, prompt_ids, chat, system, max_new_tokens, stop_ids, stop_strings,
         sampling_opts: SamplingOptions = SamplingOptions(), engine_opts: EngineOptions = EngineOptions(),
         weights="auto", template_kwargs=(),
         stdin=None, json_schema=None, logprobs=None, revision=None) -> tuple[Request, RunOptions]:
    """Every argument checked, nothing loaded: the request and how to run it. Where no prompt was
    given, the request's prompt is token id 1, and `run_decode` asks the built-in question instead
    once it sees that the model has text."""
    prompt = read_prompt(prompt, prompt_ids, stdin)
    if prompt is not None and prompt_ids is not None:
        raise click.UsageError("give --prompt or --prompt-ids, not both")
    if model_path is not None and shape is not None:
        raise click.UsageError("give --model or --shape, not both")
    check_model(model_path, revision)
    if system is not None and not chat:
        raise click.UsageError("--system needs --chat")
    kwargs = parse_template_kwargs(template_kwargs)
    if kwargs and not chat:
        raise click.UsageError("--template-kwarg needs --chat")
    if chat and prompt_ids is not None:
        raise click.UsageError("--chat takes --prompt text, not --prompt-ids")
    if shape is not None and (prompt is not None or chat or stop_strings or json_schema):
        what = "--prompt" if prompt is not None else "--chat" if chat else "--stop" if stop_strings else "--json-schema"
        raise click.UsageError(f"{what} needs a model with a tokenizer; the synthetic {shape} has none: "
                               "use --prompt-ids")
    sampling = sampling_opts.sampling()
    if sampling.temperature == 0.0 and (sampling.top_k > 1 or sampling.top_p < 1.0 or sampling.seed is not None):
        used = [o for o, on in (("--top-k", sampling.top_k > 1), ("--top-p", sampling.top_p < 1.0),
                                ("--seed", sampling.seed is not None)) if on]
        note(f"{' and '.join(used)} {'has' if len(used) == 1 else 'have'} no effect without --temperature: "
             "decoding greedily")
    gate.read_all()
    demo.offline()  # read like the gates: a bad value is an error on every run
    if engine_opts.backend == "cuda" and not _lib.cuda_available()[0]:
        raise NoDeviceError(f"{_lib.cuda_available()[1]}; --backend cuda needs one (auto or numpy decode on the CPU)")
    if prompt_ids is not None:
        source = {"prompt_ids": parse_ids(prompt_ids)}
    elif prompt is None:
        source = {"prompt_ids": (1,)}
    elif chat:
        messages = ([{"role": "system", "content": system}] if system is not None else [])
        source = {"messages": messages + [{"role": "user", "content": prompt}]}
    else:
        source = {"prompt": prompt}
    if json_schema is not None:
        with about("--json-schema"):
            schema = read_json_file(Path(json_schema), "JSON schema")
        source["response_format"] = {"type": "json_schema", "json_schema": {"name": "cli", "schema": schema}}
    request = Request(**source, max_new_tokens=64 if max_new_tokens is None else max_new_tokens,
                      stop_ids=stop_ids, stop=stop_strings, sampling=sampling,
                      template_kwargs=kwargs if "messages" in source else {}, logprobs=logprobs)
    with about("--json-schema"):
        check_constraint(request.response_format)  # the schema, before the model loads
    return request, RunOptions(model_path, shape, engine_opts, weights, question=prompt is None and prompt_ids is None,
                               budget_given=max_new_tokens is not None, template_kwargs=kwargs,
                               revision=revision)


def with_prompt(request: Request, model: Model, text: TextSpec | None, run: RunOptions) -> Request:
    """The request with its prompt as token ids, checked against the model before the engine is
    built: the built-in question where none was given, text encoded, the context's room."""
    if run.question and text is not None:
        click.echo(f"question: {DEMO_QUESTION}", err=True)
        request = dataclasses.replace(request, prompt_ids=None, messages=[{"role": "user", "content": DEMO_QUESTION}],
                                      max_new_tokens=request.max_new_tokens if run.budget_given else DEMO_MAX_NEW,
                                      template_kwargs=run.template_kwargs)
    if request.is_text and text is None:
        raise click.UsageError(f"{'--chat' if request.messages else '--prompt'} needs a model with a tokenizer; "
                               f"{model.name} has none: use --prompt-ids")
    ids = request_ids(text, request)
    cfg = model.config
    compile_constraint(text, cfg.vocab, resolve(text, request))  # a bad schema: one line before the engine
    max_seq = run.engine.max_seq
    if max_seq is not None and max_seq > cfg.max_seq:
        raise click.UsageError(f"--max-seq {max_seq} exceeds the model's context of {cfg.max_seq}")
    context = context_of(cfg, max_seq)
    check_prompt(ids, cfg.vocab, context, request.stop_ids, f": {room_hint(len(ids) + 1, context, cfg.max_seq)}")
    return dataclasses.replace(request, prompt=None, messages=None, template_kwargs={}, prompt_ids=ids)


class Printer:
    """An answer's pieces -> stdout as they come: their text, or the token ids themselves for a
    model without a tokenizer."""

    def __init__(self, text: TextSpec | None, out):
        self.out, self.ids = out, text is None

    def push(self, piece: Piece) -> None:
        self.out.write(f"{piece.token} " if self.ids and piece.token is not None else piece.text)
        self.out.flush()

    def finish(self) -> None:
        self.out.write("\n")
        self.out.flush()


class one_line_errors:
    """`with one_line_errors() as errors:` around a command's work: every error a user can meet
    becomes one line on stderr and an exit status in `errors.status` (2 for a usage mistake, 1
    for an arcpy error or no memory, 130 when interrupted; 0 when nothing went wrong)."""

    def __enter__(self) -> "one_line_errors":
        self.status = 0
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is None:
            return False
        if issubclass(kind, KeyboardInterrupt):
            click.echo("\ninterrupted", err=True)
            self.status = 130
            return True
        if issubclass(kind, click.UsageError):
            message, self.status = exc.format_message(), 2
        elif issubclass(kind, ArcError):
            message, self.status = str(exc), 1
        elif issubclass(kind, MemoryError):
            message, self.status = "out of host memory (a model or context too large for this machine)", 1
        else:
            return False
        click.echo(f"error: {message}", err=True)
        return True


def cli_decode(out=None, **options) -> int:
    """The command line: every argument checked, then the request run; every error one line on
    stderr. The exit status."""
    with one_line_errors() as errors:
        return run_decode(*plan(**options), out)
    return errors.status


def run_decode(request: Request, run: RunOptions, out=None) -> int:
    """Load the model, answer `request` on `out` (stdout) as it lands, report on stderr. The exit
    status: 0, or 130 when interrupted (the statistics so far are still reported). Errors raise:
    arcpy.ArcError, or click.UsageError for what the command line asked wrongly."""
    out = out or sys.stdout
    model, text = load(run.model_path, run.shape, run.weights, run.revision)
    request = with_prompt(request, model, text, run)
    with open_engine(model, text, run.engine, prefill_progress=PrefillProgress()) as engine:
        cfg = model.config
        click.echo(f"model {model.name}: {cfg.n_layers} layers, dim {cfg.dim}, vocab {cfg.vocab}{held(model)}; "
                   f"prompt {len(request.prompt_ids)} tokens", err=True)
        if engine.device.capabilities.memory_report:
            click.echo(engine.device.memory_report(), err=True)
        printer = Printer(text, out)
        started = time.perf_counter()
        stamps: list[float] = []
        reason, status, logprobs = None, 0, []
        try:
            for piece in engine.stream(request):
                if piece.token is not None:
                    stamps.append(time.perf_counter())
                    logprobs += [(piece.token, piece.logprob)] if piece.logprob else []
                printer.push(piece)
        except KeyboardInterrupt:
            engine.finish()
            reason, status = "interrupted", 130
        printer.finish()
        for token, lp in logprobs:
            name = (lambda i: repr(token_text(text, i))) if text is not None else str
            alternatives = ", ".join(f"{name(i)} {v:.4f}" for i, v in lp.top)
            click.echo(f"logprob {name(token)} {lp.logprob:.4f}" + (f"  [{alternatives}]" if lp.top else ""), err=True)
        report(engine, reason, started, stamps, run.engine.device_loop)
    return status


def report(engine: Engine, reason, started: float, stamps: list[float], asked_loop) -> None:
    """One line on stderr: why it finished, time to first token, decode rate, path; and notes."""
    st = engine.stats
    line = f"finished: {reason or st.finish_reason}; {len(stamps)} tokens"
    if stamps:
        line += f"; time to first token {(stamps[0] - started) * 1e3:.1f} ms"
    if len(stamps) > 1:
        line += f"; decode {(len(stamps) - 1) / (stamps[-1] - stamps[0]):.1f} tok/s"
    line += f"; path {st.path}, backend {st.backend}"
    if st.seed is not None:
        line += f"; seed {st.seed}"  # a sampled run without --seed is repeated with this one
    if st.backend == "cuda":
        line += (f"; per token: {st.per_token(st.graph_launches):.2f} graph launches, "
                 f"{st.per_token(st.cuda_calls):.2f} CUDA calls, {st.per_token(st.host_waits):.2f} host waits")
    click.echo(line, err=True)
    if st.fallback:
        note(f"fell back to the host path: {st.fallback}")
    elif asked_loop and not st.path.startswith(DEVICE_LOOP):
        note(f"--device-loop was asked for, but the host path ran: {engine.path_reason}")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@decode_options
def main(**options):
    """Decode with arcpy: a prompt in, the answer streamed out (greedy unless --temperature says otherwise)."""
    sys.exit(cli_decode(**options))


if __name__ == "__main__":
    main()
