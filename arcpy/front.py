"""What the front ends (decode, chat, serve) share to get from their options to an engine: the
checks before anything loads (check_backend), the model or the demo model read with a progress
bar (open_model), its context against --max-seq (check_context), the engine the options ask for
with the notes a user of the command line is owed (open_engine), and every error one line on
stderr (one_line_errors).

The options travel down: the command's click options become records (arcpy/options.py), the
records come here, and arcpy/backends.py opens the device and the engine over it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from arcpy import _lib, backends, demo
from arcpy.errors import ArcError, NoDeviceError
from arcpy.loading import load_checkpoint
from arcpy.loop import gate
from arcpy.loop.engine import Engine
from arcpy.model import Model, synthetic_model
from arcpy.model.hub import resolve_model
from arcpy.options import EngineOptions
from arcpy.text import TextSpec

WEIGHTS = {"auto": None, "quantized": True, "bf16": False}  # --weights -> load_checkpoint's `quantized`


def note(message: str) -> None:
    click.echo(f"note: {message}", err=True)


def check_backend(options: EngineOptions, hint: str = "") -> None:
    """Before anything loads: every gate read (a bad value is an error on every run), and a GPU
    where --backend cuda asks for one (`hint` says what to do instead)."""
    gate.read_all()
    if options.backend == "cuda" and not _lib.cuda_available()[0]:
        raise NoDeviceError(f"{_lib.cuda_available()[1]}; --backend cuda needs one{hint}")


def check_context(model: Model, options: EngineOptions) -> None:
    """--max-seq against the model's own context."""
    if options.max_seq is not None and options.max_seq > model.config.max_seq:
        raise click.UsageError(f"--max-seq {options.max_seq} exceeds the model's context of {model.config.max_seq}")


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


def open_model(model_path: str | None, shape: str | None = None, weights: str = "auto",
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


def open_engine(model: Model, text: TextSpec | None, options: EngineOptions, **engine) -> Engine:
    """The engine `options` ask for (the CUDA one where "auto" finds a GPU; arcpy.backends opens
    it), with the notes a user of the command line is owed: the slow NumPy backend, a --speculate
    that cannot take effect. `engine`: more of Engine's settings or open_device's arguments (the
    server's prompt_cache_bytes, a prefill_progress)."""
    backend = backends.resolve_backend(options.backend)
    if backend == "numpy":
        note(f"decoding on the NumPy reference backend, which is slow ({_lib.cuda_available()[1]})")
    opened = backends.open_engine(model, backend, text, max_seq=options.max_seq, speculate=options.speculate,
                                  devices=options.devices, device_loop=options.device_loop, burst=options.burst,
                                  draft_memory=options.draft_memory, kv_cache=options.kv_cache, **engine)
    speculation_note(options.speculate, opened)
    return opened


def speculation_note(speculate: int | None, engine: Engine) -> None:
    """A note where --speculate N was asked for and the engine cannot take it (the default, where
    it cannot, is silent: `engine.stats.speculation` says why)."""
    caps = engine.device.capabilities
    if speculate and not caps.speculate_k:
        why = caps.speculation_refused or f"the {engine.backend} backend has no device loop to run it"
        note(f"--speculate {speculate} has no effect: {why}")


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
