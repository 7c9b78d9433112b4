"""Load test of `arcpy serve`: N concurrent clients (default 16) send M streamed requests each
(default 20), greedy, some hanging up at random mid-stream (seeded), for several rounds.

It reports the time to first token and the whole request's latency (p50, p95, p99) and the
tokens per second, and checks, request by request:
- every completed answer equals the same request's answer alone (asked first, one at a time, of
  the same server): no cross-talk, nothing lost, nothing duplicated; its finish reason and token
  count too;
- every answer cut by a hang-up is a prefix of that answer;
- every request ended: [DONE], or the hang-up, or an error (counted; a 503 when the queue is full);
- the server's memory (VmRSS of /proc/<pid>/status) does not grow from round to round (after the
  first, which warms the allocator up): at most --rss-slack MiB above the first round's.

It starts the server itself (the model's flags below), or takes --url (and --pid for the memory
check) of one already running. The exit status is 1 when a check fails.

With --turns T it runs conversations instead (multi-turn mode): --conversations of T turns each,
one after another, every turn the whole history (a system message of --history-words words, the
questions, the answers) and a new question. Each conversation runs twice: with the prefix cache,
and with it cleared before every turn (POST /reset_prefix_cache). It reports the cache's hit rate
(cached prompt tokens over prompt tokens, from the usage) and the time to first token of each turn
with and without it, and checks that both runs answer every turn alike.

    python scripts/load_test.py --json load.json
    python scripts/load_test.py --model tiny-model-dir --backend numpy --clients 8 --requests 10
    python scripts/load_test.py --turns 10 --conversations 4 --history-words 3000 --json turns.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path

from arcpy import __version__
from arcpy.bench import http_client as client
from arcpy.demo import demo_model_path

PROMPTS = ["What is the capital of France?", "Name three colors.", "Write a haiku about rain.",
           "Explain what a lighthouse does.", "Count from one to ten.", "Give me a recipe for tea.",
           "Why is the sky blue?", "Tell me a short joke.", "What do bees make?", "Describe a storm at sea."]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a running server's base URL (default: start one)")
    ap.add_argument("--pid", type=int, default=None, help="with --url: its process id, for the memory check")
    ap.add_argument("--model", default=None, help="model to serve (default: the demo model)")
    ap.add_argument("--backend", choices=["auto", "cuda", "numpy"], default="auto")
    ap.add_argument("--server-args", default="", help="more flags for arcpy serve")
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    ap.add_argument("--requests", type=int, default=20, help="requests per client and round (default 20)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, for the memory check (default 3)")
    ap.add_argument("--max-tokens", type=int, default=48, help="max_tokens of each request (default 48)")
    ap.add_argument("--hang-up", type=float, default=0.2, help="share of requests hung up mid-stream (0.2)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the prompts and the hang-ups (default 0)")
    ap.add_argument("--rss-slack", type=float, default=16.0, help="MiB the server may grow after round 1 (16)")
    ap.add_argument("--note", default=None, help="a line for the report (how the model was made, the machine)")
    ap.add_argument("--json", default=None, help="write the report here")
    ap.add_argument("--turns", type=int, default=0, help="multi-turn mode: turns per conversation (default 0: off)")
    ap.add_argument("--conversations", type=int, default=4, help="multi-turn mode: conversations (default 4)")
    ap.add_argument("--history-words", type=int, default=200,
                    help="multi-turn mode: words of the system message that opens each conversation (default 200)")
    args = ap.parse_args(argv)
    if min(args.clients, args.requests, args.rounds, args.max_tokens) < 1 or not 0 <= args.hang_up <= 1:
        ap.error("--clients, --requests, --rounds and --max-tokens must be >= 1, --hang-up in [0, 1]")
    return args


def percentiles(values) -> dict:
    values = sorted(v for v in values if v is not None)
    if not values:
        return {}
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"p50_ms": pick(0.50) * 1e3, "p95_ms": pick(0.95) * 1e3, "p99_ms": pick(0.99) * 1e3,
            "max_ms": values[-1] * 1e3, "count": len(values)}


def body(model: str, prompt: str, max_tokens: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}


def references(url: str, model: str, max_tokens: int) -> dict:
    """Each prompt's answer alone, one request at a time."""
    out = {}
    for prompt in PROMPTS:
        s = client.stream_chat(url, body(model, prompt, max_tokens))
        if not s.done:
            raise SystemExit(f"load_test: the server did not answer {prompt!r} alone: {s.error}")
        out[prompt] = s
    return out


def run_round(url: str, model: str, args, rng: random.Random, refs: dict) -> dict:
    plans = [[(rng.choice(PROMPTS), rng.randint(1, max(1, args.max_tokens // 2))
               if rng.random() < args.hang_up else None) for _ in range(args.requests)] for _ in range(args.clients)]
    results: list[list] = [[] for _ in range(args.clients)]

    def one_client(i: int) -> None:
        conn = client.connection(url)
        for prompt, hang_up in plans[i]:
            s = client.stream_chat(url, body(model, prompt, args.max_tokens), hang_up_after=hang_up, conn=conn)
            results[i].append((prompt, hang_up, s))
        conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=one_client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    flat = [r for rs in results for r in rs]
    problems, completed, hung_up, errors = [], [], [], []
    for prompt, hang_up, s in flat:
        want = refs[prompt]
        if s.done:
            completed.append(s)
            if (s.text, s.finish_reason, s.tokens) != (want.text, want.finish_reason, want.tokens):
                problems.append(f"{prompt!r}: got {s.text[:60]!r} ({s.finish_reason}, {s.tokens} tokens), alone "
                                f"{want.text[:60]!r} ({want.finish_reason}, {want.tokens})")
        elif s.hung_up:
            hung_up.append(s)
            if not want.text.startswith(s.text):
                problems.append(f"{prompt!r}: hung up after {s.text[:60]!r}, not a prefix of the answer alone")
        elif hang_up is not None and s.error is None and not s.stamps:
            hung_up.append(s)  # the answer ended before the hang-up point
        else:
            errors.append(f"status {s.status}: {s.error}")
    tokens = sum(s.tokens for s in completed)
    planned = sum(1 for _, hang_up, _ in flat if hang_up is not None)
    return {"requests": len(flat), "completed": len(completed), "hung_up": len(hung_up), "errors": len(errors),
            "hang_ups_planned": planned,  # an answer shorter than its hang-up point completes instead
            "error_examples": sorted(set(errors))[:5], "mismatches": len(problems), "mismatch_examples": problems[:5],
            "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft": percentiles([s.ttft for s in completed + hung_up]),
            "latency": percentiles([s.stamps[-1] - s.sent for s in completed if s.stamps]),
            "decode_tokens_per_s_median": statistics.median(
                [r for r in (s.decode_rate for s in completed) if r] or [0.0])}


def run_turns(url: str, model: str, args, cache: bool) -> dict:
    """The conversations of multi-turn mode, with the prefix cache or with it cleared before each
    turn: every turn's text, time to first token and token counts."""
    words = " ".join(f"w{k % 997}" for k in range(args.history_words))
    out = {"texts": [], "ttft": [[] for _ in range(args.turns)], "prompt_tokens": 0, "cached_tokens": 0, "errors": []}
    for c in range(args.conversations):
        rng = random.Random(args.seed * 7919 + c)  # the same questions with and without the cache
        messages, texts = [{"role": "system", "content": f"Conversation {c}. {words}"}], []
        for t in range(args.turns):
            messages.append({"role": "user", "content": rng.choice(PROMPTS)})
            if not cache and client.post(url + "/reset_prefix_cache")[0] != 200:
                out["errors"].append("POST /reset_prefix_cache failed")
            s = client.stream_chat(url, {"model": model, "messages": messages, "max_tokens": args.max_tokens,
                                         "temperature": 0})
            if not s.done:
                out["errors"].append(f"turn {t}: status {s.status}: {s.error}")
                break
            out["ttft"][t].append(s.ttft)
            out["prompt_tokens"] += s.prompt_tokens
            out["cached_tokens"] += s.cached_tokens
            texts.append(s.text)
            messages.append({"role": "assistant", "content": s.text})
        out["texts"].append(texts)
    return out


def multi_turn(url: str, model: str, args) -> dict:
    warm, cold = run_turns(url, model, args, cache=True), run_turns(url, model, args, cache=False)
    turns = []
    for t in range(args.turns):
        w, c = percentiles(warm["ttft"][t]), percentiles(cold["ttft"][t])
        turns.append({"turn": t + 1, "ttft_cached": w, "ttft_cold": c,
                      "ratio_p50": w["p50_ms"] / c["p50_ms"] if w and c else None})
        print(f"load_test: turn {t + 1}: time to first token p50 {w.get('p50_ms', 0):.1f} ms with the cache, "
              f"{c.get('p50_ms', 0):.1f} ms without", file=sys.stderr)
    hit = warm["cached_tokens"] / warm["prompt_tokens"] if warm["prompt_tokens"] else 0.0
    print(f"load_test: cache hit rate {hit:.1%} of {warm['prompt_tokens']} prompt tokens", file=sys.stderr)
    return {"turns": turns, "hit_rate": hit, "prompt_tokens": warm["prompt_tokens"],
            "cached_tokens": warm["cached_tokens"], "cold_cached_tokens": cold["cached_tokens"],
            "errors": warm["errors"] + cold["errors"], "same_answers": warm["texts"] == cold["texts"]}


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))


def main(argv=None) -> int:
    args = parse_args(argv)
    server = None
    if args.url is None:
        model_path = args.model or (str(demo_model_path()) if demo_model_path() else None)
        if model_path is None:
            print('load_test: no --model and the demo model is not fetched (python -m arcpy.demo fetches it)', file=sys.stderr)
            return 2
        flags = ["--model", model_path, "--backend", args.backend, "--max-queue", str(args.clients),
                 "--log-level", "warning", "--no-access-log", *shlex.split(args.server_args)]
        server = client.ServerProcess(flags)
    try:
        url = args.url or server.url
        pid = server.proc.pid if server else args.pid
        status, health = client.get(url + "/health")
        if status != 200:
            raise SystemExit(f"load_test: {url}/health answered {status}")
        health = json.loads(health)
        model = health["model"]
        print(f"load_test: {model} on {health['backend']} ({health['device']}) at {url}", file=sys.stderr)
        if args.turns:
            turns = multi_turn(url, model, args)
            return finish_turns(args, turns, model, health)
        refs = references(url, model, args.max_tokens)
        rng = random.Random(args.seed)
        rounds, rss = [], []
        for k in range(args.rounds):
            rounds.append(run_round(url, model, args, rng, refs))
            time.sleep(0.5)
            if pid:
                rss.append(rss_kib(pid))
            r = rounds[-1]
            print(f"load_test: round {k + 1}: {r['completed']} completed, {r['hung_up']} hung up, {r['errors']} errors, "
                  f"{r['mismatches']} mismatches; {r['tokens_per_s']:.1f} tok/s; time to first token p50 "
                  f"{r['ttft'].get('p50_ms', 0):.1f} ms p99 {r['ttft'].get('p99_ms', 0):.1f} ms"
                  + (f"; server RSS {rss[-1] / 1024:.1f} MiB" if rss else ""), file=sys.stderr)
        metrics = {name: client.metric(url, name) for name in (
            'arcpy_sequences_total{finish_reason="cancelled"}', "arcpy_faults_total", "arcpy_fallbacks_total",
            "arcpy_host_waits_total", "arcpy_generated_tokens_total")}
    finally:
        if server is not None:
            code = server.stop()
            log = server.log
            server.__exit__(None, None, None)
    checks = {"answers_equal_alone": all(r["mismatches"] == 0 for r in rounds),
              "no_errors": all(r["errors"] == 0 for r in rounds),
              "every_round_completed_some": all(r["completed"] > 0 for r in rounds)}
    if len(rss) >= 2:
        checks["rss_does_not_grow"] = max(rss[1:]) - rss[0] <= args.rss_slack * 1024
    if server is not None:
        checks["server_stopped_cleanly"] = code == 0 and "the engine is closed" in log
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "arcpy": __version__, "command": " ".join(sys.argv),
              "model": model, "backend": health["backend"], "device": health["device"], "clients": args.clients,
              "requests_per_client": args.requests, "rounds": args.rounds, "max_tokens": args.max_tokens,
              "hang_up_share": args.hang_up, "seed": args.seed, "prompts": len(PROMPTS),
              "distinct_answers_alone": len({s.text for s in refs.values()}), "server_rss_kib_after_each_round": rss,
              "server_metrics": metrics, "checks": checks, "passed": all(checks.values()), "results": rounds}
    if args.note:
        report["about"] = args.note
    if health["backend"] != "cuda":
        report["note"] = "NumPy reference backend (CPU): latencies and rates are the CPU's, not the GPU's"
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if report["passed"] else 1


def finish_turns(args, turns: dict, model: str, health: dict) -> int:
    checks = {"answers_equal_with_and_without_the_cache": turns["same_answers"], "no_errors": not turns["errors"],
              "the_cleared_runs_reused_nothing": turns["cold_cached_tokens"] == 0}
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "arcpy": __version__, "command": " ".join(sys.argv),
              "mode": "multi-turn", "model": model, "backend": health["backend"], "device": health["device"],
              "conversations": args.conversations, "turns": args.turns, "history_words": args.history_words,
              "max_tokens": args.max_tokens, "seed": args.seed, "checks": checks, "passed": all(checks.values()),
              **turns}
    if args.note:
        report["about"] = args.note
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
