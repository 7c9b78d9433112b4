"""Measurements on the GPU: the copy bandwidth that bounds a memory-bound forward, and the
per-token time of the device loop and of the host path on the same model, in the same run.

Per-token time is taken in steady state: the wall time between the first and the last token a
generation yields, divided by the tokens between them, so prefill and start-up are excluded.
Each figure is the median of several generations after a warm-up one. The bandwidth floor of a
model is (weight bytes read per token) / (copy bandwidth): no decode can be faster.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from . import _lib
from .cuda import Context, open_cuda_device
from .scripted import scripted_device
from .engine import Engine
from .gate import FallbackLatch
from .model import synthetic_model


def copy_bandwidth(ctx: Context, nbytes: int = 1 << 30, reps: int = 10, trials: int = 5) -> float:
    """Device-to-device copy, bytes read plus bytes written per second (median of trials)."""
    a, b = ctx.device_alloc(nbytes), ctx.device_alloc(nbytes)
    try:
        ctx.upload_async(a, np.ones(nbytes // 4, np.float32))
        ctx.wait_idle()
        rates = []
        for _ in range(trials + 1):
            t0 = time.perf_counter()
            for _ in range(reps):
                _lib.check(ctx.lib.arc_enqueue_copy_on_device(ctx.ptr, b, a, nbytes))
            ctx.wait_idle()
            rates.append(2 * nbytes * reps / (time.perf_counter() - t0))
        return statistics.median(rates[1:])
    finally:
        ctx.device_free(a)
        ctx.device_free(b)


@dataclass
class PathResult:
    path: str
    burst: int
    us_per_token: float                     # median over runs
    runs_us: list = field(default_factory=list)
    graph_launches_per_token: float = 0.0
    cuda_calls_per_token: float = 0.0
    host_waits_per_token: float = 0.0


def time_generation(engine: Engine, prompt: list[int], tokens: int, runs: int) -> tuple[list[float], object]:
    per_token = []
    for i in range(runs + 1):
        stamps = []
        for _ in engine.generate(prompt, tokens):
            stamps.append(time.perf_counter())
        if i > 0:  # the first run warms up
            per_token.append((stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e6)
    return per_token, engine.stats


def bench_paths(device, tokens: int, runs: int, bursts=(4, 16)) -> list[PathResult]:
    prompt = [1, 2, 3, 4]
    results = []
    configs = [("host", False, 1)] + [("device-loop", True, b) for b in bursts]
    for name, loop, burst in configs:
        eng = Engine(device, "cuda", device_loop=loop, burst=burst, environ={}, latch=FallbackLatch())
        us, st = time_generation(eng, prompt, tokens, runs)
        assert st.path == ("device-loop" if loop else "host"), st.path
        results.append(PathResult(name, burst, statistics.median(us), [round(u, 2) for u in us],
                                  st.per_token(st.graph_launches), st.per_token(st.cuda_calls),
                                  st.per_token(st.host_waits)))
    return results


@dataclass
class ShapeResult:
    shape: str
    weight_bytes: int
    floor_us: float
    paths: list


def bench_shape(shape: str, bandwidth: float, tokens: int, runs: int) -> ShapeResult:
    model = synthetic_model(shape, seed=0)
    device = open_cuda_device(model, max_seq=min(model.config.max_seq, 2048))
    try:
        floor_us = model.config.weight_bytes / bandwidth * 1e6
        return ShapeResult(shape, model.config.weight_bytes, floor_us, bench_paths(device, tokens, runs))
    finally:
        device.close()


def bench_scripted(tokens: int, runs: int) -> ShapeResult:
    """The loop's own cost: the scripted model's forward is one tiny kernel."""
    ctx = Context(0)
    device = scripted_device(ctx)
    try:
        return ShapeResult("scripted", 0, 0.0, bench_paths(device, tokens, runs))
    finally:
        device.close()
        ctx.close()


def run(shapes, tokens: int = 256, runs: int = 5) -> dict:
    ctx = Context(0)
    try:
        name = ctx.name()
        bandwidth = copy_bandwidth(ctx)
    finally:
        ctx.close()
    results = [bench_scripted(tokens, runs)] + [bench_shape(s, bandwidth, tokens, runs) for s in shapes]
    return {
        "device": name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "copy_bandwidth_GBps": bandwidth / 1e9,
        "tokens": tokens,
        "runs": runs,
        "shapes": [asdict(r) for r in results],
    }


def format_table(report: dict) -> str:
    lines = [f"{report['device']}, {report['date']}: copy bandwidth {report['copy_bandwidth_GBps']:.0f} GB/s; "
             f"{report['tokens']} tokens per generation, median of {report['runs']}",
             f"{'shape':12s} {'path':12s} {'burst':>5s} {'us/token':>9s} {'tok/s':>8s} {'floor us':>9s} "
             f"{'floor/us':>8s} {'launch/t':>8s} {'cuda/t':>7s} {'wait/t':>6s}"]
    for s in report["shapes"]:
        for p in s["paths"]:
            ratio = s["floor_us"] / p["us_per_token"] if s["floor_us"] else 0.0
            lines.append(f"{s['shape']:12s} {p['path']:12s} {p['burst']:5d} {p['us_per_token']:9.2f} "
                         f"{1e6 / p['us_per_token']:8.0f} {s['floor_us']:9.2f} {ratio:8.1%} "
                         f"{p['graph_launches_per_token']:8.2f} {p['cuda_calls_per_token']:7.2f} "
                         f"{p['host_waits_per_token']:6.2f}")
    return "\n".join(lines)
