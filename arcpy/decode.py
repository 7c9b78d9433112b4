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
import functools
import os
import re
import select
import stat
import sys
import time
from pathlib import Path

import click

from arcpy import __version__, demo
from arcpy.checks import quoted
from arcpy.codes import FORMAT_BF16, FORMAT_NAMES, MAX_TOP_LOGPROBS
from arcpy.files import read_json_file
from arcpy.front import WEIGHTS, check_backend, check_context, note, one_line_errors, open_engine, open_model
from arcpy.loop.constrain import check_constraint, compile_constraint, resolve
from arcpy.loop.engine import Engine
from arcpy.loop.prompt import Piece, check_prompt, context_of, request_ids, room_hint
from arcpy.loop.request import Request
from arcpy.loop.stats import DEVICE_LOOP
from arcpy.model import SHAPES, Model, is_matrix
from arcpy.options import (EngineOptions, ModelOptions, PrefillProgress, SamplingOptions, about, as_records,
                           check_model, engine_options, model_options, parse_template_kwargs, sampling_options,
                           template_options, with_options)
from arcpy.text import TextSpec, token_text

DEMO_QUESTION = "What is the capital of France? Answer in one sentence."
DEMO_MAX_NEW = 48
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

    @functools.wraps(f)
    def with_record(**values):
        return f(DecodeOptions(**values))
    return with_options(options)(as_records(with_record))


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """What the decode command's options say, one record (decode_options builds it)."""

    model_opts: ModelOptions = ModelOptions()
    shape: str | None = None          # a synthetic preset instead of a model
    prompt: str | None = None
    prompt_ids: str | None = None     # the prompt as token ids, as typed
    chat: bool = False                # the prompt through the chat template
    system: str | None = None         # a system message for --chat
    template_kwargs: tuple = ()       # --template-kwarg KEY=VALUE, as typed
    max_new_tokens: int | None = None
    stop_ids: tuple = ()
    stop_strings: tuple = ()
    json_schema: str | None = None    # the file of a JSON schema the answer follows
    weights: str = "auto"             # WEIGHTS
    logprobs: int | None = None
    engine_opts: EngineOptions = EngineOptions()
    sampling_opts: SamplingOptions = SamplingOptions()


def held(model: Model) -> str:
    """How a quantized model's matrices are held, e.g. ", matrices 192 Q4_K, 33 Q6_K"; "" for bf16."""
    formats = [model.format_of(name) for name in model.tensors if is_matrix(name)]
    if all(f == FORMAT_BF16 for f in formats):
        return ""
    return ", matrices " + ", ".join(f"{formats.count(f)} {FORMAT_NAMES[f]}" for f in sorted(set(formats)))


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How to run a request: which model, on which backend and path."""

    model: ModelOptions
    shape: str | None
    engine: EngineOptions = EngineOptions()
    weights: str = "auto"       # WEIGHTS
    question: bool = False      # no prompt was given: ask the built-in question, where the model has text
    budget_given: bool = True   # -n was given (else the built-in question has a budget of its own)
    template_kwargs: dict = dataclasses.field(default_factory=dict)  # --template-kwarg, for the question


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


def plan(options: DecodeOptions, stdin=None) -> tuple[Request, RunOptions]:
    """Every option checked, nothing loaded: the request and how to run it. Where no prompt was
    given, the request's prompt is token id 1, and `run_decode` asks the built-in question instead
    once it sees that the model has text."""
    o = options
    model_path, shape, chat, prompt_ids = o.model_opts.model_path, o.shape, o.chat, o.prompt_ids
    json_schema = o.json_schema
    prompt = read_prompt(o.prompt, prompt_ids, stdin)
    if prompt is not None and prompt_ids is not None:
        raise click.UsageError("give --prompt or --prompt-ids, not both")
    if model_path is not None and shape is not None:
        raise click.UsageError("give --model or --shape, not both")
    check_model(model_path, o.model_opts.revision)
    if o.system is not None and not chat:
        raise click.UsageError("--system needs --chat")
    kwargs = parse_template_kwargs(o.template_kwargs)
    if kwargs and not chat:
        raise click.UsageError("--template-kwarg needs --chat")
    if chat and prompt_ids is not None:
        raise click.UsageError("--chat takes --prompt text, not --prompt-ids")
    if shape is not None and (prompt is not None or chat or o.stop_strings or json_schema):
        what = "--prompt" if prompt is not None else "--chat" if chat else "--stop" if o.stop_strings else "--json-schema"
        raise click.UsageError(f"{what} needs a model with a tokenizer; the synthetic {shape} has none: "
                               "use --prompt-ids")
    sampling = o.sampling_opts.sampling()
    if sampling.temperature == 0.0 and (sampling.top_k > 1 or sampling.top_p < 1.0 or sampling.seed is not None):
        used = [flag for flag, on in (("--top-k", sampling.top_k > 1), ("--top-p", sampling.top_p < 1.0),
                                      ("--seed", sampling.seed is not None)) if on]
        note(f"{' and '.join(used)} {'has' if len(used) == 1 else 'have'} no effect without --temperature: "
             "decoding greedily")
    demo.offline()  # read like the gates: a bad value is an error on every run
    check_backend(o.engine_opts, " (auto or numpy decode on the CPU)")
    if prompt_ids is not None:
        source = {"prompt_ids": parse_ids(prompt_ids)}
    elif prompt is None:
        source = {"prompt_ids": (1,)}
    elif chat:
        messages = ([{"role": "system", "content": o.system}] if o.system is not None else [])
        source = {"messages": messages + [{"role": "user", "content": prompt}]}
    else:
        source = {"prompt": prompt}
    if json_schema is not None:
        with about("--json-schema"):
            schema = read_json_file(Path(json_schema), "JSON schema")
        source["response_format"] = {"type": "json_schema", "json_schema": {"name": "cli", "schema": schema}}
    request = Request(**source, max_new_tokens=64 if o.max_new_tokens is None else o.max_new_tokens,
                      stop_ids=o.stop_ids, stop=o.stop_strings, sampling=sampling,
                      template_kwargs=kwargs if "messages" in source else {}, logprobs=o.logprobs)
    with about("--json-schema"):
        check_constraint(request.response_format)  # the schema, before the model loads
    return request, RunOptions(o.model_opts, shape, o.engine_opts, o.weights,
                               question=prompt is None and prompt_ids is None,
                               budget_given=o.max_new_tokens is not None, template_kwargs=kwargs)


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
    check_context(model, run.engine)
    context = context_of(cfg, run.engine.max_seq)
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


def cli_decode(options: DecodeOptions, out=None) -> int:
    """The command line: every option checked, then the request run; every error one line on
    stderr. The exit status."""
    with one_line_errors() as errors:
        return run_decode(*plan(options), out)
    return errors.status


def run_decode(request: Request, run: RunOptions, out=None) -> int:
    """Load the model, answer `request` on `out` (stdout) as it lands, report on stderr. The exit
    status: 0, or 130 when interrupted (the statistics so far are still reported). Errors raise:
    arcpy.ArcError, or click.UsageError for what the command line asked wrongly."""
    out = out or sys.stdout
    model, text = open_model(run.model.model_path, run.shape, run.weights, run.model.revision)
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
def main(options: DecodeOptions):
    """Decode with arcpy: a prompt in, the answer streamed out (greedy unless --temperature says otherwise)."""
    sys.exit(cli_decode(options))


if __name__ == "__main__":
    main()
