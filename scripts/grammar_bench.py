"""llguidance against xgrammar on this machine's CPU, at Llama 3's vocabulary (128,256 ids): the
time to build the tokenizer's tables, to compile each schema, to compute a mask at each token of a
valid answer (the answer's own tokens, fed back one at a time), and the process's memory after.
For llguidance also what a constrained step of arcpy's host path adds after its logits land
(arcpy.loop.constrain.Constrained: the allowed ids' logits and the draw from them, greedy and at
temperature 0.8, top-p 0.95), the mask itself being computed while the forward runs.

    python scripts/grammar_bench.py [--json FILE]

Each library runs in a child process of its own, so that its memory is its own. The vocabulary is
llama.cpp's Llama 3 test vocabulary (tests/llamacpp_sdist.py fetches it). xgrammar is not a
dependency of arcpy: install it to compare (`pip install xgrammar`, which pulls in torch).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

SCHEMAS = {
    "flat": ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False},
             {"name": "Ada Lovelace", "age": 36}),
    "nested": ({"type": "object", "additionalProperties": False, "required": ["city", "days"],
                "properties": {"city": {"type": "string"}, "days": {"type": "array", "items": {
                    "type": "object", "additionalProperties": False, "required": ["date", "high", "sky"],
                    "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                                   "high": {"type": "number"},
                                   "sky": {"enum": ["clear", "cloudy", "rain", "snow"]}}}}}},
               {"city": "Oslo", "days": [{"date": "2026-12-02", "high": -3.5, "sky": "snow"},
                                         {"date": "2026-12-03", "high": 1.0, "sky": "cloudy"}]}),
    "tool_call": ({"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                   "properties": {"name": {"const": "get_weather"}, "arguments": {
                       "type": "object", "additionalProperties": False, "required": ["location", "unit"],
                       "properties": {"location": {"type": "string"},
                                      "unit": {"enum": ["celsius", "fahrenheit"]}}}}},
                  {"name": "get_weather", "arguments": {"location": "Paris, France", "unit": "celsius"}}),
}


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def vocabulary():
    from llamacpp_sdist import llamacpp_models

    from arcpy.model.gguf_file import read_gguf
    from arcpy.model.gguf_vocab import read_vocabulary
    from arcpy.text import gguf_text_spec

    f = read_gguf(llamacpp_models() / "ggml-vocab-llama-bpe.gguf")
    n = len(f.meta.strings("tokenizer.ggml.tokens"))
    return gguf_text_spec(read_vocabulary(f.meta, n)), n


def answer_ids(spec, instance) -> list[int]:
    text = json.dumps(instance, separators=(", ", ": "))
    return spec.tokenizer.encode(text, add_special_tokens=False).ids


def run_llguidance(spec, n) -> dict:
    import numpy as np

    from arcpy.loop.constrain import Constrained
    from arcpy.sampling import Sampler, Sampling
    from arcpy.text.grammar import JSON_SCHEMA, Grammar, TokenTables, allowed, words

    t = time.perf_counter()
    vocab = TokenTables(spec, n)
    out = {"library": "llguidance", "tokenizer_s": time.perf_counter() - t, "schemas": {}}
    bits = np.zeros(words(n), np.int32)
    for name, (schema, instance) in SCHEMAS.items():
        t = time.perf_counter()
        m = Grammar.compile(vocab, JSON_SCHEMA, schema).matcher()
        compile_s = time.perf_counter() - t
        times = []
        for tok in answer_ids(spec, instance):
            t = time.perf_counter()
            m.fill(bits)
            times.append(time.perf_counter() - t)
            assert allowed(bits, n)[tok], (name, tok)
            m.consume(tok)
        m.fill(bits)
        assert allowed(bits, n)[spec.eos_ids[0]]
        out["schemas"][name] = {"compile_ms": compile_s * 1e3, **_times(times)}
        logits = np.random.default_rng(0).standard_normal(n).astype(np.float32) * 3
        for label, sampling in (("greedy", Sampling()), ("sampled", Sampling(0.8, 0, 0.95, 1))):
            c, sampler, after = Constrained(Grammar.compile(vocab, JSON_SCHEMA, schema).matcher(), n), Sampler(sampling), []
            for i, tok in enumerate(answer_ids(spec, instance)):
                c.fill()
                t = time.perf_counter()
                sampler.sample(c.masked(logits), i)
                after.append(time.perf_counter() - t)
                c.ids = np.array([tok])  # go on along the answer, whatever was drawn
                c.consume(0)
            out["schemas"][name][f"host_step_{label}_us"] = _times(after)["mask_us_median"]
    out["rss_mib"] = rss_mib()
    return out


def run_xgrammar(spec, n) -> dict:
    import numpy as np
    import torch
    import xgrammar as xgr

    from arcpy.text.grammar import token_bytes

    t = time.perf_counter()
    info = xgr.TokenizerInfo(token_bytes(spec, n), xgr.VocabType.RAW, vocab_size=n, stop_token_ids=list(spec.eos_ids))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    out = {"library": "xgrammar", "tokenizer_s": time.perf_counter() - t, "schemas": {}}
    bits = xgr.allocate_token_bitmask(1, n)
    for name, (schema, instance) in SCHEMAS.items():
        t = time.perf_counter()
        m = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                            separators=(", ", ": ")))
        compile_s = time.perf_counter() - t
        times = []
        for tok in answer_ids(spec, instance):
            t = time.perf_counter()
            m.fill_next_token_bitmask(bits)
            times.append(time.perf_counter() - t)
            word = int(bits[0, tok // 32])
            assert (word >> (tok % 32)) & 1, (name, tok)
            assert m.accept_token(tok)
        out["schemas"][name] = {"compile_ms": compile_s * 1e3, **_times(times)}
    del np, torch
    out["rss_mib"] = rss_mib()
    return out


def _times(times: list[float]) -> dict:
    us = sorted(t * 1e6 for t in times)
    return {"tokens": len(us), "mask_us_median": us[len(us) // 2], "mask_us_p90": us[int(len(us) * 0.9)],
            "mask_us_max": us[-1]}


def child(library: str) -> None:
    spec, n = vocabulary()
    base = rss_mib()
    out = (run_llguidance if library == "llguidance" else run_xgrammar)(spec, n)
    out.update(vocab=n, rss_before_mib=base)
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", choices=["llguidance", "xgrammar"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    results = []
    for library in ("llguidance", "xgrammar"):
        p = subprocess.run([sys.executable, __file__, "--child", library], capture_output=True, text=True)
        if p.returncode:
            print(f"{library}: failed: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        results.append(r)
        print(f"{r['library']}: tables {r['tokenizer_s']:.2f} s, memory {r['rss_mib'] - r['rss_before_mib']:.0f} MiB "
              f"more ({r['rss_mib']:.0f} MiB)")
        for name, s in r["schemas"].items():
            print(f"  {name:9s} compile {s['compile_ms']:8.2f} ms, mask median {s['mask_us_median']:7.1f} us, "
                  f"p90 {s['mask_us_p90']:7.1f} us, max {s['mask_us_max']:8.1f} us over {s['tokens']} tokens"
                  + (f"; host step after the logits: greedy {s['host_step_greedy_us']:.0f} us, sampled "
                     f"{s['host_step_sampled_us']:.0f} us (medians)" if "host_step_greedy_us" in s else ""))
    if args.json:
        args.json.write_text(json.dumps({"cpu": os.cpu_count(), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
