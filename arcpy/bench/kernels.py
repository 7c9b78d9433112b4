"""Each kernel of the decode step timed alone, launched as arc_model_forward launches it.

A per-layer kernel is captured into a graph of n_layers launches, each over its own layer's
weights and KV cache, in the forward's order; a global kernel (embedding, the lm_head with the
greedy step's argmax, and two not counted in the greedy step's sum: the argmax alone, as it runs
after a prefill, and the draw of a sampled step) into a graph of n_layers launches of itself over
the same buffers. The launchers are the forward's
(programmatic dependent launch included), so consecutive launches overlap as they do there. A
timed replay launches the graph many times back to back, then polls the stream idle; µs per
launch is its wall time over its launches, and each figure is the median of several timed
replays after a warm-up.

Weights are random bf16 words (std 0.02, norms near 1) copied on the device from one random pool;
activations are random float32. When the bytes one replay reads fit in L2 (50 MB on an H200),
the replays read from L2: the forward, which streams the whole model per step, does so only in
part. The "MB/replay" column says when that applies.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from arcpy import _lib
from arcpy.devices.context import Context, sampling_struct
from arcpy.model import ModelConfig, f32_to_bf16, rope_inv_freq
from arcpy.sampling import Sampling

WEIGHT_STD = 0.02
POOL_WORDS = 1 << 24           # 32 MiB of random bf16 words, copied over every weight buffer
REPLAY_TARGET_S = 0.02         # wall time of one timed replay: launches >> the host's share
MAX_GRAPH_LAUNCHES = 4000      # graph launches in one timed replay, at most
FIXED_POSITION = 512           # attention is also timed here, whatever the generation's length
SAMPLED = Sampling(temperature=0.8, top_p=0.95, seed=0)  # the sampled request the benchmark times
SAMPLED_NAME = "t0.8p.95"


@dataclass
class KernelSpec:
    """One row of the table: a kernel, how often the step runs it, what one launch reads."""

    kind: str                  # which launcher: embedding, qkv, attention, o, gate_up, down, lm_head, argmax, draw
    name: str
    per_step: int              # launches in one decode step
    read_bytes: int = 0        # weights (GEMVs) or KV cache (attention) one launch reads; 0: not a bandwidth figure
    replay_bytes: int = 0      # distinct bytes of weights/KV one replay of its graph reads
    in_step_sum: bool = True   # counted in the sum compared with the step's time
    position: int | None = None


def attention_positions(mean: int, last: int, max_seq: int) -> list[int]:
    """Positions attention is timed at: the generation's mean (counted in the step's sum), its
    last, and FIXED_POSITION; those outside the cache dropped, repeats once."""
    return list(dict.fromkeys(p for p in (mean, last, FIXED_POSITION) if 0 <= p < max_seq))


def kernel_specs(cfg: ModelConfig, positions: list[int]) -> list[KernelSpec]:
    """The step's kernels in the forward's order, as arc_model_forward launches them.
    positions[0] is the attention position counted in the step's sum."""
    L, d, f, v = cfg.n_layers, cfg.dim, cfg.ffn_dim, cfg.vocab
    qkv_rows = cfg.q_dim + 2 * cfg.kv_dim
    qkv = qkv_rows * d * 2 + d * 2 + (qkv_rows * 2 if cfg.qkv_bias else 0)
    o, gate_up, down, head = d * cfg.q_dim * 2, 2 * f * d * 2 + d * 2, d * f * 2, v * d * 2 + d * 2
    specs = [KernelSpec("embedding", "embedding", 1),
             KernelSpec("qkv", "qkv gemv (norm" + (", bias)" if cfg.qkv_bias else ")"), L, qkv, L * qkv)]
    for i, pos in enumerate(positions):
        kv = 2 * cfg.n_kv_heads * (pos + 1) * cfg.head_dim * 2
        specs.append(KernelSpec("attention", f"attention @{pos}", L, kv, L * kv, in_step_sum=i == 0, position=pos))
    specs += [KernelSpec("o", "o gemv (accumulate)", L, o, L * o),
              KernelSpec("gate_up", "gate/up swiglu (norm)", L, gate_up, L * gate_up),
              KernelSpec("down", "down gemv (accumulate)", L, down, L * down),
              KernelSpec("lm_head", "lm_head gemv + argmax (norm)", 1, head, head),
              KernelSpec("argmax", "argmax (after a prefill)", 1, in_step_sum=False),
              KernelSpec("draw", f"draw ({SAMPLED_NAME})", 1, in_step_sum=False)]
    return specs


def step_sum_us(timings: list) -> float:
    """µs of one step as the sum of its kernels: each counted row's µs times its launches per step."""
    return sum(t["per_step"] * t["us"] for t in timings if t["in_step_sum"])


def launches_per_replay(target_s: float, one_launch_s: float, cap: int = MAX_GRAPH_LAUNCHES) -> int:
    """Graph launches that make a timed replay last about target_s, given one launch's wall time."""
    if one_launch_s <= 0:
        return cap
    return max(1, min(cap, round(target_s / one_launch_s)))


class _Buffers:
    """The device buffers of one shape's kernels, freed together."""

    def __init__(self, ctx: Context, seed: int = 0):
        self.ctx, self.ffi, self.lib = ctx, ctx.ffi, ctx.lib
        self.rng = np.random.default_rng(seed)
        self.ptrs = []
        self.keep = []  # uploaded host arrays live until the buffers are freed
        pool = f32_to_bf16(self.rng.standard_normal(POOL_WORDS, dtype=np.float32) * np.float32(WEIGHT_STD))
        self.pool, self.pool_bytes = self.upload(pool), pool.nbytes

    def alloc(self, nbytes: int):
        p = self.ctx.device_alloc(max(int(nbytes), 16))
        self.ptrs.append(p)
        return p

    def upload(self, array: np.ndarray):
        p = self.alloc(array.nbytes)
        self.keep.append(array)
        self.ctx.upload_async(p, array)
        return p

    def random_bf16(self, nbytes: int):
        """nbytes of random bf16 words: the pool, copied on the device as often as it takes."""
        p = self.alloc(nbytes)
        for off in range(0, nbytes, self.pool_bytes):
            _lib.check(self.lib.arc_enqueue_copy_on_device(
                self.ctx.ptr, self.ffi.cast("char *", p) + off, self.pool, min(self.pool_bytes, nbytes - off)))
        return p

    def norms(self, count: int, dim: int):
        w = np.float32(1.0) + np.float32(0.05) * self.rng.standard_normal((count, dim), dtype=np.float32)
        return self.upload(f32_to_bf16(w))

    def floats(self, n: int):
        return self.upload(self.rng.standard_normal(n, dtype=np.float32))

    def scalar(self, value: int, dtype):
        return self.upload(np.array([value], dtype=dtype))

    def free(self) -> None:
        self.ctx.wait_idle()  # the replays may still read them
        for p in reversed(self.ptrs):
            self.ctx.device_free(p)
        self.ptrs, self.keep = [], []


class _Shape:
    """Weights for every layer, KV cache, activations: what the step's kernels read and write."""

    def __init__(self, buf: _Buffers, cfg: ModelConfig, max_seq: int, positions: list[int]):
        ffi, lib, f32 = buf.ffi, buf.lib, self.f32
        self.cfg, self.max_seq, self.buf, self.ffi = cfg, max_seq, buf, ffi
        L, d, f, v, hd = cfg.n_layers, cfg.dim, cfg.ffn_dim, cfg.vocab, cfg.head_dim
        self.qkv_rows = cfg.q_dim + 2 * cfg.kv_dim
        # Per-layer tensors, one buffer per kind: layer l's slice at l * (its bytes).
        self.wqkv, self.wo = buf.random_bf16(L * self.qkv_rows * d * 2), buf.random_bf16(L * d * cfg.q_dim * 2)
        self.wgu, self.wdown = buf.random_bf16(L * 2 * f * d * 2), buf.random_bf16(L * d * f * 2)
        self.attn_norm, self.mlp_norm = buf.norms(L, d), buf.norms(L, d)
        self.bqkv = buf.upload(f32_to_bf16(buf.rng.standard_normal(L * self.qkv_rows, dtype=np.float32)
                                           * np.float32(0.1))) if cfg.qkv_bias else None
        self.kv_layer_bytes = cfg.n_kv_heads * max_seq * hd * 2
        self.k, self.v = buf.random_bf16(L * self.kv_layer_bytes), buf.random_bf16(L * self.kv_layer_bytes)
        # Global tensors: a tied head is the embedding table, as in the forward.
        self.embed = buf.random_bf16(v * d * 2)
        self.head = self.embed if cfg.tied_embeddings else buf.random_bf16(v * d * 2)
        self.final_norm = buf.norms(1, d)
        self.inv_freq = f32(buf.upload(rope_inv_freq(cfg)))
        # Activations and the step's device inputs.
        self.x, self.qkv, self.att = f32(buf.floats(d)), f32(buf.floats(self.qkv_rows)), f32(buf.floats(cfg.q_dim))
        self.h, self.logits = f32(buf.floats(f)), f32(buf.floats(v))
        # The lm_head's input, which no other kernel writes: in the forward it is x, but the o and
        # down GEMVs' replays add into x thousands of times, a number that depends on their speed,
        # and the logits the argmax and the draw are timed on would follow it.
        self.head_in = f32(buf.floats(d))
        sb = ffi.new("uint64_t *")
        _lib.check(lib.arc_op_attention_scratch_bytes(cfg.n_heads, hd, max_seq, sb))
        self.scratch = f32(buf.alloc(int(sb[0])))
        self.token = ffi.cast("uint32_t *", buf.scalar(int(buf.rng.integers(v)), np.uint32))
        self.pos = {p: ffi.cast("int32_t *", buf.scalar(p, np.int32)) for p in positions}
        self.out, self.out_value = ffi.cast("int32_t *", buf.alloc(4)), f32(buf.alloc(4))
        self.sampling = sampling_struct(ffi, SAMPLED)

    def u16(self, p):
        return self.ffi.cast("uint16_t *", p)

    def f32(self, p):
        return self.ffi.cast("float *", p)

    def layer(self, base, l: int, nbytes: int):
        """Layer l's slice of a per-layer buffer whose slices are nbytes each, as bf16 words."""
        return self.u16(self.ffi.cast("char *", base) + l * nbytes)

    def launches(self, spec: KernelSpec) -> list:
        """The graph's launches for `spec`: one per layer, or n_layers of a global kernel."""
        c, lib, ctx, NULL = self.cfg, self.buf.lib, self.buf.ctx.ptr, self.ffi.NULL
        L, d, f, v, eps, ms = c.n_layers, c.dim, c.ffn_dim, c.vocab, c.rms_eps, self.max_seq
        r = self.qkv_rows
        kind = spec.kind
        if kind == "embedding":
            op = lambda l: lib.arc_op_embedding(ctx, self.u16(self.embed), v, d, self.token, self.x)
        elif kind == "qkv":
            op = lambda l: lib.arc_op_gemv(
                ctx, self.layer(self.wqkv, l, r * d * 2), self.x, r, d,
                self.layer(self.bqkv, l, r * 2) if self.bqkv is not None else NULL,
                self.layer(self.attn_norm, l, d * 2), eps, 0, self.qkv)
        elif kind == "attention":
            pos = self.pos[spec.position]
            op = lambda l: lib.arc_op_attention(ctx, self.qkv, self.inv_freq, self.layer(self.k, l, self.kv_layer_bytes),
                                                self.layer(self.v, l, self.kv_layer_bytes), c.n_heads,
                                                c.n_kv_heads, c.head_dim, ms, pos, self.scratch, self.att)
        elif kind == "o":
            op = lambda l: lib.arc_op_gemv(ctx, self.layer(self.wo, l, d * c.q_dim * 2), self.att, d, c.q_dim,
                                           NULL, NULL, 0.0, 1, self.x)
        elif kind == "gate_up":
            op = lambda l: lib.arc_op_gemv_swiglu(ctx, self.layer(self.wgu, l, 2 * f * d * 2), self.x, f, d,
                                                  self.layer(self.mlp_norm, l, d * 2), eps, self.h)
        elif kind == "down":
            op = lambda l: lib.arc_op_gemv(ctx, self.layer(self.wdown, l, d * f * 2), self.h, d, f,
                                           NULL, NULL, 0.0, 1, self.x)
        elif kind == "lm_head":
            op = lambda l: lib.arc_op_gemv_argmax(ctx, self.u16(self.head), self.head_in, v, d,
                                                  self.u16(self.final_norm), eps, self.logits, self.out, self.out_value)
        elif kind == "argmax":
            op = lambda l: lib.arc_argmax(ctx, self.logits, v, self.out, self.out_value)
        elif kind == "draw":
            op = lambda l: lib.arc_sample(ctx, self.logits, v, self.sampling, 1 + l, self.out)
        else:
            raise AssertionError(f"no launch for kernel {spec.name!r}")
        return [lambda l=l: _lib.check(op(l)) for l in range(L)]


def _capture(ctx: Context, launches: list):
    """A graph of `launches` in order; capture is ended (and a partial graph freed) on failure."""
    ffi, lib = ctx.ffi, ctx.lib
    gp = ffi.new("arc_graph **")
    _lib.check(lib.arc_graph_capture_begin(ctx.ptr))
    try:
        for launch in launches:
            launch()
    except BaseException:
        if lib.arc_graph_capture_end(ctx.ptr, gp) == 0 and gp[0] != ffi.NULL:
            lib.arc_graph_destroy(gp[0])
        raise
    _lib.check(lib.arc_graph_capture_end(ctx.ptr, gp))
    return gp[0]


def time_graph(ctx: Context, graph, launches: int, replays: int) -> list[float]:
    """µs per kernel launch of each timed replay (graph launches back to back, then a poll)."""
    def replay(k: int) -> float:
        t0 = time.perf_counter()
        for _ in range(k):
            _lib.check(ctx.lib.arc_graph_launch(graph))
        ctx.wait_idle()
        return time.perf_counter() - t0

    replay(1)  # the first launch pays for first touches
    k = launches_per_replay(REPLAY_TARGET_S, replay(1))
    replay(k)  # warm-up at the timed length
    return [replay(k) / (k * launches) * 1e6 for _ in range(replays)]


def bench_kernels(cfg: ModelConfig, max_seq: int, positions: list[int], replays: int = 5) -> list[dict]:
    """Time every kernel of the step for `cfg` on a context of its own (see the module's
    docstring): each row is its KernelSpec with `us` (median µs per launch) and `runs_us`."""
    with Context(0) as ctx:
        buf = _Buffers(ctx)
        try:
            shape = _Shape(buf, cfg, max_seq, positions)
            ctx.wait_idle()
            rows = []
            for spec in kernel_specs(cfg, positions):
                graph = _capture(ctx, shape.launches(spec))
                try:
                    us = time_graph(ctx, graph, cfg.n_layers, replays)
                finally:
                    ctx.wait_idle()
                    _lib.check(ctx.lib.arc_graph_destroy(graph))
                rows.append({**asdict(spec), "us": statistics.median(us), "runs_us": [round(u, 3) for u in us]})
            return rows
        finally:
            buf.free()


def format_kernels(shape: dict, bandwidth_gbps: float) -> list[str]:
    """The per-kernel table of one shape of a report (lines)."""
    k = shape.get("kernels")
    if not k:
        return []
    if "error" in k:
        return [f"per-kernel, {shape['shape']}: FAILED: {k['error']}"]
    rows = k["timings"]
    lines = [f"per-kernel, {shape['shape']}: graphs of {k['graph_launches']} launches, median of {k['replays']} "
             f"timed replays; GB/s = bytes of weights (GEMVs) or KV cache (attention) one launch reads",
             f"  {'kernel':26s} {'x/step':>6s} {'us/launch':>9s} {'us/step':>8s} {'MB/launch':>9s} {'GB/s':>7s} "
             f"{'of copy':>7s} {'MB/replay':>9s}"]
    for t in rows:
        mark = "" if t["in_step_sum"] else " *"
        line = f"  {t['name'] + mark:26s} {t['per_step']:6d} {t['us']:9.2f} {t['per_step'] * t['us']:8.1f}"
        if t["read_bytes"]:
            gbps = t["read_bytes"] / t["us"] / 1e3
            line += (f" {t['read_bytes'] / 1e6:9.2f} {gbps:7.0f} {gbps / bandwidth_gbps:7.1%}"
                     f" {t['replay_bytes'] / 1e6:9.1f}")
        lines.append(line)
    total = k.get("step_us")
    lines.append(f"  sum of kernels per step: {k['sum_us']:.1f} us (* rows not counted)"
                 + (f"; the step (device loop, burst 16): {total:.1f} us, kernels alone = {k['sum_us'] / total:.0%} "
                    "of it" if total else ""))
    return lines


# --- the prefill's matrix products ------------------------------------------------------------

def gemm_shapes(cfg: ModelConfig) -> list[tuple[str, int, int, bool]]:
    """(name, n, k, swiglu) of the prefill's products per layer, as its forward launches them."""
    qkv_rows = cfg.q_dim + 2 * cfg.kv_dim
    return [("qkv", qkv_rows, cfg.dim, False), ("o", cfg.dim, cfg.q_dim, False),
            ("gate/up swiglu", cfg.ffn_dim, cfg.dim, True), ("down", cfg.dim, cfg.ffn_dim, False)]


def bench_gemms(cfg: ModelConfig, m: int, replays: int = 5) -> list[dict]:
    """Each product of a prefill chunk of m tokens timed alone (graphs of n_layers launches over
    one layer's weights, back to back): µs per launch and TFLOP/s (2 m n k over the time; the
    gate/up product counts both halves)."""
    rows = []
    with Context(0) as ctx:
        buf = _Buffers(ctx)
        try:
            lib, ffi, NULL = ctx.lib, ctx.ffi, ctx.ffi.NULL
            for name, n, k, swiglu in gemm_shapes(cfg):
                w_rows = 2 * n if swiglu else n
                a = ffi.cast("uint16_t *", buf.random_bf16(m * k * 2))
                w = ffi.cast("uint16_t *", buf.random_bf16(w_rows * k * 2))
                if swiglu:
                    out = ffi.cast("uint16_t *", buf.alloc(m * n * 2))
                    op = lambda: lib.arc_op_gemm_swiglu_bf16(ctx.ptr, a, w, m, n, k, out)
                else:
                    out = ffi.cast("float *", buf.alloc(m * n * 4))
                    op = lambda: lib.arc_op_gemm_bf16(ctx.ptr, a, w, m, n, k, NULL, 0, out)
                ctx.wait_idle()
                graph = _capture(ctx, [lambda op=op: _lib.check(op())] * cfg.n_layers)
                try:
                    us = time_graph(ctx, graph, cfg.n_layers, replays)
                finally:
                    ctx.wait_idle()
                    _lib.check(lib.arc_graph_destroy(graph))
                flops = 2.0 * m * w_rows * k
                rows.append({"name": name, "m": m, "n": w_rows, "k": k, "us": statistics.median(us),
                             "tflops": flops / statistics.median(us) / 1e6, "runs_us": [round(u, 2) for u in us]})
        finally:
            buf.free()
    return rows
