"""A model's perplexity on a long real text with its KV cache in each form of
arcpy/devices/kv_formats.py (bf16, q8_0, fp8): what holding the cache in fewer bytes costs the
model's predictions, on the NumPy reference (--backend numpy, the default) or on the GPU (--backend
cuda: bf16 and q8_0, scored by the prefill as a prompt's log-probabilities are).

The text is the Python standard library's help topics (`pydoc_data.topics`, every Python has it,
nothing is fetched), topics in sorted order, tokenized by the model's tokenizer. It is scored in
windows of --window tokens, each from an empty cache (the first token of a window is context, the
rest are predicted), over the first --tokens tokens:

    python scripts/perplexity.py --tokens 20480 --window 2048 --json ppl.json
    python scripts/perplexity.py --backend cuda --kv-cache bf16,q8_0 --json ppl-gpu.json

The demo model is used where --model is not given. One JSON line per form on stdout (and the whole
report in --json): the tokens predicted, the mean negative log-likelihood, the perplexity, and its
ratio to bf16's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

from arcpy.backends import open_engine
from arcpy.devices.kv_formats import KV_FORMATS
from arcpy.front import open_model
from arcpy.text.codec import encode


def help_text() -> str:
    import pydoc_data.topics as topics
    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def score(engine, tokens: list[int], window: int) -> tuple[float, int]:
    """The summed negative log-likelihood (nats) of every token after the first of each window, and
    how many were predicted: each window scored from position 0 as a prompt (Engine.prompt_logprobs)."""
    nll, n = 0.0, 0
    for s in range(0, len(tokens) - 1, window):
        w = tokens[s:s + window]
        if len(w) < 2:
            break
        nll -= sum(entry.logprob for entry in engine.prompt_logprobs(w, 0))
        n += len(w) - 1
    return nll, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a model file or directory (default: the demo model)")
    ap.add_argument("--backend", default="numpy", choices=["numpy", "cuda"], help="where to score (default numpy)")
    ap.add_argument("--kv-cache", default=",".join(KV_FORMATS), help="comma-separated forms (default: all)")
    ap.add_argument("--tokens", type=int, default=20480, help="tokens of the text scored (default 20480)")
    ap.add_argument("--window", type=int, default=2048, help="tokens a window (default 2048)")
    ap.add_argument("--json", default=None, help="write the report here too")
    a = ap.parse_args(argv)
    model, text = open_model(a.model)
    if text is None:
        print(f"{model.name} has no tokenizer", file=sys.stderr)
        return 2
    tokens = encode(text, help_text())[:a.tokens]
    window = min(a.window, model.config.max_seq)
    report = {"model": model.name, "backend": a.backend, "text": "pydoc_data.topics", "tokens": len(tokens),
              "window": window, "forms": []}
    base = None
    for fmt in a.kv_cache.split(","):
        t0 = time.perf_counter()
        with open_engine(model, a.backend, max_seq=window, kv_cache=fmt, speculate=0, environ={}) as engine:
            nll, n = score(engine, tokens, window)
        ppl = math.exp(nll / n)
        base = ppl if base is None and fmt == "bf16" else base
        row = {"kv_cache": fmt, "predicted": n, "mean_nll": nll / n, "perplexity": ppl,
               "vs_bf16": ppl / base if base else None, "seconds": round(time.perf_counter() - t0, 1)}
        report["forms"].append(row)
        print(json.dumps(row), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
