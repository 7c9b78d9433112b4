"""The sampler alone on fixed logits, on the GPU: µs per launch of libarc's argmax and draw
(arc_argmax, arc_sample) for several logit distributions, vocabularies and sampling settings.
Each figure is the median of 5 timed replays of a graph of 20 launches (arcpy.bench.kernels's
timing). The draw-alone table of docs/PERF.md (13:05 UTC section) was measured by this script's
code (then a scratch copy, laid out differently).

    python scripts/draw_bench.py [LABEL]

Logits: "normal1"/"normal4", Gaussian of standard deviation 1 and 4; "llm", standard deviation
1.5 with 20 ids raised by 10; "ties", Gaussian times 4 rounded to quarter units. Settings:
t0.8p.95 (the benchmark's sampled request), t1 (temperature alone), k40p.9 (t 0.8, top-k 40,
top-p 0.9).
"""
import statistics
import sys

import numpy as np

from arcpy import _lib
from arcpy.bench.kernels import capture_graph, time_graph
from arcpy.devices.context import Context, sampling_struct
from arcpy.errors import ArcError
from arcpy.sampling import Sampling


def kinds(v, rng):
    yield "normal1", rng.standard_normal(v).astype(np.float32)
    yield "normal4", (rng.standard_normal(v) * 4).astype(np.float32)
    x = (rng.standard_normal(v) * 1.5).astype(np.float32)
    x[rng.choice(v, 20, replace=False)] += 10
    yield "llm", x
    yield "ties", (np.round(rng.standard_normal(v) * 4) / 4).astype(np.float32)


SETTINGS = {"t0.8p.95": Sampling(temperature=0.8, top_p=0.95, seed=1), "t1": Sampling(temperature=1.0, seed=1),
            "k40p.9": Sampling(temperature=0.8, top_k=40, top_p=0.9, seed=1)}


def run(label: str) -> None:
    ctx = Context(0)
    ffi, lib = ctx.ffi, ctx.lib
    out = ffi.cast("int32_t *", ctx.device_alloc(4))
    val = ffi.cast("float *", ctx.device_alloc(4))
    rng = np.random.default_rng(0)
    for v in (32000, 49152, 128256):
        d = ctx.device_alloc(v * 4)
        logits = ffi.cast("float *", d)
        for kind, x in kinds(v, rng):
            ctx.upload_async(d, x)
            ctx.wait_idle()
            row = []
            g = capture_graph(ctx, [lambda: _lib.check(lib.arc_argmax(ctx.ptr, logits, v, out, val, ffi.NULL))] * 20)
            row.append(("argmax", statistics.median(time_graph(ctx, g, 20, 5))))
            lib.arc_graph_destroy(g)
            for name, s in SETTINGS.items():
                st = sampling_struct(ffi, s)
                g = capture_graph(ctx, [lambda j=j: _lib.check(lib.arc_sample(ctx.ptr, logits, v, st, 100 + j, out))
                                   for j in range(20)])
                row.append((name, statistics.median(time_graph(ctx, g, 20, 5))))
                lib.arc_graph_destroy(g)
            print(f"{label} vocab {v:6d} {kind:8s} " + "  ".join(f"{n} {u:6.2f}" for n, u in row), flush=True)
        ctx.device_free(d)
    ctx.close()


if __name__ == "__main__":
    try:
        run(sys.argv[1] if len(sys.argv) > 1 else "draw")
    except ArcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
