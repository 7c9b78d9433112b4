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
a quantized preset's matrices are random rows of their formats (model.quant_pack.random_quant, std
0.02), copied likewise from a pool per format and width, and timed through the quantized GEMVs
(a layer whose q, k and v differ in format launches one GEMV per run of equal formats, as one row
of the table); activations are random float32. When the bytes one replay reads fit in L2 (50 MB on an H200),
the replays read from L2: the forward, which streams the whole model per step, does so only in
part. The "MB/replay" column says when that applies.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from arcpy import _lib
from arcpy.codes import FORMAT_BF16, FORMAT_NAMES
from arcpy.devices.context import Context, sampling_struct
from arcpy.errors import ArcError
from arcpy.model import LM_HEAD, ModelConfig, f32_to_bf16, layer_prefix, random_quant, rope_inv_freq, row_bytes
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


# The matrices each GEMV of a layer reads, by the Hugging Face name's suffix, and (rows, cols).
_PROJ = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
         "down": ("down_proj",)}


def layer_formats(cfg: ModelConfig, formats: dict[str, int] | None, kind: str) -> list[tuple[int, ...]]:
    """Per layer, the arc_format of each matrix a GEMV kind reads (bf16 where `formats` is silent)."""
    prefix = "self_attn." if kind in ("qkv", "o") else "mlp."
    return [tuple((formats or {}).get(f"{layer_prefix(l)}{prefix}{p}.weight", FORMAT_BF16) for p in _PROJ[kind])
            for l in range(cfg.n_layers)]


def _matrix_shapes(cfg: ModelConfig, kind: str) -> list[tuple[int, int]]:
    d, f, q, kv = cfg.dim, cfg.ffn_dim, cfg.q_dim, cfg.kv_dim
    return {"qkv": [(q, d), (kv, d), (kv, d)], "o": [(d, q)], "gate_up": [(f, d), (f, d)], "down": [(d, f)]}[kind]


def _label(name: str, fmts) -> str:
    """A kernel's name with the quantized formats it reads, if any."""
    used = sorted({FORMAT_NAMES[x] for x in fmts if x != FORMAT_BF16})
    return f"{name} [{'/'.join(used)}]" if used else name


def kernel_specs(cfg: ModelConfig, positions: list[int], formats: dict[str, int] | None = None) -> list[KernelSpec]:
    """The step's kernels in the forward's order, as arc_model_forward launches them.
    positions[0] is the attention position counted in the step's sum. `formats` (tensor name ->
    arc_format, model.preset_formats) sizes quantized matrices by their rows' bytes; where layers
    differ, read_bytes is the mean over layers and replay_bytes their sum."""
    L, d, v = cfg.n_layers, cfg.dim, cfg.vocab
    qkv_rows = cfg.q_dim + 2 * cfg.kv_dim
    extra = {"qkv": d * 2 + (qkv_rows * 2 if cfg.qkv_bias else 0), "o": 0, "gate_up": d * 2, "down": 0}
    names = {"qkv": "qkv gemv (norm" + (", bias)" if cfg.qkv_bias else ")"), "o": "o gemv (accumulate)",
             "gate_up": "gate/up swiglu (norm)", "down": "down gemv (accumulate)"}

    def gemv(kind: str) -> KernelSpec:
        per_layer = layer_formats(cfg, formats, kind)
        total = L * extra[kind] + sum(rows * row_bytes(fmt, cols) for fmts in per_layer
                                      for fmt, (rows, cols) in zip(fmts, _matrix_shapes(cfg, kind)))
        return KernelSpec(kind, _label(names[kind], [x for fmts in per_layer for x in fmts]), L, round(total / L), total)

    head_fmt = FORMAT_BF16 if cfg.tied_embeddings else (formats or {}).get(LM_HEAD, FORMAT_BF16)
    head = v * row_bytes(head_fmt, d) + d * 2
    specs = [KernelSpec("embedding", "embedding", 1), gemv("qkv")]
    for i, pos in enumerate(positions):
        kv = 2 * cfg.n_kv_heads * (pos + 1) * cfg.head_dim * 2
        specs.append(KernelSpec("attention", f"attention @{pos}", L, kv, L * kv, in_step_sum=i == 0, position=pos))
    specs += [gemv("o"), gemv("gate_up"), gemv("down"),
              KernelSpec("lm_head", _label("lm_head gemv + argmax (norm)", [head_fmt]), 1, head, head),
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


class Buffers:
    """The device buffers of one shape's kernels, freed together."""

    def __init__(self, ctx: Context, seed: int = 0):
        self.ctx, self.ffi, self.lib = ctx, ctx.ffi, ctx.lib
        self.rng = np.random.default_rng(seed)
        self.ptrs = []
        self.keep = []  # uploaded host arrays live until the buffers are freed
        pool = f32_to_bf16(self.rng.standard_normal(POOL_WORDS, dtype=np.float32) * np.float32(WEIGHT_STD))
        self.pool, self.pool_bytes = self.upload(pool), pool.nbytes
        self.quant_pools = {}  # (format, cols) -> (device pointer, bytes): whole random rows

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

    def matrix(self, fmt: int, rows: int, cols: int):
        """A (rows, cols) matrix in `fmt`: random bf16 words, or random rows of a quantized format
        copied on the device from a pool of whole rows (so every row keeps its layout)."""
        if fmt == FORMAT_BF16:
            return self.random_bf16(rows * cols * 2)
        rb = row_bytes(fmt, cols)
        if (fmt, cols) not in self.quant_pools:
            pool = random_quant(fmt, (max(1, POOL_WORDS * 2 // rb), cols), self.rng, std=WEIGHT_STD)
            self.quant_pools[fmt, cols] = (self.upload(pool.data), pool.nbytes)
        src, pool_bytes = self.quant_pools[fmt, cols]
        p = self.alloc(rows * rb)
        for off in range(0, rows * rb, pool_bytes):
            _lib.check(self.lib.arc_enqueue_copy_on_device(
                self.ctx.ptr, self.ffi.cast("char *", p) + off, src, min(pool_bytes, rows * rb - off)))
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


class StepTensors:
    """Weights for every layer, KV cache, activations: what the step's kernels read and write."""

    def __init__(self, buf: Buffers, cfg: ModelConfig, max_seq: int, positions: list[int],
                 formats: dict[str, int] | None = None):
        ffi, lib, f32 = buf.ffi, buf.lib, self.f32
        self.cfg, self.max_seq, self.buf, self.ffi = cfg, max_seq, buf, ffi
        L, d, f, v, hd = cfg.n_layers, cfg.dim, cfg.ffn_dim, cfg.vocab, cfg.head_dim
        self.qkv_rows = cfg.q_dim + 2 * cfg.kv_dim
        # Per-layer matrices, each layer's own: for q/k/v a (format, pointer, first row, rows) per
        # run of equal formats, for the others (format, pointer).
        self.wqkv = [self.qkv_groups(fmts) for fmts in layer_formats(cfg, formats, "qkv")]
        self.wo = [(x, buf.matrix(x, d, cfg.q_dim)) for (x,) in layer_formats(cfg, formats, "o")]
        gate_up = layer_formats(cfg, formats, "gate_up")
        if any(g != u for g, u in gate_up):
            raise ArcError("gate and up in different formats: the fused SwiGLU GEMV reads one")
        self.wgu = [(g, buf.matrix(g, 2 * f, d)) for g, _ in gate_up]
        self.wdown = [(x, buf.matrix(x, d, f)) for (x,) in layer_formats(cfg, formats, "down")]
        self.attn_norm, self.mlp_norm = buf.norms(L, d), buf.norms(L, d)
        self.bqkv = buf.upload(f32_to_bf16(buf.rng.standard_normal(L * self.qkv_rows, dtype=np.float32)
                                           * np.float32(0.1))) if cfg.qkv_bias else None
        self.kv_layer_bytes = cfg.n_kv_heads * max_seq * hd * 2
        self.k, self.v = buf.random_bf16(L * self.kv_layer_bytes), buf.random_bf16(L * self.kv_layer_bytes)
        # Global tensors: a tied head is the embedding table, as in the forward.
        self.embed = buf.random_bf16(v * d * 2)
        head_fmt = FORMAT_BF16 if cfg.tied_embeddings else (formats or {}).get(LM_HEAD, FORMAT_BF16)
        self.head = (head_fmt, self.embed if cfg.tied_embeddings else buf.matrix(head_fmt, v, d))
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

    def qkv_groups(self, fmts: tuple[int, int, int]) -> list[tuple[int, object, int, int]]:
        """q, k and v of one layer as runs of equal formats, each one matrix of its rows."""
        c, groups, row = self.cfg, [], 0
        for fmt, rows in zip(fmts, (c.q_dim, c.kv_dim, c.kv_dim)):
            if groups and groups[-1][0] == fmt:
                groups[-1][3] += rows
            else:
                groups.append([fmt, None, row, rows])
            row += rows
        return [(fmt, self.buf.matrix(fmt, rows, c.dim), row0, rows) for fmt, _, row0, rows in groups]

    def gemv(self, matrix, x, rows: int, cols: int, bias, norm, accumulate: int, y) -> int:
        """arc_op_gemv, or arc_op_qgemv for a quantized format; `matrix` is (its format, its weights)."""
        (fmt, w), lib, eps = matrix, self.buf.lib, self.cfg.rms_eps
        if fmt == FORMAT_BF16:
            return lib.arc_op_gemv(self.buf.ctx.ptr, self.u16(w), x, rows, cols, bias, norm, eps, accumulate, y)
        return lib.arc_op_qgemv(self.buf.ctx.ptr, fmt, w, x, rows, cols, bias, norm, eps, accumulate, y)

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
            def op(l):  # one GEMV per run of equal formats; the first failure is the status
                status = 0
                for fmt, w, row0, rows in self.wqkv[l]:
                    bias = self.layer(self.bqkv, l, r * 2) + row0 if self.bqkv is not None else NULL
                    status = status or self.gemv((fmt, w), self.x, rows, d, bias, self.layer(self.attn_norm, l, d * 2),
                                                 0, self.qkv + row0)
                return status
        elif kind == "attention":
            pos = self.pos[spec.position]
            op = lambda l: lib.arc_op_attention(ctx, self.qkv, self.inv_freq, self.layer(self.k, l, self.kv_layer_bytes),
                                                self.layer(self.v, l, self.kv_layer_bytes), c.n_heads, c.n_kv_heads,
                                                c.head_dim, ms, pos, self.scratch, self.att)
        elif kind == "o":
            op = lambda l: self.gemv(self.wo[l], self.att, d, c.q_dim, NULL, NULL, 1, self.x)
        elif kind == "gate_up":
            def op(l):
                fmt, w = self.wgu[l]
                norm = self.layer(self.mlp_norm, l, d * 2)
                if fmt == FORMAT_BF16:
                    return lib.arc_op_gemv_swiglu(ctx, self.u16(w), self.x, f, d, norm, eps, self.h)
                return lib.arc_op_qgemv_swiglu(ctx, fmt, w, self.x, f, d, norm, eps, self.h)
        elif kind == "down":
            op = lambda l: self.gemv(self.wdown[l], self.h, d, f, NULL, NULL, 1, self.x)
        elif kind == "lm_head":
            def op(l):
                fmt, w = self.head
                norm = self.u16(self.final_norm)
                if fmt == FORMAT_BF16:
                    return lib.arc_op_gemv_argmax(ctx, self.u16(w), self.head_in, v, d, norm, eps, self.logits,
                                                  self.out, self.out_value)
                return lib.arc_op_qgemv_argmax(ctx, fmt, w, self.head_in, v, d, norm, eps, self.logits, self.out,
                                               self.out_value)
        elif kind == "argmax":
            op = lambda l: lib.arc_argmax(ctx, self.logits, v, self.out, self.out_value, NULL)
        elif kind == "draw":
            op = lambda l: lib.arc_sample(ctx, self.logits, v, self.sampling, 1 + l, self.out)
        else:
            raise AssertionError(f"no launch for kernel {spec.name!r}")
        return [lambda l=l: _lib.check(op(l)) for l in range(L)]


def capture_graph(ctx: Context, launches: list):
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


def time_launches(ctx: Context, launches: list, replays: int) -> list[float]:
    """µs per launch of each timed replay of a graph of `launches` (captured, timed, destroyed)."""
    graph = capture_graph(ctx, launches)
    try:
        return time_graph(ctx, graph, len(launches), replays)
    finally:
        ctx.wait_idle()
        _lib.check(ctx.lib.arc_graph_destroy(graph))


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


def bench_kernels(cfg: ModelConfig, max_seq: int, positions: list[int], replays: int = 5,
                  formats: dict[str, int] | None = None, kinds: tuple[str, ...] | None = None) -> list[dict]:
    """Time every kernel of the step for `cfg` on a context of its own (see the module's
    docstring): each row is its KernelSpec with `us` (median µs per launch) and `runs_us`.
    `formats` (tensor name -> arc_format) holds a quantized preset's matrices in its formats;
    `kinds`, where given, keeps only the kernels of those KernelSpec kinds."""
    with Context(0) as ctx:
        buf = Buffers(ctx)
        try:
            shape = StepTensors(buf, cfg, max_seq, positions, formats)
            ctx.wait_idle()
            rows = []
            for spec in kernel_specs(cfg, positions, formats):
                if kinds is not None and spec.kind not in kinds:
                    continue
                us = time_launches(ctx, shape.launches(spec), replays)
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
    gate/up product counts both halves). Beside arc_op_gemm_swiglu_bf16, the gate/up product
    alone in float32: what the prefill runs before its SwiGLU where the product goes to the sm_90
    kernel (libarc/model/gemm/gemm.cu)."""
    rows = []
    shapes = gemm_shapes(cfg)
    shapes.insert(3, ("gate/up product", 2 * cfg.ffn_dim, cfg.dim, False))
    with Context(0) as ctx:
        buf = Buffers(ctx)
        try:
            lib, ffi, NULL = ctx.lib, ctx.ffi, ctx.ffi.NULL
            for name, n, k, swiglu in shapes:
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
                us = time_launches(ctx, [lambda op=op: _lib.check(op())] * cfg.n_layers, replays)
                flops = 2.0 * m * w_rows * k
                rows.append({"name": name, "m": m, "n": w_rows, "k": k, "us": statistics.median(us),
                             "tflops": flops / statistics.median(us) / 1e6, "runs_us": [round(u, 2) for u in us]})
        finally:
            buf.free()
    return rows
