"""The regression guard's baseline (docs/measurements/perf-baseline.json): per card, per benchmark
shape, the greedy device loop's tok/s at burst 16, read, written from a report, and judged.
tests/test_gpu_perf_guard.py holds a card's device loop to it."""

from __future__ import annotations

import json
from pathlib import Path

from arcpy.bench.loop import greedy_loop16
from arcpy.errors import InvalidArgumentError
from arcpy.model import SHAPES

GUARD_TOLERANCE = 0.15  # the regression guard fails below (1 - this) of the recorded tok/s


def read_baseline(path: str | Path) -> dict[str, dict[str, float]]:
    """{card name: {shape: tok/s}} from a baseline file; a malformed one is one clear error."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"{path}: cannot read the baseline: {exc}") from None
    ok = isinstance(data, dict) and all(
        isinstance(card, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                                       for v in card.values())
        for card in data.values())
    if not ok:
        raise InvalidArgumentError(f"{path}: expected {{card name: {{shape: tok/s > 0}}}}")
    return data


def record_baseline(report: dict, path: str | Path) -> dict[str, dict[str, float]]:
    """Write the report's card's figures into the baseline file: per shape, the greedy device loop's
    tok/s at burst 16, rounded. Other cards' figures, and this card's shapes the report did not run,
    stay as they were; a file that is not there yet starts empty. Returns what was written."""
    path = Path(path)
    recorded = read_baseline(path) if path.exists() else {}
    card = dict(recorded.get(report["device"], {}))
    for s in report["shapes"]:
        loop16 = greedy_loop16(s.get("paths", []))
        if s["shape"] in SHAPES and loop16:
            card[s["shape"]] = round(1e6 / loop16[0])
    if not card:
        raise InvalidArgumentError(f"the report has no device-loop figure of a benchmark shape to record in {path}")
    recorded[report["device"]] = dict(sorted(card.items()))
    path.write_text(json.dumps(recorded, indent=1) + "\n")
    return recorded


def guard_verdict(measured_tps: float, recorded_tps: float,
                  tolerance: float = GUARD_TOLERANCE) -> tuple[bool, float]:
    """(passes, the lowest tok/s that passes): a measurement may fall at most `tolerance` below
    the recorded figure."""
    lowest = recorded_tps * (1.0 - tolerance)
    return measured_tps >= lowest, lowest

