"""One plain step and one speculative step of a synthetic shape or a model file, for a profiler
that measures launch by launch, such as Nsight Compute, started and stopped around the two steps
alone (cuProfilerStart/Stop), so that each kernel of the verify can be timed beside the plain step's.
The model keeps the shape's dims with `--layers` layers (every layer's kernels are the same), its
weights random; the steps run at the position after a prompt that repeats itself, through the
device loop's own graphs (a profiler times each graph node apart):

    ncu --profile-from-start off --section SpeedOfLight \\
        --metrics dram__bytes_read.sum python scripts/profile_verify.py --shape llama8B --layers 2

`--model` takes a .gguf file or a model directory instead (the demo model's file, say), whole.

One JSON line on stdout says what ran: the shape (or the model), layers, position, drafts, and the
tokens each step published.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import sys

from arcpy.bench.loop import script_status
from arcpy.bench.speculate import DRAFTS, repeating_prompt
from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.sequence import SequenceStart
from arcpy.errors import ArcError
from arcpy.loading import load_checkpoint
from arcpy.loop.burst import BurstDriver
from arcpy.model import SHAPES, preset_formats, random_model


def profiled(step):
    """step() between cuProfilerStart and cuProfilerStop (the driver's, which every runtime in the
    process shares); the steps' graph launches complete before the stop."""
    driver = ctypes.CDLL("libcuda.so.1")
    if driver.cuProfilerStart() != 0:
        raise ArcError("cuProfilerStart failed")
    try:
        return step()
    finally:
        driver.cuProfilerStop()


def synthetic(shape: str, layers: int):
    """The synthetic shape with `layers` layers, its weights random (quantized presets in their formats)."""
    formats = preset_formats(shape)  # refuses an unknown shape
    if not 1 <= layers <= SHAPES[shape].n_layers:
        raise ArcError(f"--layers must be in 1..{SHAPES[shape].n_layers}, got {layers}")
    cfg = dataclasses.replace(SHAPES[shape], n_layers=layers, max_seq=min(SHAPES[shape].max_seq, 1024))
    return random_model(cfg, seed=0, name=shape, formats=formats)


def run(model, what: dict) -> dict:
    """One plain and one speculative step of `model` under the profiler; `what` names it in the line."""
    if model.config.n_experts:
        raise ArcError(f"{model.name} is a mixture of experts; speculative steps do not route rows yet")
    max_seq = min(model.config.max_seq, 1024)
    with open_cuda_device(model, max_seq=max_seq, speculate=DRAFTS) as device:
        prompt = repeating_prompt(device.vocab)
        drv = BurstDriver(device, max_spins=50_000_000)
        drv.begin_sequence(SequenceStart(loop=True))
        device.enqueue_prefill(prompt, 0)
        device.set_input(prompt[-1], len(prompt) - 1)
        list(drv.run(1, first_commit=True))
        device.ctx.wait_idle()

        def steps():
            plain = list(drv.run(1))
            spec = list(drv.run_speculative(1, DRAFTS + 1))
            device.ctx.wait_idle()
            return plain, spec

        plain, spec = profiled(steps)
        return {**what, "position": len(prompt) + 1, "drafts": DRAFTS, "plain_tokens": plain,
                "speculative_tokens": spec}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama8B", help="a synthetic shape, bf16 or quantized (no mixture of experts)")
    ap.add_argument("--layers", type=int, default=2, help="layers of the shape to keep")
    ap.add_argument("--model", default=None,
                    help="a .gguf file or a Hugging Face model directory instead of --shape (all its layers, its "
                         "matrices as the file holds them)")
    a = ap.parse_args(argv)

    def one():
        if a.model is not None:
            model, _ = load_checkpoint(a.model)
            what = {"model": model.name, "layers": model.config.n_layers}
        else:
            model, what = synthetic(a.shape, a.layers), {"shape": a.shape, "layers": a.layers}
        print(json.dumps(run(model, what)), flush=True)

    return script_status(one)


if __name__ == "__main__":
    sys.exit(main())
