"""The main job: decode token ids from a model and report how fast and by which path.

    python -m arcpy.decode                      # the embedded synthetic stories15M model
    python -m arcpy.decode --model DIR          # a Hugging Face style directory
    python -m arcpy.decode --help

Token ids are printed as they are produced (there is no tokenizer), then one line with the
rate, the path (device-loop or host) and the backend (cuda or numpy). Errors are one line.
"""

from __future__ import annotations

import re
import sys

import click

from . import _lib, gate
from .engine import Engine
from .errors import ArcError
from .model import SHAPES, load_model, synthetic_model
from .sampling import Sampling


_IDS = re.compile(r"[0-9]+(?:[ ,]+[0-9]+)*")


def parse_ids(text: str) -> list[int]:
    """Token ids as ASCII digits separated by spaces or commas; nothing else is read as a number
    (Python's int() would take '1_0' as 10 and other scripts' digits)."""
    stripped = text.strip(" ,")
    if not _IDS.fullmatch(stripped):
        raise click.BadParameter(f"expected token ids (digits 0-9) separated by spaces or commas, got {text!r}")
    return [int(t) for t in re.split(r"[ ,]+", stripped)]


def decode_options(f):
    options = [
        click.option("--model", "model_dir", type=click.Path(), default=None,
                     help="Hugging Face style directory (config.json + safetensors). Default: the embedded synthetic model."),
        click.option("--shape", type=click.Choice(sorted(SHAPES)), default="stories15M", show_default=True,
                     help="Shape of the embedded synthetic model (random weights, fixed seed)."),
        click.option("--prompt", default="1", show_default=True, help="Prompt token ids, e.g. '1 450 4996'."),
        click.option("-n", "--max-new-tokens", type=click.IntRange(min=0), default=64, show_default=True),
        click.option("--stop-id", "stop_ids", type=int, multiple=True, help="Stop at this token id (repeatable)."),
        click.option("--backend", type=click.Choice(["auto", "cuda", "numpy"]), default="auto", show_default=True),
        click.option("--device-loop/--host-path", "device_loop", default=None,
                     help="Force the path; default: ARC_GRAPH_DEVICE_LOOP (unset means the host path)."),
        click.option("--burst", type=click.IntRange(1, 1024), default=4, show_default=True,
                     help="Device-loop steps enqueued per burst."),
        click.option("--max-seq", type=click.IntRange(min=1), default=None,
                     help="Context length to allocate, at most the model's (default: the model's, at most 4096)."),
        click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True),
        click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True),
        click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0, show_default=True),
        click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=None,
                     help="Seed of the sampler (non-greedy sampling)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def run_decode(model_dir, shape, prompt, max_new_tokens, stop_ids, backend, device_loop, burst,
               max_seq, temperature, top_k, top_p, seed, out=None) -> int:
    out = out or sys.stdout
    try:
        ids = parse_ids(prompt)
        sampling = Sampling(temperature, top_k, top_p, seed)
        gate.read_all()
        if model_dir is not None:
            if not model_dir.strip():
                raise click.BadParameter("--model is empty: name a model directory")
            model = load_model(model_dir)
        else:
            model = synthetic_model(shape)
        if max_seq is not None and max_seq > model.config.max_seq:
            raise click.BadParameter(f"--max-seq {max_seq} exceeds the model's context of {model.config.max_seq}")
        if backend == "auto":
            backend = _lib.auto_backend()
        if backend == "numpy":
            click.echo(f"note: decoding on the NumPy reference backend, which is slow "
                       f"({_lib.cuda_available()[1]})", err=True)
        with Engine.load(model, backend, max_seq=max_seq, device_loop=device_loop, burst=burst) as engine:
            click.echo(f"model {model.name}: {model.config.n_layers} layers, dim {model.config.dim}, "
                       f"vocab {model.config.vocab}; prompt {len(ids)} tokens", file=out)
            for tok in engine.generate(ids, max_new_tokens, stop_ids, sampling):
                out.write(f"{tok} ")
                out.flush()
            st = engine.stats
            click.echo("", file=out)
            click.echo(st.summary(), file=out)
            if st.fallback:
                click.echo(f"fell back to the host path: {st.fallback}", file=out)
    except click.BadParameter as exc:
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


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@decode_options
def main(**options):
    """Decode token ids with arcpy (greedy unless --temperature/--top-k/--top-p say otherwise)."""
    sys.exit(run_decode(**options))


if __name__ == "__main__":
    main()
