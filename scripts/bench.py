"""Benchmark on the GPU, in one run: the copy bandwidth; per shape the host path and the device
loop (bursts 4 and 16) on synthetic models, greedy and sampled (temperature 0.8, top-p 0.95), the
bandwidth floor and the share of it reached, the device memory the shape takes (computed from its
config), the step graph's size, the time to first token for prompts of 128 to 8,192 tokens (one
prefill; token by token beside the shortest), each kernel of the step alone and the prefill's
matrix products (--kernels), and Hugging Face `generate` on the same shape (--hf, where torch and
transformers import).

    python scripts/bench.py --json bench.json
    python scripts/bench.py --shapes stories15M,llama1B --runs 3 --no-hf --json bench.json
    python scripts/bench.py --shapes llama1B-q4km,llama8B-q4km,llama8B-q8,llama70B-q4km --json quant.json
    python scripts/bench.py --shapes "" --speculation --json spec.json

--speculation adds the device loop with speculative steps beside the plain one (arcpy.bench.speculate):
what a speculative step costs, and tokens/s on prompts that repeat earlier text and on free text, on
--spec-shapes and on the demo model (SmolLM2-135M) when it is fetched.

--serving adds, on --serving-shapes and the demo model when fetched, a conversation's turns with the
prefix cache against cold (time to first token, hit rate, equal answers) and the device loop with
log-probabilities against without (arcpy.bench.serving_features):

    python scripts/bench.py --shapes "" --serving --json serving.json

--context N,M,... adds, per shape, the device loop (plain steps) after prompts of N, M, ... tokens
(arcpy.bench.context; 0 is a one-token prompt), every context on one device opened for the longest:
its floor counts the KV bytes the step reads beside the weights, and a model with windowed layers is
timed on the same weights with its window off too, which shows what reading only the window saves.
The shape's dims run at as many positions as the longest context needs. With --kernels (the default)
each context also times one layer's decode attention alone at its position, with the rate at which
it reads K and V (a bf16 cache's). --kv-cache bf16,q8_0 runs the context rows with each form of the
KV cache, on a device each, their floors counting each form's bytes. --no-loop leaves out the
per-shape loop rows (the copy bandwidth is still measured):

    python scripts/bench.py --shapes gemma3-4B --context 4096 --no-kernels --no-hf --json ctx.json
    python scripts/bench.py --shapes llama8B-q4km,qwen3-8B-q4km,qwen3-30B-A3B-q4km --context 0,4096,8192,32768 \
        --no-loop --no-kernels --no-hf --tokens 128 --json ctx.json

The quantized presets (their matrices in arc.h's quantized formats, llama.cpp's Q4_K_M mix or Q8_0)
run with the same parts; their floor is the bytes of their rows, and Hugging Face is not run on them.

The JSON report is rewritten after each shape, so a run cut short keeps what it measured;
progress and the time each part took go to stderr.
"""

import argparse
import json
import sys

from arcpy.bench import guard
from arcpy.bench import hf as hf_bench
from arcpy.bench import context as context_bench
from arcpy.bench import loop as bench
from arcpy.bench import parallel as parallel_bench
from arcpy.bench import serving_features as serving_bench
from arcpy.bench import speculate as spec_bench
from arcpy.demo import demo_model_path
from arcpy.errors import ArcError
from arcpy.model import synthetic_model

DEFAULT_SHAPES = "stories15M,stories110M,smollm2-135M,llama1B,llama8B"
SPEC_SHAPES = "smollm2-135M,llama1B,llama8B"
SERVING_SHAPES = "llama8B-q4km"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma-separated (default {DEFAULT_SHAPES})")
    ap.add_argument("--tokens", type=bench.at_least_two, default=256, help="tokens per generation (default 256)")
    ap.add_argument("--runs", type=bench.positive, default=5,
                    help="timed generations per path, and timed replays per kernel (default 5)")
    ap.add_argument("--kernels", action=argparse.BooleanOptionalAction, default=True,
                    help="the per-kernel table (default on)")
    ap.add_argument("--hf", action=argparse.BooleanOptionalAction, default=None,
                    help="Hugging Face generate on each shape (default: on where torch and transformers import)")
    ap.add_argument("--hf-tokens", type=bench.at_least_two, default=64, help="new tokens of the long generate (default 64)")
    ap.add_argument("--hf-runs", type=bench.positive, default=3, help="timed generate pairs per shape (default 3)")
    ap.add_argument("--hf-compile", action="store_true",
                    help="let transformers torch.compile the static-cache generate (off by default: on "
                         "the H200 the compile took 14 to 65 s per shape; the warm-up time is reported)")
    ap.add_argument("--speculation", action=argparse.BooleanOptionalAction, default=False,
                    help="the speculation benchmark too (default off)")
    ap.add_argument("--spec-shapes", default=SPEC_SHAPES, help=f"its synthetic shapes (default {SPEC_SHAPES})")
    ap.add_argument("--loop", action=argparse.BooleanOptionalAction, default=True,
                    help="the per-shape loop rows (default on; --no-loop with --context times the contexts alone)")
    ap.add_argument("--context", default=None,
                    help="comma-separated prompt lengths (0,4096,8192,32768): also time each shape's device loop "
                         "after each, its floor counting the KV reads, and a windowed model without its window too")
    ap.add_argument("--kv-cache", default="bf16",
                    help="comma-separated forms of the KV cache the --context rows run with (bf16,q8_0), each on a "
                         "device of its own; the floor counts each form's bytes")
    ap.add_argument("--serving", action=argparse.BooleanOptionalAction, default=False,
                    help="the serving features too (arcpy.bench.serving_features): a conversation of --turns turns, "
                         "its last history --history tokens, with the prefix cache and cold; the device loop "
                         "with top_logprobs 5 against none; on --serving-shapes and the demo model when fetched")
    ap.add_argument("--serving-shapes", default=SERVING_SHAPES, help=f"its synthetic shapes (default {SERVING_SHAPES})")
    ap.add_argument("--turns", type=bench.positive, default=10, help="turns of the --serving conversation (default 10)")
    ap.add_argument("--history", type=bench.positive, default=4096,
                    help="tokens of its last turn's history (default 4096)")
    ap.add_argument("--tensor-parallel", type=bench.positive, default=None, metavar="N",
                    help="also each shape split over GPUs 0..N-1 (device loop, burst 16), beside it whole on GPU 0")
    ap.add_argument("--record-baseline", metavar="PATH", default=None,
                    help="write this card's greedy device-loop figures (burst 16) per shape into the regression "
                         "guard's baseline file (docs/measurements/perf-baseline.json), keeping other cards'")
    ap.add_argument("--json", help="write the report here")
    return ap.parse_args(argv)


def progress(line: str) -> None:
    print(f"[bench] {line}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    hf = args.hf
    if hf is None:
        hf, why = hf_bench.hf_available()
        if not hf:
            progress(f"Hugging Face comparison skipped: {why}")

    def save(report: dict) -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)

    try:
        contexts = context_bench.parse_contexts(args.context) if args.context else []
        kv_caches = context_bench.parse_kv_caches(args.kv_cache)
        report = bench.run(shapes if args.loop else [], args.tokens, args.runs, kernels=args.kernels,
                           hf=bench.HfRun(args.hf_tokens, args.hf_runs, args.hf_compile) if hf else None,
                           on_update=save, progress=progress)
    except ArcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(bench.format_table(report))
    if args.record_baseline:
        try:
            recorded = guard.record_baseline(report, args.record_baseline)
        except ArcError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{args.record_baseline}: {report['device']}: "
              + ", ".join(f"{k} {v}" for k, v in recorded[report["device"]].items()) + " tok/s")
    if contexts:
        try:
            report["context"] = {}
            max_seq = context_bench.context_max_seq(contexts, args.tokens)
            for shape in shapes:
                model = synthetic_model(shape, seed=0, max_seq=max_seq)
                rows = context_bench.context_rows(model, report["copy_bandwidth_GBps"] * 1e9, contexts,
                                                  args.tokens, args.runs, max_seq, kv_caches)
                cfg = model.config
                del model
                report["context"][shape] = rows
                save(report)
                print("\n".join(context_bench.format_rows(shape, rows)))
                if args.kernels:
                    attention = context_bench.attention_rows(cfg, max_seq, contexts, args.runs,
                                                             report["copy_bandwidth_GBps"] * 1e9)
                    report.setdefault("context_attention", {})[shape] = attention
                    save(report)
                    print("\n".join(context_bench.format_attention(shape, attention)))
        except ArcError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if args.serving:
        try:
            report["serving"] = serving_bench.run([s for s in args.serving_shapes.split(",") if s], demo_model_path(), args.turns, args.history, args.tokens,
                                                  args.runs, progress)
        except ArcError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        save(report)
        for name, rows in report["serving"].items():
            print("\n".join(serving_bench.format_rows(name, rows.get("turns"), rows.get("logprobs"),
                                                       rows.get("constrained"))))
    if args.tensor_parallel:
        try:
            report["tensor_parallel"] = parallel_bench.run(shapes, args.tensor_parallel, args.tokens, args.runs, progress)
        except ArcError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        save(report)
        print(parallel_bench.format_rows(report["tensor_parallel"]))
    if args.speculation:
        try:
            report["speculation"] = spec_bench.run([s for s in args.spec_shapes.split(",") if s], args.tokens,
                                                   args.runs, demo_model_path(), progress)
        except ArcError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        save(report)
        print(spec_bench.format_table(report["speculation"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
