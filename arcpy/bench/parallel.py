"""The tensor-parallel rows of the benchmark: each shape split over N GPUs (arcpy/parallel/cuda.py)
on the device loop, greedy and sampled at burst 16, beside the same shape whole on one GPU in the
same run; the ratio is the split's speed-up, and host waits a token show the loop stayed intact."""

from __future__ import annotations

import statistics

from arcpy.bench.kernels import SAMPLED
from arcpy.bench.loop import PROMPT, bench_max_seq, time_generation
from arcpy.devices.cuda import open_cuda_device
from arcpy.errors import ArcError
from arcpy.loop.engine import Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.model import synthetic_model
from arcpy.parallel.cuda import open_tensor_parallel

BURST = 16


def _rates(device, tokens: int, runs: int) -> dict:
    row = {}
    for name, sampling in (("greedy", None), ("sampled", SAMPLED)):
        eng = Engine(device, "cuda", EngineSettings(device_loop=True, burst=BURST, prefill=False, speculate=False),
                     environ={}, latch=FallbackLatch())
        us, st = time_generation(eng, PROMPT, tokens, runs, sampling)
        row[name] = {"us_per_token": statistics.median(us), "host_waits_per_token": st.per_token(st.host_waits),
                     "path": st.path}
    return row


def bench_shape(shape: str, world: int, tokens: int, runs: int) -> dict:
    """The shape whole on GPU 0, then split over GPUs 0..world-1."""
    model = synthetic_model(shape, seed=0)
    max_seq = bench_max_seq(model.config)
    out = {"shape": shape, "tensor_parallel": world}
    with open_cuda_device(model, max_seq=max_seq, speculate=0) as device:
        out["whole"] = _rates(device, tokens, runs)
    try:
        with open_tensor_parallel(model, list(range(world)), max_seq) as device:
            out["split"] = _rates(device, tokens, runs)
    except ArcError as exc:
        out["error"] = str(exc)
    return out


def run(shapes, world: int, tokens: int, runs: int, progress=lambda line: None) -> list[dict]:
    rows = []
    for shape in shapes:
        rows.append(bench_shape(shape, world, tokens, runs))
        progress(f"tensor parallel {world}, {shape}: done")
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        head = f"  {row['shape']} over {row['tensor_parallel']} GPU(s)"
        if "error" in row:
            lines.append(f"{head}: {row['error']}")
            continue
        for kind in ("greedy", "sampled"):
            whole, split = row["whole"][kind], row["split"][kind]
            lines.append(f"{head}, {kind}: whole {whole['us_per_token']:.1f} us/token, split "
                         f"{split['us_per_token']:.1f} us/token ({whole['us_per_token'] / split['us_per_token']:.2f}x), "
                         f"host waits a token {split['host_waits_per_token']:.2f}")
    return "\n".join(lines)
