"""One plain step and one speculative step of a synthetic shape, for a profiler that measures
launch by launch, such as Nsight Compute, started and stopped around the two steps alone
(cuProfilerStart/Stop), so that each kernel of the verify can be timed beside the plain step's.
The model keeps the shape's dims with `--layers` layers (every layer's kernels are the same), its
weights random; the steps run at the position after a prompt that repeats itself, through the
device loop's own graphs (a profiler times each graph node apart):

    ncu --profile-from-start off --section SpeedOfLight \\
        --metrics dram__bytes_read.sum python scripts/profile_verify.py --shape llama8B --layers 2

One JSON line on stdout says what ran: the shape, layers, position, drafts, and the tokens each
step published.
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
from arcpy.errors import ArcError
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


def run(shape: str, layers: int) -> dict:
    formats = preset_formats(shape)  # refuses an unknown shape
    if SHAPES[shape].n_experts:
        raise ArcError(f"{shape} is a mixture of experts; speculative steps do not route rows yet")
    if not 1 <= layers <= SHAPES[shape].n_layers:
        raise ArcError(f"--layers must be in 1..{SHAPES[shape].n_layers}, got {layers}")
    cfg = dataclasses.replace(SHAPES[shape], n_layers=layers, max_seq=min(SHAPES[shape].max_seq, 1024))
    with open_cuda_device(random_model(cfg, seed=0, name=shape, formats=formats), max_seq=cfg.max_seq, speculate=DRAFTS) as device:
        prompt = repeating_prompt(device.vocab)
        drv = BurstDriver(device, max_spins=50_000_000)
        drv.begin_sequence(())
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
        return {"shape": shape, "layers": layers, "position": len(prompt) + 1, "drafts": DRAFTS,
                "plain_tokens": plain, "speculative_tokens": spec}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama8B", help="a synthetic shape, bf16 or quantized (no mixture of experts)")
    ap.add_argument("--layers", type=int, default=2, help="layers of the shape to keep")
    a = ap.parse_args(argv)
    return script_status(lambda: print(json.dumps(run(a.shape, a.layers)), flush=True))


if __name__ == "__main__":
    sys.exit(main())
