"""The command-line options that decode, chat and serve share: the model (--model, a path here or
a name of the hub, and --revision), how the engine runs, how it samples, and the chat template's
keyword arguments (--template-kwarg KEY=VALUE, parsed and checked here); the errors of what an
option names (`about`), and a long prefill's progress line on a terminal (PrefillProgress)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from dataclasses import dataclass, fields

import click

from arcpy.checks import quoted
from arcpy.codes import KV_FORMATS, MAX_BURST, MAX_WORLD
from arcpy.drafting import DEFAULT_DRAFTS, MAX_DRAFTS
from arcpy.errors import ArcError, InvalidArgumentError
from arcpy.model.hub import NAME_HELP, is_model_name, no_such_model
from arcpy.sampling import Sampling
from arcpy.text import check_template_kwargs


@contextlib.contextmanager
def about(option: str):
    """`with about("--tools"):` around reading and checking what an option names (a file, a
    schema), before any model loads: an arcpy error becomes one usage error naming the option."""
    try:
        yield
    except ArcError as exc:
        raise click.UsageError(f"{option}: {exc}") from None


class PrefillProgress:
    """open_device's prefill_progress for a command on a terminal: while a prompt of more than
    one chunk goes through the CPU backend's prefill (seconds a chunk), one line on stderr says
    how many chunks are done, rewritten in place and erased at the end. Where stderr is not a
    terminal, nothing."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr

    def __call__(self, done: int, total: int) -> None:
        if total > 1 and self.stream.isatty():
            self.stream.write(f"\rprefill: {done}/{total} chunks" if done < total else "\r\033[K")
            self.stream.flush()


@dataclass(frozen=True)
class EngineOptions:
    """How the engine runs, one record: what --backend, --device-loop/--host-path, --burst,
    --max-seq, --speculate, --draft-memory, --tensor-parallel and --kv-cache say (engine_options), handed on by
    decode, chat and serve alike to arcpy.front.open_engine."""

    backend: str = "auto"           # auto, cuda or numpy
    device_loop: bool | None = None  # None: ARC_GRAPH_DEVICE_LOOP decides
    burst: int = 4                  # device-loop steps enqueued per burst
    max_seq: int | None = None      # the context to allocate (None: the model's, at most open_device's default)
    speculate: int | None = None    # drafts a speculative step verifies (0: none; None: the default, on)
    draft_memory: bool = True       # drafts also come from earlier sequences' answers (Engine's draft_memory)
    tensor_parallel: int = 1        # ranks the model splits over (1: no split)
    kv_cache: str = "bf16"          # the form the KV cache holds its rows in (arcpy/devices/kv_formats.py)

    @property
    def devices(self) -> list[int] | None:
        """open_device's `devices`: ranks 0 to N-1 for --tensor-parallel N, None for one."""
        return list(range(self.tensor_parallel)) if self.tensor_parallel > 1 else None


def engine_options(burst_help: str = "Device-loop steps enqueued per burst.") -> list:
    """The options that say how the engine runs, shared by decode, chat and serve: --backend,
    --device-loop/--host-path, --burst, --max-seq, --speculate N / --no-speculate,
    --draft-memory/--no-draft-memory, --tensor-parallel N, --kv-cache FORM. A command under
    them takes one EngineOptions, `engine_opts` (as_records builds it)."""
    return [
        click.option("--backend", type=click.Choice(["auto", "cuda", "numpy"]), default="auto", show_default=True),
        click.option("--device-loop/--host-path", "device_loop", default=None,
                     help="Force the path; default: ARC_GRAPH_DEVICE_LOOP (unset means the device loop, where the "
                          "backend has one)."),
        click.option("--burst", type=click.IntRange(1, MAX_BURST), default=4, show_default=True, help=burst_help),
        click.option("--max-seq", type=click.IntRange(min=1), default=None,
                     help="Context length to allocate, at most the model's (default: the model's, at most 4096)."),
        click.option("--speculate", "speculate", type=click.IntRange(0, MAX_DRAFTS), default=None,
                     help=f"Drafts a speculative step verifies (default {DEFAULT_DRAFTS}; 0: none): where the text "
                          "repeats earlier text, the device loop makes up to that many tokens more per read of the "
                          "weights, chosen burst by burst, only where it pays. The tokens are the plain loop's "
                          "(greedy, or sampled with the same seed)."),
        click.option("--no-speculate", "no_speculate", is_flag=True, default=False,
                     help="No speculative steps (--speculate 0)."),
        click.option("--tensor-parallel", "tensor_parallel", type=click.IntRange(1, MAX_WORLD), default=1,
                     show_default=True, metavar="N",
                     help="Split the model over N GPUs (GPUs 0 to N-1; each holds its share of the heads and "
                          "FFN rows, the partial sums added through NCCL inside the step graphs). On --backend "
                          "numpy, N ranks on the CPU."),
        click.option("--draft-memory/--no-draft-memory", "draft_memory", default=True, show_default=True,
                     help="Drafts also come from the answers this engine gave before (a question asked again "
                          "drafts its earlier answer). Off: each request drafts from its own tokens alone, so its "
                          "speed tells nothing of other requests."),
        click.option("--kv-cache", "kv_cache", type=click.Choice(list(KV_FORMATS)), default="bf16", show_default=True,
                     help="The form the KV cache holds its rows in: q8_0 (blocks of 32 int8 values and a scale, 53% "
                          "of bf16's bytes) reads fewer bytes a token at long contexts and holds about twice the "
                          "context in the same memory; fp8 (e4m3, no scale) on --backend numpy only."),
    ]


def model_options(what: str, default: str) -> list:
    """--model (`what` it takes besides a name of the hub, and its `default`) and --revision, shared
    by decode, chat and serve: a command under them takes `model_path` and `revision`, which
    arcpy.model.hub resolves (check_model checks them first); as_records makes them one
    ModelOptions, `model_opts`."""
    return [
        click.option("--model", "model_path", type=click.Path(), default=None,
                     help=f"{what}; or a name, {NAME_HELP}, fetched into its cache on first use (HF_HUB_OFFLINE or "
                          f"ARC_OFFLINE: from the cache alone). {default}"),
        click.option("--revision", default=None,
                     help="The branch, tag or commit of a --model named on the hub [default: main]."),
    ]


@dataclass(frozen=True)
class ModelOptions:
    """Which model, one record: what --model and --revision say (model_options)."""

    model_path: str | None = None  # a path here or a name of the hub (None: the command's default)
    revision: str | None = None    # of a model named on the hub


def check_model(model_path: str | None, revision: str | None) -> None:
    """--model and --revision, before anything loads: a path here or a name of the hub."""
    if model_path is not None and not model_path.strip():
        raise click.UsageError("--model is empty: name a model directory, a .gguf file or a model of the hub")
    if model_path is not None and not is_model_name(model_path):
        raise click.UsageError(f"--model {no_such_model(model_path)}")
    if revision is not None and (model_path is None or os.path.exists(model_path)):
        raise click.UsageError("--revision is for a --model named on the hub (org/name)"
                               + (f"; {model_path} is a path here" if model_path is not None else ""))


@dataclass(frozen=True)
class SamplingOptions:
    """How a command samples, one record: what --temperature, --top-k, --top-p and --seed say
    (sampling_options), handed on by decode, chat and serve alike. Checked where it is used,
    `sampling()`, so that a bad value is the command's one line."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_k, self.top_p, self.seed)


def sampling_options(temperature: float = 0.0, most: float | None = None, helps: dict | None = None,
                     seed: bool = True) -> list:
    """The options that say how a command samples: --temperature (from 0 to `most`, default
    `temperature`), --top-k, --top-p and (with `seed`) --seed; `helps` gives each its help by name.
    A command under them takes one SamplingOptions, `sampling_opts` (as_records builds it)."""
    helps = helps or {}
    options = [
        click.option("--temperature", type=click.FloatRange(0.0, most), default=temperature, show_default=True,
                     help=helps.get("temperature")),
        click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help=helps.get("top_k")),
        click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0, show_default=True,
                     help=helps.get("top_p")),
    ]
    if seed:
        options.append(click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=None, help=helps.get("seed")))
    return options


def template_options(what: str = "A keyword argument for the chat template") -> list:
    """The options for the chat template, shared by decode, chat and serve: --template-kwarg."""
    return [
        click.option("--template-kwarg", "template_kwargs", multiple=True, metavar="KEY=VALUE",
                     help=f"{what} (repeatable), e.g. enable_thinking=false; VALUE is read as JSON where it "
                          "parses as JSON, else as a string."),
    ]


def parse_template_kwargs(pairs) -> dict:
    """--template-kwarg KEY=VALUE options -> the template's keyword arguments, checked. A value
    is JSON where it parses as JSON (false, 3, ["a"], "3"), else the string it is."""
    out = {}
    for pair in pairs:
        name, eq, text = pair.partition("=")
        if not eq or not name:
            raise click.UsageError(f"--template-kwarg takes KEY=VALUE (e.g. enable_thinking=false), got {quoted(pair)}")
        if name in out:
            raise click.UsageError(f"--template-kwarg {quoted(name)} is given twice")
        out[name] = _json_or_text(text)
    try:
        return check_template_kwargs(out, "--template-kwarg")
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from None


def _refuse(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _json_or_text(text: str):
    try:
        return json.loads(text, parse_constant=_refuse)  # NaN and Infinity stay text
    except (ValueError, RecursionError):
        return text


def as_records(command):
    """The command (innermost, under its click options) receives the engine options as one
    EngineOptions, `engine_opts`, in place of their values, the model options as one
    ModelOptions, `model_opts`, and the sampling options (where it has them) as one
    SamplingOptions, `sampling_opts`."""
    @functools.wraps(command)
    def with_record(**options):
        if options.pop("no_speculate"):
            if options["speculate"] not in (None, 0):
                raise click.UsageError("--speculate and --no-speculate contradict each other")
            options["speculate"] = 0
        options["model_opts"] = ModelOptions(options.pop("model_path"), options.pop("revision"))
        options["engine_opts"] = EngineOptions(**{f.name: options.pop(f.name) for f in fields(EngineOptions)})
        if "temperature" in options:
            options["sampling_opts"] = SamplingOptions(**{f.name: options.pop(f.name) for f in fields(SamplingOptions)
                                                          if f.name in options})
        return command(**options)
    return with_record


def with_options(options: list):
    """A decorator applying click options in the order listed (the first shows first in --help)."""
    def apply(f):
        for option in reversed(options):
            f = option(f)
        return f
    return apply
