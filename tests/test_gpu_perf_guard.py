"""GPU tier: the regression guard. For each shape docs/measurements/perf-baseline.json records for
this card, the device loop (burst 16) decodes a short greedy generation and must reach at least 85% of the
recorded tokens per second. A card with no baseline skips, saying so. A card's figures are written
by the benchmark on that card: `python scripts/bench.py --no-hf --no-kernels --record-baseline
docs/measurements/perf-baseline.json` (its default shapes, the other cards' figures kept).

The generation is shorter than the benchmark's (so attention is a little cheaper): a loss shows,
a gain does not need to be recorded to pass.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from arcpy.bench.guard import GUARD_TOLERANCE, guard_verdict, read_baseline
from arcpy.bench.loop import PROMPT, bench_max_seq, time_generation
from arcpy.devices.context import Context
from arcpy.devices.cuda import open_cuda_device
from arcpy.loop.engine import Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.model import synthetic_model

pytestmark = pytest.mark.gpu

BASELINE = Path(__file__).resolve().parents[1] / "docs" / "measurements" / "perf-baseline.json"
TOKENS, RUNS = 128, 3
RECORDED = read_baseline(BASELINE)


@pytest.fixture(scope="module")
def card() -> str:
    with Context(0) as ctx:
        return ctx.name()


@pytest.mark.parametrize("shape", sorted({s for shapes in RECORDED.values() for s in shapes}))
def test_device_loop_keeps_the_recorded_speed(card, shape):
    if card not in RECORDED:
        pytest.skip(f"{BASELINE.name} has no figures for {card!r} (it has: {', '.join(RECORDED)})")
    if shape not in RECORDED[card]:
        pytest.skip(f"{BASELINE.name} has no {shape} figure for {card!r}")
    model = synthetic_model(shape, seed=0)
    with open_cuda_device(model, max_seq=bench_max_seq(model.config)) as device:
        del model
        engine = Engine(device, "cuda", EngineSettings(device_loop=True, burst=16), environ={}, latch=FallbackLatch())
        us, stats = time_generation(engine, PROMPT, TOKENS, RUNS)
    assert stats.path == "device-loop", f"the engine took the {stats.path} path"
    measured = 1e6 / statistics.median(us)
    ok, lowest = guard_verdict(measured, RECORDED[card][shape])
    assert ok, (f"{shape} on {card}: {measured:.0f} tok/s is more than {GUARD_TOLERANCE:.0%} below the recorded "
                f"{RECORDED[card][shape]:.0f} (at least {lowest:.0f} passes); runs: "
                f"{', '.join(f'{1e6 / u:.0f}' for u in us)} tok/s")
