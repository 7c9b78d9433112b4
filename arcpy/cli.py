"""`arcpy`: the command line. generate (the main job), serve (the OpenAI HTTP API), chat (in the
terminal), pull (a model of the Hugging Face hub into its cache); info, smoke and bench for
checking a machine."""

from __future__ import annotations

import sys

import click

from arcpy import __version__, _lib, demo
from arcpy.decode import cli_decode, decode_options
from arcpy.errors import ArcError
from arcpy.model.hub import NAME_HELP, parse_name, resolve_name
from arcpy.serve.command import main as serve_command
from arcpy.terminal_chat import main as chat_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.version_option(__version__, prog_name="arcpy")
@click.pass_context
def main(ctx):
    """arcpy: batch-1 decode without a host wait per token."""
    if ctx.invoked_subcommand is None:  # no command: the help, and success
        click.echo(ctx.get_help())


@main.command()
def info():
    """The library, its ABI version and the GPU it sees."""
    click.echo(f"arcpy {__version__}")
    try:
        click.echo(f"library: {_lib.library_path()}")
        _, lib = _lib.load()
        click.echo(f"ABI version: {lib.arc_abi_version()}")
    except ArcError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    ok, why = _lib.cuda_available()
    click.echo(f"GPU: {why}" if ok else f"GPU: none ({why})")
    if ok:
        from arcpy.devices.context import Context
        with Context(0) as ctx:
            click.echo(f"device 0: {ctx.name()}")


SMOKE_PROMPT = [1, 2, 3]


@main.command()
@click.option("-n", "--tokens", type=click.IntRange(1, 1024 - len(SMOKE_PROMPT)), default=32, show_default=True)
def smoke(tokens):
    """Decode from the embedded model on every available path. Fails when two GPU paths disagree
    (they run the same kernels, so they must agree exactly) or when a path's first token differs
    from the NumPy reference; reports how many tokens equal the reference's (float32 on the CPU,
    bf16 weights read in float32 on the GPU: a near tie may go either way later on)."""
    from arcpy.devices.reference import ReferenceModel
    from arcpy.backends import open_engine
    from arcpy.model import synthetic_model

    model = synthetic_model("stories15M")
    want = ReferenceModel(model).greedy(SMOKE_PROMPT, tokens)
    runs = [("numpy", None)]
    if _lib.cuda_available()[0]:
        runs += [("cuda", False), ("cuda", True)]
    failed, gpu_tokens = 0, None
    for backend, loop in runs:
        try:
            with open_engine(model, backend, device_loop=loop, burst=4) as engine:
                got = list(engine.generate(SMOKE_PROMPT, tokens))
                st = engine.stats
        except ArcError as exc:
            click.echo(f"FAIL {backend}: {exc}")
            failed += 1
            continue
        same = sum(a == b for a, b in zip(got, want))
        bad = got[:1] != want[:1] or (backend == "cuda" and gpu_tokens not in (None, got))
        if backend == "cuda" and gpu_tokens is None:
            gpu_tokens = got
        failed += bad
        click.echo(f"{'FAIL' if bad else 'ok  '} {backend:5s} {st.path:18s} {same}/{tokens} tokens equal the "
                   f"reference; {st.tokens_per_second:.0f} tok/s")
    sys.exit(1 if failed else 0)


@main.command()
@click.option("--shapes", default="stories15M", show_default=True, help="Comma-separated synthetic shapes.")
@click.option("--tokens", type=click.IntRange(2, 4096), default=128, show_default=True)
@click.option("--runs", type=click.IntRange(1, 100), default=3, show_default=True)
def bench(shapes, tokens, runs):
    """Microseconds per token on the GPU, host path against device loop, on synthetic models of
    --shapes (random weights): the copy bandwidth and each shape's bandwidth floor, greedy and
    sampled, bursts 4 and 16, the step graph's size and the time to first token, then the loop's
    own cost on a scripted one-kernel model. Needs a GPU."""
    from arcpy.bench import loop as measure
    try:
        click.echo(measure.format_table(measure.run([s for s in shapes.split(",") if s], tokens, runs)))
    except ArcError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@main.command()
@click.argument("name")
@click.option("--revision", default=None, help="The branch, tag or commit [default: main].")
def pull(name, revision):
    """Fetch a model of the Hugging Face hub into its cache without running it, and print where it
    lies. NAME: org/name (safetensors), org/name:QUANT or org/name/FILE.gguf (GGUF). The hub's
    variables apply: HF_HUB_CACHE, HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE (the cache alone)."""
    parsed = parse_name(name)
    if parsed is None:
        click.echo(f"error: {name}: not a name {NAME_HELP}", err=True)
        sys.exit(2)
    try:
        resolved = resolve_name(parsed, revision, f"{demo.OFFLINE} is on" if demo.offline() else None)
    except ArcError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if resolved.note is not None:
        click.echo(f"note: {resolved.note}", err=True)
    click.echo(resolved.path)


@main.command()
@decode_options
def generate(options):
    """The main job (same as python -m arcpy.decode)."""
    sys.exit(cli_decode(options))


main.add_command(serve_command, "serve")
main.add_command(chat_command, "chat")


if __name__ == "__main__":
    main()
