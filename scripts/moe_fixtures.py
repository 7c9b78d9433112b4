"""Small random mixture-of-experts checkpoints with transformers' float32 logits as their golden
output (tests/test_moe_goldens.py reads them).

    python scripts/moe_fixtures.py tests/data/moe

For each family (FAMILIES below) it writes OUTDIR/<family>/:
- config.json, model.safetensors: arcpy's preset of the family with random weights (fixed seed),
  written by arcpy.model.save_model under transformers' names (one tensor per expert; Mixtral's
  block_sparse_moe), bf16;
- golden.npz: tokens (int32: random ids, drawn from numpy.random.default_rng([seed, attempt]) for
  attempt 0, 1, ..., the first whose routing leads by ROUTE_GAP at every position of every
  layer: the k-th router logit above the (k+1)-th, so that a rounding does not pick another
  expert), logits (float32 (len(tokens), vocab): transformers' model of the family loaded from
  those files in float32, one forward over the sequence), margin (top-1 minus top-2 at each
  position);
- golden.json: the versions used and the routing facts.

transformers must be importable (it is not one of arcpy's dependencies); nothing here needs a GPU.
Loading the files with transformers checks the names too: a tensor it did not find would be left
at its random initialization, which from_pretrained reports and this script refuses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from arcpy.model import SHAPES, random_model, save_model  # noqa: E402

# family -> (arcpy preset, changes): every family narrowed to a few hundred KB of weights (the
# experts' count and top k kept: 16 and 8, 8 and 2); Qwen2-MoE gets a shared expert and every 2nd
# layer sparse.
SMALL = {"dim": 64, "head_dim": 16, "ffn_dim": 128, "vocab": 288}
FAMILIES = {
    "qwen3moe": ("qwen3moe-tiny", {**SMALL, "expert_ffn_dim": 64}),
    "mixtral": ("mixtral-tiny", {**SMALL, "expert_ffn_dim": 64}),
    "qwen2moe": ("qwen3moe-tiny", {**SMALL, "expert_ffn_dim": 64, "qk_norm": False, "qkv_bias": True,
                                   "shared_expert_ffn_dim": 96, "moe_every": 2, "mlp_only_layers": (), "n_layers": 4}),
}
N_TOKENS = 24
ROUTE_GAP = 0.02  # the least lead of a chosen expert's router logit over the first one left out


def route_gap(router_logits, k: int) -> float:
    """The least lead of the k-th router logit over the (k+1)-th, over the positions of a layer."""
    s = torch.sort(router_logits.float(), dim=-1, descending=True).values
    return float((s[:, k - 1] - s[:, k]).min())


def build(name: str, outdir: Path, seed: int = 0) -> None:
    shape, changes = FAMILIES[name]
    cfg = dataclasses.replace(SHAPES[shape], max_seq=256, **changes)
    d = outdir / name
    save_model(random_model(cfg, seed=seed, name=name), d)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    missing = [k for k in info.get("missing_keys", []) if "rotary" not in k]
    if missing or info.get("unexpected_keys"):
        raise SystemExit(f"{name}: transformers did not read every tensor: missing {missing[:3]}, "
                         f"unexpected {list(info.get('unexpected_keys', []))[:3]}")
    model.eval()
    for attempt in range(1000):
        tokens = np.random.default_rng([seed, attempt]).integers(0, cfg.vocab, N_TOKENS, dtype=np.int32)
        with torch.no_grad():
            out = model(torch.from_numpy(tokens.astype(np.int64))[None], output_router_logits=True)
        gap = min(route_gap(r, cfg.n_experts_used) for r in out.router_logits)
        if gap >= ROUTE_GAP:
            break
    else:
        raise SystemExit(f"{name}: no tokens in 1,000 attempts whose routing leads by {ROUTE_GAP}")
    logits = out.logits[0].float().numpy()
    top2 = np.sort(logits, axis=1)[:, -2:]
    np.savez(d / "golden.npz", tokens=tokens, logits=logits, margin=top2[:, 1] - top2[:, 0])
    facts = {"transformers": transformers.__version__, "torch": torch.__version__, "preset": shape,
             "changes": {k: list(v) if isinstance(v, tuple) else v for k, v in changes.items()},
             "n_experts": cfg.n_experts, "n_experts_used": cfg.n_experts_used, "routing": cfg.routing,
             "norm_topk_prob": cfg.norm_topk_prob, "class": type(model).__name__, "attempt": attempt,
             "route_gap": round(gap, 6)}
    (d / "golden.json").write_text(json.dumps(facts, indent=2) + "\n")
    print(f"{name}: {type(model).__name__}, {N_TOKENS} tokens (attempt {attempt}, routing gap {gap:.3g}), "
          f"logits scale {np.abs(logits).max():.3g}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--only", nargs="*", choices=list(FAMILIES))
    args = parser.parse_args()
    for name in args.only or list(FAMILIES):
        build(name, args.outdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
