"""One libarc build on synthetic shapes, for A/B comparisons on the GPU: µs per token of the
device loop at burst 16 (greedy, and with --sampled the benchmark's sampled request), median of
--runs generations after a warm-up, the same method as scripts/bench.py; with --kernels, the
per-kernel table (arcpy.bench.kernels) with attention at the positions given. One JSON line per
shape on stdout.

The library is the one arcpy loads, so ARC_LIBRARY picks the build. Compare builds in one run,
alternating them so that a drift of the card shows up as a difference between rounds:

    for r in 1 2; do for v in base variant; do
        ARC_LIBRARY=$PWD/.stage/$v/libarc.so python scripts/ab_bench.py --tag $v --runs 3
    done; done

With --bits N, each row also carries a hash of the logits of N greedy forwards (the step's graph,
from token 1 at position 0, each next token the argmax): two builds whose products keep their
order of sums give the same hash, since their logits are the same bits.

The A/B tables of docs/PERF.md (2026-11-30, 13:48 to 14:22 UTC) were measured by this script's
code, then a scratch copy (the error handling and the layout differ).
"""
import argparse
import hashlib
import json
import os
import statistics
import sys

from arcpy.bench.kernels import SAMPLED, bench_kernels
from arcpy.bench.loop import PROMPT, at_least_two, bench_max_seq, positions, positive, time_generation
from arcpy.devices.cuda import open_cuda_device
from arcpy.errors import ArcError
from arcpy.loop.engine import Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.model import preset_formats, synthetic_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="stories15M,smollm2-135M,llama1B", help="comma-separated shapes")
    ap.add_argument("--runs", type=positive, default=5, help="timed generations per path")
    ap.add_argument("--tokens", type=at_least_two, default=256, help="tokens per generation")
    ap.add_argument("--sampled", action="store_true", help="also the sampled request (t 0.8, top-p 0.95)")
    ap.add_argument("--kernels", type=positions, default=[],
                    help="attention positions of a per-kernel table, e.g. 130,512 (none: no table)")
    ap.add_argument("--bits", type=positive, default=None, help="hash the logits of this many greedy forwards")
    ap.add_argument("--tag", default=os.environ.get("ARC_LIBRARY", "packaged"), help="label of the build")
    a = ap.parse_args(argv)
    try:
        for shape in a.shapes.split(","):
            measure(shape, a)
    except ArcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def measure(shape: str, a: argparse.Namespace) -> None:
    """Prints the JSON line of one shape."""
    model = synthetic_model(shape, seed=0)
    cfg, max_seq = model.config, bench_max_seq(model.config)
    row = {"tag": a.tag, "shape": shape}
    with open_cuda_device(model, max_seq=max_seq) as dev:
        del model
        for name, sampling in [("greedy", None)] + ([("sampled", SAMPLED)] if a.sampled else []):
            eng = Engine(dev, "cuda", EngineSettings(device_loop=True, burst=16, speculate=False), environ={},
                         latch=FallbackLatch())
            us, stats = time_generation(eng, PROMPT, a.tokens, a.runs, sampling)
            if stats.path != "device-loop":
                raise SystemExit(f"{shape}: the engine took the {stats.path} path, not the device loop")
            row[name] = round(statistics.median(us), 2)
            row[name + "_runs"] = [round(u, 1) for u in us]
        if a.bits:
            row["bits"] = logits_hash(dev, a.bits)
    if a.kernels:
        for t in bench_kernels(cfg, max_seq, a.kernels, replays=3, formats=preset_formats(shape)):
            row["k:" + t["name"]] = round(t["us"], 2)
    print(json.dumps(row), flush=True)


def logits_hash(dev, steps: int) -> str:
    """sha256 (first 16 hex digits) of the logits of `steps` greedy forwards from token 1."""
    h, token = hashlib.sha256(), 1
    for pos in range(steps):
        dev.set_input(token, pos)
        dev.enqueue_forward()
        dev.enqueue_logits_to_host()
        while not dev.stream_query():
            pass
        logits = dev.host_logits()
        h.update(logits.tobytes())
        token = int(logits.argmax())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    sys.exit(main())
