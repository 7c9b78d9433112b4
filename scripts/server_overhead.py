"""The server against the engine alone, in one run on one model (default: the demo model):

- decode tokens/s streamed through the server to one client, against Engine.generate's in this
  process on the same request (target: at least 90%). Decode: the tokens after the first, over
  the time from the first to the last (for the server, the first and the last chunk with text);
  beside it the whole answer's rate from the request, which batching of chunks cannot flatter.
  The target is met when both ratios are;
- the time to first token through the server (HTTP, queue, chat template, tokenizer) against
  Engine.stream's first piece for the same prompt given as token ids (target: at most 2 ms more);
- from a client hanging up mid-stream to the first token of the request queued behind it (target:
  at most one burst + 5 ms; one burst is --burst tokens at the engine's decode rate).

The engine alone lives in this process and the server in a child process with the same model,
backend, burst and context; their repetitions alternate, so that a machine whose speed drifts
weighs on both alike. Each figure is the median of --runs repetitions after a warm-up. The client
keeps its connection alive (the standard library's http.client). Decoding is greedy, so both give
the same text, which is checked (exit status 1 otherwise).

    python scripts/server_overhead.py --json serve-bench.json
    python scripts/server_overhead.py --model tiny-model-dir --backend numpy --tokens 32 --runs 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import shlex
import statistics
import sys
import threading
import time

from arcpy import __version__, _lib
from arcpy.backends import open_engine
from arcpy.bench import http_client as client
from arcpy.demo import demo_model_path
from arcpy.loading import load_checkpoint
from arcpy.loop.engine import Engine
from arcpy.loop.prompt import request_ids
from arcpy.loop.request import Request
from arcpy.model.hub import resolve_model

QUESTION = "Write a long story about a lighthouse keeper and a storm, with many details."
SHORT = "Say hello."
RATE_TARGET, ADDED_TTFT_TARGET_MS, CANCEL_SLACK_MS = 0.90, 2.0, 5.0


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model directory or .gguf file (default: the demo model)")
    ap.add_argument("--backend", choices=["auto", "cuda", "numpy"], default="auto")
    ap.add_argument("--tokens", type=int, default=256, help="new tokens of the long answer (default 256)")
    ap.add_argument("--runs", type=int, default=7, help="timed repetitions of each figure (default 7)")
    ap.add_argument("--burst", type=int, default=4, help="device-loop burst, engine and server (default 4)")
    ap.add_argument("--max-seq", type=int, default=None, help="context of both (default: the engine's)")
    ap.add_argument("--prompt", default=QUESTION, help="the question of the long answer")
    ap.add_argument("--server-args", default="", help="more flags for arcpy serve, e.g. '--switch-interval 0.001'")
    ap.add_argument("--note", default=None, help="a line for the report (how the model was made, the machine)")
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    if args.tokens < 2 or args.runs < 1 or args.burst < 1:
        ap.error("--tokens must be >= 2, --runs and --burst >= 1")
    return args


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


class Alone:
    """The engine in this process."""

    def __init__(self, engine: Engine, text, args):
        self.engine = engine
        ids = request_ids(text, Request(messages=[{"role": "user", "content": args.prompt}]))
        self.long = Request(prompt_ids=ids, max_new_tokens=args.tokens)
        self.short_messages = Request(messages=[{"role": "user", "content": SHORT}], max_new_tokens=2)
        self.short = Request(prompt_ids=request_ids(text, self.short_messages), max_new_tokens=2)
        self.decode, self.whole, self.first, self.first_template, self.tokens = [], [], [], [], 0

    def answer(self) -> str:
        return "".join(self.engine.chat(self.long))

    def run(self) -> None:
        started, stamps = time.perf_counter(), []
        for _ in self.engine.generate(self.long):
            stamps.append(time.perf_counter())
        self.tokens = len(stamps)
        self.decode.append((len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else None)
        self.whole.append(len(stamps) / (stamps[-1] - started) if stamps else None)
        for request, into in ((self.short, self.first), (self.short_messages, self.first_template)):
            started = time.perf_counter()
            pieces = self.engine.stream(request)
            next(p for p in pieces if p.token is not None)
            into.append(time.perf_counter() - started)
            pieces.close()


class Served:
    """The server in its child process, and one client that keeps its connection."""

    def __init__(self, server: client.ServerProcess, name: str, args):
        self.server, self.url = server, server.url
        self.long = {"model": name, "messages": [{"role": "user", "content": args.prompt}], "max_tokens": args.tokens}
        self.short = {"model": name, "messages": [{"role": "user", "content": SHORT}], "max_tokens": 2}
        self.conn = client.connection(self.url)
        self.streams, self.first, self.cancels = [], [], []

    def stream(self, body) -> client.Streamed:
        out = client.stream_chat(self.url, body, conn=self.conn)
        if out.error or not out.done:
            raise SystemExit(f"server_overhead: the server failed a request: {out.error}")
        return out

    def run(self) -> None:
        self.streams.append(self.stream(self.long))
        self.first.append(self.stream(self.short).ttft)

    def cancel(self) -> None:
        """A client hangs up at its first token once another request waits in the queue: the
        seconds from the hang-up to that request's first token. The long answer's budget is the
        context, so that it is still running when the other request arrives."""
        for _ in range(3):
            first, hung_up = {}, {}
            waiting = threading.Thread(target=client.stream_chat, args=(self.url, self.short),
                                       kwargs={"on_first": lambda: first.setdefault("at", time.perf_counter())})

            def queue_the_next_one():
                waiting.start()
                while json.loads(client.get(self.url + "/health")[1])["queue_depth"] < 1:
                    if "at" in first or not waiting.is_alive():
                        return  # the long answer ended first: nothing was queued behind it
                    time.sleep(0.0005)
                hung_up["at"] = time.perf_counter()

            context = json.loads(client.get(self.url + "/health")[1])["max_seq"]
            budget = context - self.streams[0].prompt_tokens  # the most the server takes (a larger one is a 400)
            streamed = client.stream_chat(self.url, {**self.long, "max_tokens": budget}, hang_up_after=1,
                                          on_first=queue_the_next_one)
            waiting.join(120)
            if streamed.hung_up and "at" in hung_up and "at" in first:
                self.cancels.append(first["at"] - hung_up["at"])
                return
        raise SystemExit("server_overhead: the long answer kept ending before a request could queue behind it")


def main(argv=None) -> int:
    args = parse_args(argv)
    model_path = args.model or (str(demo_model_path()) if demo_model_path() else None)
    if model_path is None:
        print('server_overhead: no --model and the demo model is not fetched (python -m arcpy.demo fetches it)', file=sys.stderr)
        return 2
    backend = _lib.auto_backend() if args.backend == "auto" else args.backend
    model, text = load_checkpoint(resolve_model(model_path).path)  # a path, or a name of the hub
    flags = ["--model", model_path, "--backend", backend, "--burst", str(args.burst), "--temperature", "0",
             "--log-level", "warning", "--no-access-log", *shlex.split(args.server_args)]
    if args.max_seq:
        flags += ["--max-seq", str(args.max_seq)]
    print(f"server_overhead: {model.name} on {backend}", file=sys.stderr)
    with open_engine(model, backend, max_seq=args.max_seq, burst=args.burst, text=text) as engine, \
            client.ServerProcess(flags) as server:
        alone, served = Alone(engine, text, args), Served(server, model.name, args)
        device = engine.device.ctx.name() if backend == "cuda" else f"CPU: {platform.processor() or platform.machine()}"
        alone.run(), served.run()  # warm-up
        alone.decode, alone.whole, alone.first, alone.first_template, served.streams, served.first = \
            [], [], [], [], [], []
        for i in range(args.runs):
            alone.run()
            served.run()
            print(f"server_overhead: run {i + 1} of {args.runs}", file=sys.stderr)
        for _ in range(args.runs):
            served.cancel()
        same_text = served.stream(served.long).text == alone.answer()
        path, engine_waits = engine.stats.path, engine.stats.host_waits
        host_waits = client.metric(server.url, "arcpy_host_waits_total")
        freed = client.metric(server.url, "arcpy_cancel_seconds_sum") / max(
            1.0, client.metric(server.url, "arcpy_cancel_seconds_count"))
        served.conn.close()
    decode = (median(s.decode_rate for s in served.streams), median(alone.decode))
    whole = (median(s.tokens / (s.stamps[-1] - s.sent) for s in served.streams if s.stamps), median(alone.whole))
    ratio, whole_ratio = decode[0] / decode[1], whole[0] / whole[1]
    first_ms = (median(served.first) * 1e3, median(alone.first) * 1e3)
    cancel_ms = median(served.cancels) * 1e3
    burst_ms = args.burst / decode[1] * 1e3
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "arcpy": __version__, "python": platform.python_version(),
        "command": " ".join(sys.argv), "model": model.name, "backend": backend, "device": device, "path": path,
        "burst": args.burst, "tokens": args.tokens, "runs": args.runs, "server_args": args.server_args,
        "uvloop": importlib.util.find_spec("uvloop") is not None,
        "httptools": importlib.util.find_spec("httptools") is not None,
        "same_text": same_text,
        "decode": {"engine_tokens_per_s": decode[1], "server_tokens_per_s": decode[0], "ratio": ratio,
                   "engine_whole_tokens_per_s": whole[1], "server_whole_tokens_per_s": whole[0],
                   "whole_ratio": whole_ratio, "answer_tokens": served.streams[0].tokens,
                   "chunks_with_text": len(served.streams[0].stamps), "target": RATE_TARGET,
                   "met": min(ratio, whole_ratio) >= RATE_TARGET},
        "time_to_first_token": {"engine_first_piece_ms": first_ms[1],
                                "engine_first_piece_with_template_ms": median(alone.first_template) * 1e3,
                                "server_ms": first_ms[0], "added_ms": first_ms[0] - first_ms[1],
                                "target_added_ms": ADDED_TTFT_TARGET_MS,
                                "met": first_ms[0] - first_ms[1] <= ADDED_TTFT_TARGET_MS},
        "cancel": {"hang_up_to_next_first_token_ms": cancel_ms, "cancel_to_engine_free_ms": freed * 1e3,
                   "one_burst_ms": burst_ms, "target_ms": burst_ms + CANCEL_SLACK_MS,
                   "met": cancel_ms <= burst_ms + CANCEL_SLACK_MS},
        "host_waits": {"engine_last_sequence": engine_waits, "server_total": host_waits},
        "samples": {"engine_decode": alone.decode, "server_decode": [s.decode_rate for s in served.streams],
                    "engine_first_piece_ms": [t * 1e3 for t in alone.first],
                    "server_first_token_ms": [t * 1e3 for t in served.first],
                    "hang_up_to_next_first_token_ms": [t * 1e3 for t in served.cancels]},
    }
    if args.note:
        report["about"] = args.note
    if backend != "cuda":
        report["note"] = "NumPy reference backend: the targets are the GPU's; this run checks that the bench works"
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if not same_text:
        print("server_overhead: the server's text differs from the engine's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
