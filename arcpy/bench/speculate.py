"""The speculation benchmark: the device loop with and without speculative steps, on the same
prompts and the same device, and what one speculative step costs.

- Step cost: a burst of plain steps and a burst of speculative steps at the same positions, timed
  whole, per step; their ratio is what a speculative step must make up in tokens.
- Generations (burst 16; greedy, and where the text repeats sampled at temperature 0.7 with a
  seed, so that the two loops' tokens can be compared): tokens/s of the plain loop and of the loop
  with speculation (the policy choosing burst by burst), the tokens per speculative step, the share
  of drafts accepted, the tokens per weight read, and whether the two made the same tokens.
- Cases: on synthetic shapes, a random prompt (random weights do not repeat themselves: the
  policy should keep to the plain loop) and a prompt whose continuation repeats earlier text. For
  the latter the shape's attention and MLP outputs are zeroed (Wo = Wdown = 0, every weight still
  read at full cost), so the next token is a function of the last one alone and the greedy
  continuation falls into a cycle; the prompt is the continuation up to one full turn of it. On
  the real model (the demo SmolLM2 file, when fetched): an extractive prompt (quote a paragraph),
  a code edit and free text, through its chat template.
- Every case drafts from its own sequence alone, except those "asked again": the random prompt
  and the free text once more after an earlier answer to them, drafting from the engine's memory
  of earlier sequences (arcpy.drafting.DraftMemory).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Callable

import numpy as np

from arcpy import _lib
from arcpy.bench.kernels import Buffers, time_launches
from arcpy.bench.loop import bench_max_seq
from arcpy.devices.context import Context
from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.sequence import SequenceStart
from arcpy.errors import ArcError
from arcpy.loop.burst import BurstDriver
from arcpy.loop.engine import Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.request import Request
from arcpy.codes import FORMAT_BF16, FORMAT_NAMES
from arcpy.loop.settings import EngineSettings
from arcpy.model import LM_HEAD, layer_prefix, preset_formats, synthetic_model
from arcpy.model.quant import QuantTensor, row_bytes
from arcpy.sampling import Sampling

DRAFTS = 7
BURST = 16
SAMPLED = Sampling(temperature=0.7, seed=7)  # the chat clients' common temperature; seeded, to compare tokens
SAMPLED_NAME = "sampled t 0.7"
SAME = {True: "yes", False: "NO", None: "n/a (unseeded draws)"}
AGAIN = "asked again"  # the same request after an earlier run: drafts from the engine's memory of it

PARAGRAPH = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He wound the great "
             "clockwork, trimmed the wick, and polished the lens until it shone. Ships far out at sea saw the "
             "beam sweep across the water and knew that the rocks were near. In winter the storms came, and "
             "he kept the light burning through the longest nights, writing each passing ship in his log.")
CODE = '''def summarize(records):
    total = 0
    count = 0
    largest = None
    for record in records:
        value = record["amount"]
        total = total + value
        count = count + 1
        if largest is None or value > largest:
            largest = value
    average = total / count if count else 0
    return {"total": total, "count": count, "largest": largest, "average": average}
'''
REAL_CASES = {
    "extractive": "Repeat this paragraph exactly, word for word:\n\n" + PARAGRAPH,
    "code edit": "Rename the variable `total` to `running_sum` in this Python function. Reply with the whole "
                 "function and nothing else.\n\n" + CODE,
    "free text": "Write a short story about a fox who learns to sing.",
}


def step_costs(device, steps: int = 32, runs: int = 5) -> dict:
    """Microseconds per plain step and per speculative step, each from whole bursts of `steps`
    at the same positions after the same random prompt (median of `runs`)."""
    prompt = np.random.default_rng(7).integers(3, device.vocab, 64).tolist()
    drv = BurstDriver(device)
    out = {}
    for kind in ("plain", "speculative"):
        per_step = []
        for i in range(runs + 1):
            drv.begin_sequence(SequenceStart(loop=True))
            device.enqueue_prefill(prompt, 0)
            device.set_input(prompt[-1], len(prompt) - 1)
            list(drv.run(1, first_commit=True))
            t0 = time.perf_counter()
            if kind == "plain":
                list(drv.run(steps))
            else:
                list(drv.run_speculative(steps, 10 * steps))
            if i > 0:
                per_step.append((time.perf_counter() - t0) / steps * 1e6)
        out[f"{kind}_us"] = statistics.median(per_step)
    out["ratio"] = out["speculative_us"] / out["plain_us"]
    return out


def repeating_prompt(vocab: int, seed: int = 0) -> list[int]:
    """A passage, something else, then the passage's start again: the model's continuation may
    follow the passage, and the drafts will propose it."""
    rng = np.random.default_rng(seed)
    passage = rng.integers(3, vocab, 48).tolist()
    return [1] + passage + rng.integers(3, vocab, 8).tolist() + passage[:12]


def driver_tokens(device, prompt, sampling, n: int, speculative: bool) -> list[int]:
    """n tokens of the device loop after a prefill of `prompt`, drawn with `sampling` (its seed as
    given; None: greedy), in bursts of 8 steps, each plain or each speculative: the two kinds of
    step compared directly, without the policy."""
    drv = BurstDriver(device, max_spins=50_000_000)
    drv.begin_sequence(SequenceStart(loop=True, sampling=sampling))
    device.enqueue_prefill(prompt, 0)
    device.set_input(prompt[-1], len(prompt) - 1)
    out = list(drv.run(1, first_commit=True))
    while len(out) < n:
        out += list(drv.run_speculative(8, n - len(out)) if speculative else drv.run(min(8, n - len(out))))
    return out


PRODUCT_ROWS = (1, 4, 8)
L2_BYTES = 50 << 20


def verify_products(shape: str, cfg) -> list[tuple[str, int, int, bool, int]]:
    """(name, n, k, swiglu, arc_format) of the verify's products in layer 0 and the lm_head, as the
    forward launches them: q, k and v one product for each run of one format."""
    formats = preset_formats(shape)
    pre = layer_prefix(0)
    fmt = {part: formats[f"{pre}{part}.weight"] for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                             "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")}
    out, runs = [], [("q", cfg.q_dim, fmt["self_attn.q_proj"]), ("k", cfg.kv_dim, fmt["self_attn.k_proj"]),
                     ("v", cfg.kv_dim, fmt["self_attn.v_proj"])]
    while runs:  # a run of parts of one format
        n = 1
        while n < len(runs) and runs[n][2] == runs[0][2]:
            n += 1
        out.append(("".join(r[0] for r in runs[:n]), sum(r[1] for r in runs[:n]), cfg.dim, False, runs[0][2]))
        runs = runs[n:]
    out += [("o", cfg.dim, cfg.q_dim, False, fmt["self_attn.o_proj"]),
            ("gate/up swiglu", cfg.ffn_dim, cfg.dim, True, fmt["mlp.gate_proj"]),
            ("down", cfg.dim, cfg.ffn_dim, False, fmt["mlp.down_proj"]),
            ("lm_head", cfg.vocab, cfg.dim, False, formats.get(LM_HEAD, FORMAT_BF16))]
    return out


def product_ops(ctx, fmt: int, n: int, k: int, swiglu: bool, x, s, y) -> list[tuple[str, int, Callable]]:
    """(kind, rows, op(w)) for the decode's GEMV of the product and its rows form over 1, 4 and 8 rows."""
    lib, NULL = ctx.lib, ctx.ffi.NULL
    if fmt == FORMAT_BF16:
        one = (lambda w: lib.arc_op_gemv_swiglu(ctx.ptr, w, x, n, k, NULL, 0.0, y)) if swiglu else \
            (lambda w: lib.arc_op_gemv(ctx.ptr, w, x, n, k, NULL, NULL, 0.0, 0, y))
        rows = (lambda r: lambda w: lib.arc_op_gemv_rows_swiglu(ctx.ptr, w, x, r, n, k, NULL, 0.0, NULL, y)) \
            if swiglu else (lambda r: lambda w: lib.arc_op_gemv_rows(ctx.ptr, w, x, r, n, k, NULL, NULL, 0.0, 0, NULL, y))
    else:
        one = (lambda w: lib.arc_op_qgemv_swiglu(ctx.ptr, fmt, w, x, n, k, NULL, 0.0, y)) if swiglu else \
            (lambda w: lib.arc_op_qgemv(ctx.ptr, fmt, w, x, n, k, NULL, NULL, 0.0, 0, y))
        rows = (lambda r: lambda w: lib.arc_op_qgemv_rows_swiglu(ctx.ptr, fmt, w, x, r, n, k, NULL, 0.0, s, y)) \
            if swiglu else (lambda r: lambda w: lib.arc_op_qgemv_rows(ctx.ptr, fmt, w, x, r, n, k, NULL, NULL, 0.0, 0,
                                                                      s, y))
    return [("gemv", 1, one)] + [(f"rows{r}", r, rows(r)) for r in PRODUCT_ROWS]


def products_report(shape: str, cfg, replays: int) -> list[dict]:
    """Each product of the verify forward timed alone against the decode's GEMV of the same matrix,
    in its format: µs per launch and the weights' GB/s, for 1, 4 and 8 rows (graphs of launches
    over distinct copies of the matrix, so that no launch finds it in L2)."""
    out = []
    with Context(0) as ctx:
        buf = Buffers(ctx)
        try:
            ffi = ctx.ffi
            for name, n, k, swiglu, fmt in verify_products(shape, cfg):
                w_rows = 2 * n if swiglu else n
                nbytes = w_rows * row_bytes(fmt, k)
                copies = max(2, min(cfg.n_layers, -(-4 * L2_BYTES // nbytes)))
                ws = [buf.matrix(fmt, w_rows, k) for _ in range(copies)]
                x = ffi.cast("float *", buf.random_bf16(8 * k * 4))
                s = ffi.cast("float *", buf.alloc(8 * k * 4))
                y = ffi.cast("float *", buf.alloc(8 * w_rows * 4))
                row = {"name": name, "format": FORMAT_NAMES[fmt], "n": w_rows, "k": k}
                for kind, _, op in product_ops(ctx, fmt, n, k, swiglu, x, s, y):
                    ctx.wait_idle()
                    us = statistics.median(time_launches(ctx, [lambda w=w, op=op: _lib.check(op(w)) for w in ws],
                                                         replays))
                    row[f"{kind}_us"] = us
                    row[f"{kind}_GBps"] = nbytes / us / 1e3
                out.append(row)
        finally:
            buf.free()
    return out


def _generate(engine: Engine, request: Request) -> tuple[list[int], float]:
    stamps, toks = [], []
    for piece in engine.stream(request):
        if piece.token is not None:
            toks.append(piece.token)
            stamps.append(time.perf_counter())
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return toks, rate


def compare(device, request: Request, runs: int, text=None, memory: bool = False) -> dict:
    """The plain loop and the loop with speculation on one request: median tokens/s of each (the
    first run of each warms up), and the speculative run's statistics. Without `memory` each
    sequence drafts from itself alone; with it, from the earlier runs too: every timed run is the
    question asked again."""
    row = {}
    tokens = {}
    for kind, speculate in (("plain", False), ("speculative", True)):
        eng = Engine(device, "cuda",
                     EngineSettings(device_loop=True, burst=BURST, speculate=speculate, draft_memory=memory),
                     environ={}, latch=FallbackLatch())
        eng.text = text
        rates = []
        for i in range(runs + 1):
            toks, rate = _generate(eng, request)
            if i > 0:
                rates.append(rate)
        tokens[kind] = toks
        st = eng.stats
        row[f"{kind}_tok_s"] = statistics.median(rates)
        if speculate:
            row.update(tokens=st.tokens, spec_steps=st.spec_steps, tokens_per_step=st.tokens_per_step,
                       acceptance=st.acceptance, tokens_per_weight_read=st.tokens_per_weight_read)
    row["speedup"] = row["speculative_tok_s"] / row["plain_tok_s"] if row["plain_tok_s"] else 0.0
    # Unseeded draws differ run to run: only greedy and seeded rows can be compared token for token.
    comparable = request.sampling.is_greedy() or request.sampling.seed is not None
    row["identical"] = tokens["plain"] == tokens["speculative"] if comparable else None
    return row


MAX_SEQ = 4096


def looping(model) -> None:
    """Zero every layer's Wo and Wdown in place: the residual stream stays the token's embedding,
    so the next token depends on the last one alone (the forward still reads every weight)."""
    for name, array in model.tensors.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            # A quantized matrix of zero bytes has zero scales, so zero weights in every format.
            (array.data if isinstance(array, QuantTensor) else array)[...] = 0


def one_turn(device, tokens: int) -> list[int]:
    """The looping model's greedy continuation of [1], up to the first token that closes a cycle
    (at most MAX_SEQ - tokens - 1 tokens: the answer must still fit)."""
    plain = Engine(device, "cuda", EngineSettings(device_loop=True, burst=BURST, speculate=False), environ={},
                   latch=FallbackLatch())
    out, seen = [1], {1}
    for tok in plain.generate([1], MAX_SEQ - tokens - 2):
        out.append(tok)
        if tok in seen:
            break
        seen.add(tok)
    return out


def bench_shape(shape: str, tokens: int, runs: int) -> dict:
    out = {"shape": shape, "drafts": DRAFTS, "cases": {}}
    for case in ("random prompt", "repeats earlier text"):
        model = synthetic_model(shape, seed=0)
        cfg = model.config
        if case != "random prompt":
            looping(model)
        with open_cuda_device(model, max_seq=min(bench_max_seq(model.config), MAX_SEQ), speculate=DRAFTS) as device:
            del model
            if case == "random prompt":
                out["step"] = step_costs(device, runs=runs)
                ids = np.random.default_rng(3).integers(3, device.vocab, 64).tolist()
            else:
                ids = one_turn(device, tokens)
            out["cases"][case] = compare(device, Request(prompt_ids=ids, max_new_tokens=tokens), runs)
            out["cases"][case]["prompt_tokens"] = len(ids)
            if case == "random prompt":
                again = compare(device, Request(prompt_ids=ids, max_new_tokens=tokens), runs, memory=True)
                out["cases"][case + ", " + AGAIN] = {**again, "prompt_tokens": len(ids)}
            if case != "random prompt":
                sampled = Request(prompt_ids=ids, max_new_tokens=tokens, sampling=SAMPLED)
                out["cases"][case + ", " + SAMPLED_NAME] = {**compare(device, sampled, runs), "prompt_tokens": len(ids)}
    out["products"] = products_report(shape, cfg, runs)
    return out


def bench_real(path: str, tokens: int, runs: int) -> dict:
    from arcpy.loading import load_gguf
    model, text = load_gguf(path)
    with open_cuda_device(model, max_seq=2048, speculate=DRAFTS) as device:
        out = {"model": model.name, "drafts": DRAFTS, "step": step_costs(device, runs=runs), "cases": {}}
        for name, prompt in REAL_CASES.items():
            request = Request(messages=[{"role": "user", "content": prompt}], max_new_tokens=tokens,
                              stop_ids=text.eos_ids)
            out["cases"][name] = compare(device, request, runs, text)
            if name == "free text":
                out["cases"][name + ", " + AGAIN] = compare(device, request, runs, text, memory=True)
            if name == "extractive":
                sampled = replace(request, sampling=SAMPLED)
                out["cases"][name + ", " + SAMPLED_NAME] = compare(device, sampled, runs, text)
    return out


def run(shapes, tokens: int, runs: int, real_model: str | None,
        progress: Callable[[str], None] = lambda line: None) -> dict:
    report = {"drafts": DRAFTS, "burst": BURST, "tokens": tokens, "runs": runs, "shapes": []}
    for shape in shapes:
        t0 = time.perf_counter()
        try:
            report["shapes"].append(bench_shape(shape, tokens, runs))
        except ArcError as exc:
            report["shapes"].append({"shape": shape, "error": str(exc)})
        progress(f"speculation {shape}: {time.perf_counter() - t0:.0f} s")
    if real_model:
        t0 = time.perf_counter()
        report["real"] = bench_real(real_model, tokens, runs)
        progress(f"speculation on {real_model}: {time.perf_counter() - t0:.0f} s")
    return report


def format_table(report: dict) -> str:
    lines = [f"speculation: {report['drafts']} drafts a step, burst {report['burst']}, "
             f"{report['tokens']} tokens, median of {report['runs']}"]
    parts = [(s.get("shape"), s) for s in report["shapes"]]
    if "real" in report:
        parts.append((report["real"]["model"], report["real"]))
    for name, part in parts:
        if "error" in part:
            lines.append(f"  {name}: {part['error']}")
            continue
        step = part["step"]
        lines.append(f"  {name}: plain step {step['plain_us']:.0f} us, speculative step {step['speculative_us']:.0f} us "
                     f"({step['ratio']:.2f}x)")
        for prod in part.get("products", []):
            cells = "  ".join(f"{kind} {prod[kind + '_us']:7.1f} us {prod[kind + '_GBps']:5.0f} GB/s"
                              for kind in ["gemv"] + [f"rows{r}" for r in PRODUCT_ROWS])
            lines.append(f"    {prod['name']:15s} {prod.get('format', 'bf16'):5s} {prod['n']:6d}x{prod['k']:<6d} {cells}")
        for case, row in part["cases"].items():
            lines.append(f"    {case:28s} plain {row['plain_tok_s']:8.1f} tok/s  speculative "
                         f"{row['speculative_tok_s']:8.1f} tok/s  {row['speedup']:.2f}x  "
                         f"{row['tokens_per_step']:.2f} tok/step  {row['acceptance']:.0%} accepted  "
                         f"same tokens: {SAME[row['identical']]}")
    return "\n".join(lines)
