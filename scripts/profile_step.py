"""Every kernel of a synthetic shape's decode step launched once, for a profiler that measures
launch by launch, such as Nsight Compute. The kernels are the per-kernel table's
(arcpy.bench.kernels), over layer 0's weights, each waited for before the next; attention at the
positions given. One JSON line per kernel on stdout, in launch order, so that the profiler's
report can be matched to the table's rows:

    ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats \\
        --section Occupancy --metrics dram__bytes_read.sum,smsp__thread_inst_executed.sum \\
        python scripts/profile_step.py --shapes llama8B-q4km

As in the table, the down GEMV stages its own input (the step hands it over from the SwiGLU GEMV
from an FFN width of 12,288), and the library is the one arcpy loads (ARC_LIBRARY picks a build).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from arcpy import _lib
from arcpy.bench.kernels import Buffers, StepTensors, kernel_specs
from arcpy.bench.loop import bench_max_seq, script_status
from arcpy.bench.loop import positions as position_list
from arcpy.devices.context import Context
from arcpy.model import SHAPES, ModelConfig, preset_formats


def launch_each_once(cfg: ModelConfig, max_seq: int, positions: list[int],
                     formats: dict[str, int] | None = None) -> list[dict]:
    """Every kernel of the step for `cfg` launched once, eagerly, in the per-kernel table's order,
    over layer 0's weights (a global kernel once), each waited for before the next. Each row is
    its KernelSpec with `launches`, the kernels it launched (a layer whose q, k and v differ in
    format launches one GEMV per run of equal formats)."""
    with Context(0) as ctx:
        buf = Buffers(ctx)
        try:
            step = StepTensors(buf, cfg, max_seq, positions, formats)
            ctx.wait_idle()
            counters = ctx.ffi.new("arc_counters *")

            def launched() -> int:
                _lib.check(ctx.lib.arc_context_counters(ctx.ptr, counters))
                return int(counters.kernel_launches)

            rows = []
            for spec in kernel_specs(cfg, positions, formats):
                before = launched()
                step.launches(spec)[0]()
                ctx.wait_idle()
                rows.append({**asdict(spec), "launches": launched() - before})
            return rows
        finally:
            buf.free()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="llama8B-q4km", help="comma-separated synthetic shapes")
    ap.add_argument("--positions", type=position_list, default=[130], help="attention positions, e.g. 130,512")
    a = ap.parse_args(argv)

    def body():
        shapes = a.shapes.split(",")
        formats = {shape: preset_formats(shape) for shape in shapes}  # refuses an unknown shape first
        for shape in shapes:
            cfg = SHAPES[shape]
            # A cache deep enough for the deepest position asked (a position past it would time
            # the kernel's early return for positions outside the cache).
            max_seq = max(bench_max_seq(cfg), max(a.positions) + 1)
            for row in launch_each_once(cfg, max_seq, a.positions, formats[shape]):
                print(json.dumps({"shape": shape, **row}), flush=True)

    return script_status(body)


if __name__ == "__main__":
    sys.exit(main())
