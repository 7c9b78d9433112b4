"""Benchmark on the GPU: copy bandwidth, then microseconds per token of the host path and the
device loop on the scripted model and on synthetic models, all in one run.

    python scripts/bench.py --json bench.json [--shapes stories15M,stories110M,llama1B]
"""

import argparse
import json
import sys

from arcpy import bench
from arcpy.errors import ArcError


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="stories15M,stories110M,llama1B")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args()
    try:
        report = bench.run([s for s in args.shapes.split(",") if s], args.tokens, args.runs)
    except ArcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(bench.format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
