"""The decode at a long context: the step's KV reads beside its weights, and what a sliding window
saves.

At position p a layer's attention reads the keys and values of the positions it attends, in the
cache's form (bf16, or q8_0: 34 bytes per 32 values): all p + 1 of them, or a windowed layer's last
`window` (ModelConfig.window). Each form of the KV cache asked for runs on a device of its own. A
context row prefills a prompt of `context` tokens (one token for a context of 0), then times the
greedy device loop (burst 16, plain steps) over the tokens after it, and the prompt's time to first
token (one prefill, cold); its floor counts the weights and those KV bytes, averaged over the
generation's positions. Every context of a shape runs on one device opened for
the longest of them. A model with windowed layers is timed a second time on the same weights with
its window off: the difference between the two rows is what reading only the window saves.

With the kernel table on, each context also times one layer's decode attention alone at that
position (arc_op_attention, the forward's kernel), as replays of a graph of n_layers launches: the
rate at which it reads the layer's keys and values, against the copy bandwidth.
"""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np

from arcpy.bench import kernels as kernel_bench
from arcpy.bench.loop import generation_positions, time_generation, time_to_first_token
from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.kv_formats import LIBARC_FORMS, kv_position_bytes
from arcpy.errors import ArcError, InvalidArgumentError
from arcpy.loop.engine import Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.model import Model, ModelConfig
from arcpy.model.gemma4 import layer_dims
from arcpy.model.hybrid import state_bytes_per_token

BURST = 16


def kv_read_bytes(cfg: ModelConfig, position: int, kv_cache: str = "bf16") -> int:
    """Bytes of the KV cache one step at `position` reads: each attention layer's keys and values
    (in form `kv_cache`, its own heads: Gemma 4's global layers') of the positions its attention
    reads, the window's on a windowed layer (a DeltaNet layer reads its state instead:
    arcpy.model.hybrid.state_bytes_per_token)."""
    seen = position + 1
    return sum(kv_position_bytes(kv_cache, 1, kv, hd) * min(seen, cfg.window(layer) or seen)
               for layer in range(cfg.n_layers) if not cfg.is_linear_layer(layer)
               for hd, kv in [layer_dims(cfg, layer)])


def parse_contexts(text: str) -> list[int]:
    """`--context`'s comma-separated list of prompt lengths (0: a one-token prompt), or one clear
    error."""
    try:
        contexts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        contexts = []
    if not contexts or any(c < 0 for c in contexts):
        raise InvalidArgumentError(f"--context {text!r}: expected prompt lengths like 0,4096,8192,32768")
    return contexts


def parse_kv_caches(text: str) -> tuple[str, ...]:
    """`--kv-cache`'s comma-separated forms, each one libarc holds (bf16, q8_0), or one clear error."""
    forms = tuple(part.strip() for part in text.split(",") if part.strip())
    bad = [f for f in forms if f not in LIBARC_FORMS]
    if not forms or bad:
        raise InvalidArgumentError(f"--kv-cache {text!r}: expected forms among {', '.join(LIBARC_FORMS)}")
    return forms


def context_max_seq(contexts: list[int], tokens: int) -> int:
    """The KV cache positions the rows of `contexts` need: the longest prompt and the tokens after it."""
    return max(max(contexts), 1) + tokens


def check_context(cfg: ModelConfig, max_seq: int, context: int, tokens: int) -> None:
    """The context and the tokens after it fit the benchmark's KV cache, or one clear error."""
    if context < 0 or max(context, 1) + tokens > max_seq:
        raise InvalidArgumentError(f"a context of {context} tokens and {tokens} more do not fit the "
                                   f"benchmark's {max_seq} positions of {cfg.n_layers}-layer model")


def context_row(device, cfg: ModelConfig, weight_bytes: int, bandwidth: float, context: int, tokens: int,
                runs: int, max_seq: int, kv_cache: str = "bf16") -> dict:
    """The greedy device loop after a `context`-token prompt on an open device of a model of cfg,
    its KV cache in form `kv_cache`."""
    check_context(cfg, max_seq, context, tokens)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab, size=max(context, 1)).tolist()
    engine = Engine(device, "cuda", EngineSettings(device_loop=True, burst=BURST, speculate=False), environ={},
                    latch=FallbackLatch())
    us, stats = time_generation(engine, prompt, tokens, runs)
    if stats.path != "device-loop":
        raise ArcError(f"asked for the device loop at a {context}-token context, the engine took {stats.path}")
    first, last = generation_positions(len(prompt), tokens, max_seq)
    kv = statistics.fmean(kv_read_bytes(cfg, p, kv_cache) for p in range(first, last + 1))
    ttft = time_to_first_token(device, runs, [len(prompt)], token_by_token=False) if context > 1 else []
    return {"context": context, "kv_cache": kv_cache, "ttft_ms": ttft[0]["ms"] if ttft else None,
            "window": cfg.sliding_window,
            "window_pattern": cfg.window_pattern,
            "burst": BURST, "us_per_token": statistics.median(us), "runs_us": [round(u, 2) for u in us],
            "kv_bytes_per_token": kv, "floor_us": (weight_bytes + kv) / bandwidth * 1e6,
            "host_waits_per_token": stats.per_token(stats.host_waits)}


def attention_rows(cfg: ModelConfig, max_seq: int, contexts: list[int], runs: int, bandwidth: float) -> list[dict]:
    """One layer's decode attention alone, over a bf16 cache (arc_op_attention's), at each context's
    position (the first token decoded after it): µs per launch, the K and V bytes it reads and
    their rate."""
    positions = sorted({min(max(c, 1), max_seq - 1) for c in contexts})
    rows = []
    for t in kernel_bench.bench_kernels(cfg, max_seq, positions, replays=runs, kinds=("attention",)):
        rate = t["read_bytes"] / (t["us"] * 1e-6)
        rows.append({"position": t["position"], "us": t["us"], "runs_us": t["runs_us"],
                     "kv_bytes": t["read_bytes"], "GBps": rate / 1e9, "of_copy": rate / bandwidth})
    return rows


def format_attention(shape: str, rows: list[dict]) -> list[str]:
    """The attention rows as text, one per position."""
    return [f"{shape}: one layer's attention, bf16 cache, @{r['position']} "
            f"({r['kv_bytes'] / 1e6:.1f} MB of K and V): {r['us']:.2f} us "
            f"({r['GBps']:,.0f} GB/s, {r['of_copy']:.0%} of copy)"
            for r in sorted(rows, key=lambda r: r["position"])]


def without_window(model: Model) -> Model:
    """The same weights with every layer global: the window's saving is measured against it."""
    cfg = dataclasses.replace(model.config, sliding_window=0, window_pattern=0)
    return Model(cfg, model.tensors, name=f"{model.name} (no window)", source=model.source)


def context_rows(model: Model, bandwidth: float, contexts: list[int], tokens: int, runs: int,
                 max_seq: int, kv_caches: tuple[str, ...] = ("bf16",)) -> list[dict]:
    """The context rows of `model` at each of `contexts` with each form of `kv_caches`, and for a
    windowed model the same weights' rows without it; each (variant, form)'s device is opened
    once, with `max_seq` positions."""
    rows = []
    variants = [model] + ([without_window(model)] if model.config.sliding_window else [])
    for m in variants:
        for form in kv_caches:
            with open_cuda_device(m, max_seq=max_seq, kv_cache=form) as device:
                for context in contexts:
                    rows.append(context_row(device, m.config, m.weight_bytes + state_bytes_per_token(m.config),
                                            bandwidth, context, tokens, runs, max_seq, form))
    return rows


def format_rows(shape: str, rows: list[dict]) -> list[str]:
    """The context rows as text, with the window's saving where both rows are there."""
    lines = []
    for r in rows:
        what = f"window {r['window']} (every {r['window_pattern']}th layer global)" if r["window"] else "no window"
        lines.append(f"{shape}: {r['context']}-token context, {r.get('kv_cache', 'bf16')} KV, {what}: "
                     f"{r['us_per_token']:.2f} us/token "
                     f"({1e6 / r['us_per_token']:.1f} tok/s), KV read {r['kv_bytes_per_token'] / 1e6:.1f} MB/token, "
                     f"floor {r['floor_us']:.2f} us ({r['floor_us'] / r['us_per_token']:.1%}), "
                     f"host waits/token {r['host_waits_per_token']:.2f}"
                     + (f", time to first token {r['ttft_ms']:.1f} ms" if r.get("ttft_ms") is not None else ""))
    flat = {(r["context"], r.get("kv_cache")): r for r in rows if not r["window"]}
    for r in rows:
        if r["window"] and (r["context"], r.get("kv_cache")) in flat:
            other = flat[r["context"], r.get("kv_cache")]
            saved = other["us_per_token"] - r["us_per_token"]
            bytes_saved = other["kv_bytes_per_token"] - r["kv_bytes_per_token"]
            lines.append(f"{shape}: the window saves {saved:.2f} us/token and {bytes_saved / 1e6:.1f} MB of KV reads "
                         f"a token at a {r['context']}-token context")
    return lines
