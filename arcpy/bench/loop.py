"""Measurements on the GPU: the copy bandwidth that bounds a memory-bound forward, the per-token
time of the device loop and of the host path on the same model, each kernel of the step alone
(kernel_bench), the time to first token, and Hugging Face `generate` on the same shape (hf_bench),
all in the same run.

Per-token time is taken in steady state: the wall time between the first and the last token a
generation yields, divided by the tokens between them, so prefill and start-up are excluded.
Each figure is the median of several generations after a warm-up one. The bandwidth floor of a
model is (weight bytes read per token) / (copy bandwidth): no decode can be faster. A quantized
preset's weight bytes are its tensors as held (Model.weight_bytes): its rows' bytes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from arcpy import _lib
from arcpy.bench import hf as hf_bench
from arcpy.bench import deltanet as deltanet_bench
from arcpy.bench import kernels as kernel_bench
from arcpy.bench.kernels import SAMPLED, SAMPLED_NAME
from arcpy.codes import FORMAT_BF16, FORMAT_NAMES
from arcpy.devices.context import Context
from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.cuda_model import PREFILL_CHUNK
from arcpy.devices.scripted import scripted_device
from arcpy.errors import ArcError, InvalidArgumentError
from arcpy.loop.engine import Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.model import SHAPES, ModelConfig, preset_formats, synthetic_model
from arcpy.model.hybrid import state_bytes_per_token

PROMPT = [1, 2, 3, 4]
BENCH_MAX_SEQ = 8192           # the KV cache every shape is benchmarked with (or its own, if smaller)
TTFT_PROMPTS = (128, 1024, 2048, 8192)  # prompt lengths of the time to first token, where they fit
GREEDY = "greedy"               # the sampling column of greedy rows; sampled ones name SAMPLED


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


# --- the scripts' arguments ---------------------------------------------------------------

def positive(text: str) -> int:
    """argparse type: a count of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def at_least_two(text: str) -> int:
    """argparse type: tokens of a timed generation (steady state needs two)."""
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be >= 2 (steady state needs two tokens), got {value}")
    return value


def positions(text: str) -> list[int]:
    """argparse type: comma-separated attention positions (non-negative)."""
    try:
        values = [int(p) for p in text.split(",") if p]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected positions like 130,512, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"positions must be >= 0, got {text!r}")
    return values


def script_status(body: Callable[[], None]) -> int:
    """A script's exit status: 0 after body(); an ArcError instead told in one line on stderr
    (`error: ...`), and 1."""
    try:
        body()
    except ArcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


# --- figures computed from the config ---------------------------------------------------------

def bench_max_seq(cfg: ModelConfig) -> int:
    return min(cfg.max_seq, BENCH_MAX_SEQ)


def generation_positions(prompt_len: int, tokens: int, max_seq: int) -> tuple[int, int]:
    """(first, last) position a forward runs at while the engine generates `tokens` after a
    prompt: the first token comes from the prompt's last position, and the engine stops short of
    max_seq."""
    new = max(1, min(tokens, max_seq - prompt_len))
    return prompt_len - 1, prompt_len - 2 + new


def device_memory(cfg: ModelConfig, max_seq: int, scratch_bytes: int = 0, stored_bytes: int | None = None) -> dict:
    """Bytes of device memory a model of `cfg` takes, from the config (not measured): every
    stored weight in bf16 (or `stored_bytes`, a model's tensors as held: Model.stored_bytes) and
    the RoPE table, the bf16 KV cache of the attention layers for max_seq positions, and the float32 activations with the
    attention's scratch."""
    weights = (2 * cfg.n_params if stored_bytes is None else stored_bytes) + 4 * (cfg.head_dim // 2)
    kv = 2 * cfg.kv_layers * cfg.n_kv_heads * max_seq * cfg.head_dim * 2
    qkv_rows = cfg.q_dim + 2 * cfg.kv_dim
    act = 4 * (cfg.dim + qkv_rows + cfg.q_dim + cfg.ffn_dim + cfg.vocab) + scratch_bytes
    return {"max_seq": max_seq, "weights": weights, "kv_cache": kv, "activations": act,
            "total": weights + kv + act}


def attention_scratch_bytes(cfg: ModelConfig, max_seq: int) -> int:
    ffi, lib = _lib.load()
    sb = ffi.new("uint64_t *")
    _lib.check(lib.arc_op_attention_scratch_bytes(cfg.n_heads, cfg.head_dim, max_seq, sb))
    return int(sb[0])


# --- host path and device loop ----------------------------------------------------------------

@dataclass
class PathResult:
    path: str
    burst: int
    us_per_token: float                     # median over runs
    runs_us: list = field(default_factory=list)
    graph_launches_per_token: float = 0.0
    cuda_calls_per_token: float = 0.0
    host_waits_per_token: float = 0.0
    sampling: str = GREEDY                  # GREEDY, or SAMPLED_NAME: SAMPLED's parameters


def time_generation(engine: Engine, prompt: list[int], tokens: int, runs: int,
                    sampling=None) -> tuple[list[float], object]:
    per_token = []
    for i in range(runs + 1):
        stamps = []
        for _ in engine.generate(prompt, tokens, sampling=sampling):
            stamps.append(time.perf_counter())
        if i > 0:  # the first run warms up
            per_token.append((stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e6)
    return per_token, engine.stats


def bench_paths(device, tokens: int, runs: int, bursts=(4, 16), sampled_burst: int = 16) -> list[PathResult]:
    """Greedy: the host path and the device loop at each burst; sampled (SAMPLED): the host path
    and, where the device draws, the device loop at `sampled_burst`. Plain steps only: each row is
    the step against the bandwidth floor (speculative steps have rows of their own, --speculation)."""
    results = []
    configs = [("host", False, 1, None)] + [("device-loop", True, b, None) for b in bursts]
    configs.append(("host", False, 1, SAMPLED))
    if device.capabilities.sampling:
        configs.append(("device-loop", True, sampled_burst, SAMPLED))
    for name, loop, burst, sampling in configs:
        eng = Engine(device, "cuda", EngineSettings(device_loop=loop, burst=burst, speculate=False), environ={},
                     latch=FallbackLatch())
        us, st = time_generation(eng, PROMPT, tokens, runs, sampling)
        if st.path != name:
            raise ArcError(f"asked for the {name} path, the engine took {st.path}")
        results.append(PathResult(name, burst, statistics.median(us), [round(u, 2) for u in us],
                                  st.per_token(st.graph_launches), st.per_token(st.cuda_calls),
                                  st.per_token(st.host_waits), GREEDY if sampling is None else SAMPLED_NAME))
    return results


def greedy_loop16(paths: list) -> list[float]:
    """us/token of the greedy device loop at burst 16: the figure the step is judged by."""
    return [p["us_per_token"] for p in paths
            if p["path"] == "device-loop" and p["burst"] == 16 and p.get("sampling", GREEDY) == GREEDY]


def graph_nodes(device) -> int | None:
    """Nodes of the device loop's step graph, when this libarc can say."""
    lib = device.lib
    if device.step_graph is None or not hasattr(lib, "arc_graph_node_count"):
        return None
    n = device.ffi.new("uint64_t *")
    _lib.check(lib.arc_graph_node_count(device.step_graph, n))
    return int(n[0])


def quantized_preset(shape: str) -> bool:
    return any(f != FORMAT_BF16 for f in preset_formats(shape).values())


def format_counts(formats: dict[str, int]) -> dict[str, int]:
    """How many matrix tensors each format holds, e.g. {"Q4_K": 192, "Q6_K": 33}."""
    names = [FORMAT_NAMES[f] for f in formats.values()]
    return {name: names.count(name) for name in sorted(set(names))}


def bench_shape(shape: str, bandwidth: float, tokens: int, runs: int, kernels: bool) -> dict:
    """One shape: paths, step graph, memory, and (when asked) the per-kernel table."""
    t0 = time.perf_counter()
    model = synthetic_model(shape, seed=0)
    cfg, max_seq, formats = model.config, bench_max_seq(model.config), preset_formats(shape)
    seconds = {"make_weights": round(time.perf_counter() - t0, 1)}
    state = state_bytes_per_token(cfg)  # a hybrid's DeltaNet state, read and written a token
    out = {"shape": shape, "formats": format_counts(formats), "weight_bytes": model.weight_bytes,
           "state_bytes": state, "floor_us": (model.weight_bytes + state) / bandwidth * 1e6,
           "memory_from_config": device_memory(cfg, max_seq, attention_scratch_bytes(cfg, max_seq), model.stored_bytes),
           "seconds": seconds}
    if cfg.n_experts:  # a token reads its k experts of each MoE layer: weight_bytes counts only those
        out["experts"] = {"n_experts": cfg.n_experts, "used": cfg.n_experts_used, "all_weight_bytes": model.full_weight_bytes,
                          "moe_layers": sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))}
    t0 = time.perf_counter()
    with open_cuda_device(model, max_seq=max_seq) as device:
        del model  # the device holds the weights now; a large model's host copy can go
        seconds["load"] = round(time.perf_counter() - t0, 1)
        out["step_graph_nodes"] = graph_nodes(device)
        t0 = time.perf_counter()
        out["paths"] = [asdict(p) for p in bench_paths(device, tokens, runs)]
        seconds["paths"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        out["ttft"] = time_to_first_token(device, runs)
        seconds["ttft"] = round(time.perf_counter() - t0, 1)
    if kernels and state:  # a hybrid: its DeltaNet step alone (the layer table takes every layer to attend)
        t0 = time.perf_counter()
        try:
            out["deltanet"] = deltanet_bench.bench_deltanet(cfg, runs)
        except ArcError as exc:
            out["deltanet"] = {"error": str(exc)}
        seconds["kernels"] = round(time.perf_counter() - t0, 1)
    elif kernels:
        t0 = time.perf_counter()
        out["kernels"] = kernel_report(cfg, max_seq, tokens, runs, out["paths"], formats)
        try:
            out["prefill_gemms"] = kernel_bench.bench_gemms(cfg, min(PREFILL_CHUNK, max_seq), runs)
        except ArcError as exc:
            out["prefill_gemms"] = {"error": str(exc)}
        seconds["kernels"] = round(time.perf_counter() - t0, 1)
    return out


def time_to_first_token(device, runs: int, lengths=TTFT_PROMPTS, token_by_token: bool = True) -> list[dict]:
    """Milliseconds from Engine.start to the first token in hand on the device loop, for random
    prompts of each length the context holds: the prompt in one prefill (chunks of
    PREFILL_CHUNK) and, for the shortest (with token_by_token), token by token through the decode
    step beside it."""
    rng = np.random.default_rng(1)
    rows = []
    for length in [n for n in lengths if n < device.max_seq]:
        prompt = rng.integers(0, device.vocab, length).tolist()
        for prefill in (True, False) if token_by_token and length == lengths[0] else (True,):
            # Cold each time: the prefix cache would hand the repeated prompt's rows back.
            eng = Engine(device, "cuda",
                         EngineSettings(device_loop=True, burst=1, prefill=prefill, prefix_cache=False), environ={},
                         latch=FallbackLatch())
            ms = []
            for i in range(runs + 1):
                t0 = time.perf_counter()
                gen = eng.generate(prompt, 1)
                next(gen)
                elapsed = (time.perf_counter() - t0) * 1e3
                gen.close()
                if i > 0:  # the first run warms up
                    ms.append(elapsed)
            if eng.stats.path != "device-loop" or eng.stats.prefill is not prefill:
                raise ArcError(f"time to first token: the engine took the {eng.stats.path} path, prefill "
                               f"{eng.stats.prefill}")
            rows.append({"prompt_tokens": length, "prefill": prefill, "ms": statistics.median(ms),
                         "runs_ms": [round(m, 3) for m in ms]})
    return rows


def kernel_report(cfg: ModelConfig, max_seq: int, tokens: int, runs: int, paths: list,
                  formats: dict[str, int] | None = None) -> dict:
    """The per-kernel timings of one shape beside its step; a libarc error is recorded, not raised."""
    first, last = generation_positions(len(PROMPT), tokens, max_seq)
    positions = kernel_bench.attention_positions((first + last) // 2, last, max_seq)
    try:
        timings = kernel_bench.bench_kernels(cfg, max_seq, positions, replays=runs, formats=formats)
    except ArcError as exc:
        return {"error": str(exc)}
    loop16 = greedy_loop16(paths)
    return {"graph_launches": cfg.n_layers, "replays": runs, "positions": positions,
            "generation_positions": [first, last], "timings": timings,
            "sum_us": kernel_bench.step_sum_us(timings), "step_us": loop16[0] if loop16 else None}


def bench_scripted(tokens: int, runs: int) -> dict:
    """The loop's own cost: the scripted model's forward is one tiny kernel."""
    with Context(0) as ctx:
        device = scripted_device(ctx)
        try:
            return {"shape": "scripted", "weight_bytes": 0, "floor_us": 0.0, "step_graph_nodes": graph_nodes(device),
                    "paths": [asdict(p) for p in bench_paths(device, tokens, runs)]}
        finally:
            device.close()


# --- the whole run ----------------------------------------------------------------------------

@dataclass(frozen=True)
class HfRun:
    """The Hugging Face comparison of a run: tokens a generation, runs, and torch.compile or not."""

    tokens: int = 64
    runs: int = 3
    compile: bool = False


def run(shapes, tokens: int = 256, runs: int = 5, *, kernels: bool = False, hf: HfRun | None = None,
        on_update: Callable[[dict], None] | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """The benchmark (with `hf`, Hugging Face too). `on_update(report)` is called after each part, so
    a run cut short keeps what it measured; `progress(line)` hears what was done and how long."""
    shapes = list(shapes)
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise InvalidArgumentError(f"unknown shape(s) {', '.join(unknown)} (choose from {', '.join(SHAPES)})")
    if tokens < 2 or runs < 1 or (hf is not None and (hf.tokens < 2 or hf.runs < 1)):
        raise InvalidArgumentError("tokens and hf_tokens must be >= 2, runs and hf_runs >= 1")
    say = progress or (lambda line: None)
    update = on_update or (lambda report: None)
    with Context(0) as ctx:
        name = ctx.name()
        bandwidth = copy_bandwidth(ctx)
    report = {"device": name, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "copy_bandwidth_GBps": bandwidth / 1e9, "tokens": tokens, "runs": runs, "shapes": []}
    say(f"{name}: copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    report["shapes"].append(bench_scripted(tokens, runs))
    update(report)
    for shape in shapes:
        report["shapes"].append(bench_shape(shape, bandwidth, tokens, runs, kernels))
        say(f"{shape}: seconds {report['shapes'][-1]['seconds']}")
        update(report)
    if hf is not None:  # Hugging Face runs the bf16 shapes; a quantized preset has no counterpart there
        report["hf"] = hf_bench.hf_report([s for s in shapes if not quantized_preset(s)], PROMPT, hf.tokens,
                                          hf.runs, hf.compile, say)
        update(report)
    return report


# --- the report as text -----------------------------------------------------------------------

def format_table(report: dict) -> str:
    """The report as text: one row per shape and path (and Hugging Face), then per shape its
    memory, step graph and kernels. Reports of earlier versions, without those parts, print too."""
    bw = report["copy_bandwidth_GBps"]
    hf = report.get("hf") or {}
    lines = [f"{report['device']}, {report['date']}: copy bandwidth {bw:.0f} GB/s; "
             f"{report['tokens']} tokens per generation, median of {report['runs']}",
             f"{'shape':12s} {'path':12s} {'sampling':>8s} {'burst':>5s} {'us/token':>9s} {'tok/s':>8s} {'floor us':>9s} "
             f"{'floor/us':>8s} {'launch/t':>8s} {'cuda/t':>7s} {'wait/t':>6s}"]
    for s in report["shapes"]:
        for p in s["paths"]:
            lines.append(f"{s['shape']:12s} {p['path']:12s} {p.get('sampling', GREEDY):>8s} {p['burst']:5d} "
                         f"{_speed(p['us_per_token'], s['floor_us'])} "
                         f"{p['graph_launches_per_token']:8.2f} {p['cuda_calls_per_token']:7.2f} "
                         f"{p['host_waits_per_token']:6.2f}")
        row = hf.get("shapes", {}).get(s["shape"])
        if row is not None:
            what = _speed(row["us_per_token"], s["floor_us"]) if "us_per_token" in row else f"FAILED: {row.get('error')}"
            lines.append(f"{s['shape']:12s} {'hf generate':12s} {GREEDY:>8s} {'':5s} {what}")
    if hf:
        lines.append(_hf_note(hf))
    for s in report["shapes"]:
        notes = _shape_notes(s) + kernel_bench.format_kernels(s, bw) + deltanet_bench.format_deltanet(s, bw)
        lines += [""] + notes if notes else []
    return "\n".join(lines)


def _speed(us: float, floor_us: float) -> str:
    """us/token, tok/s, floor us and the share of the floor reached (blank without a floor)."""
    if not floor_us:
        return f"{us:9.2f} {1e6 / us:8.0f} {'':9s} {'':8s}"
    return f"{us:9.2f} {1e6 / us:8.0f} {floor_us:9.2f} {floor_us / us:8.1%}"


def _hf_note(hf: dict) -> str:
    if not hf.get("available"):
        return f"hf generate: not run ({hf.get('versions')})"
    note = (f"hf generate: {hf['versions']}; LlamaForCausalLM of the same shape, random bf16 weights, greedy, "
            f"static cache, torch.compile {'ON' if hf.get('compile') else 'off'}")
    done = [r for r in hf.get("shapes", {}).values() if "us_per_token" in r]
    if done:
        r = done[0]
        note += (f", attention {r['attn_implementation']}; us/token = (t(generate {r['tokens']} new) - "
                 f"t(generate 1 new)) / {r['tokens'] - 1}, median of {r['runs']} pairs after a warm-up")
        note += "; warm-up s: " + ", ".join(f"{k} {v['warmup_s']}" for k, v in hf["shapes"].items() if "warmup_s" in v)
    return note


def _shape_notes(s: dict) -> list[str]:
    lines = []
    counts = s.get("formats") or {}
    if set(counts) - {"bf16"}:
        lines.append(f"{s['shape']}: matrix tensors " + ", ".join(f"{n} {f}" for f, n in counts.items())
                     + f"; {s['weight_bytes'] / 1e9:.3f} GB of weights read per token")
    moe = s.get("experts")
    if moe:
        lines.append(f"{s['shape']}: a mixture of experts, {moe['used']} of {moe['n_experts']} experts a token in "
                     f"{moe['moe_layers']} layers: {s['weight_bytes'] / 1e9:.3f} GB read a token of "
                     f"{moe['all_weight_bytes'] / 1e9:.3f} GB (a token reads exactly its {moe['used']}: the average "
                     f"and the worst case are one)")
    mem = s.get("memory_from_config")
    if mem:
        lines.append(f"{s['shape']}: device memory computed from the config, max_seq {mem['max_seq']}: weights "
                     f"{mem['weights'] / 1e9:.3f} GB + KV cache {mem['kv_cache'] / 1e9:.3f} GB + activations "
                     f"{mem['activations'] / 1e6:.2f} MB = {mem['total'] / 1e9:.3f} GB")
    if s.get("step_graph_nodes") is not None:
        lines.append(f"{s['shape']}: the device loop's step graph has {s['step_graph_nodes']} nodes")
    for t in s.get("ttft", []):
        how = f"one prefill (chunks of {PREFILL_CHUNK})" if t["prefill"] else "token by token"
        lines.append(f"{s['shape']}: time to first token, {t['prompt_tokens']}-token prompt, {how}: {t['ms']:.2f} ms")
    gemms = s.get("prefill_gemms")
    if isinstance(gemms, dict):
        lines.append(f"{s['shape']}: prefill GEMMs: FAILED: {gemms.get('error')}")
    elif gemms:
        lines.append(f"{s['shape']}: prefill GEMMs (bf16 tensor cores, float32 sums), m = {gemms[0]['m']} tokens: "
                     + "; ".join(f"{g['name']} {g['n']}x{g['k']} {g['us']:.1f} us {g['tflops']:.0f} TFLOP/s"
                                 for g in gemms))
    return lines
