"""Where a seeded sampled loop with speculative steps first leaves the plain sampled loop, and why:
for each case, both loops after the same prompt (arcpy.bench.speculate.driver_tokens: bursts of 8
steps, all plain or all speculative), the first token where they differ, and, from the plain step's
logits at that position read back and the draw replayed on the host (arcpy.sampling), how far the
draw's target lay from the boundary of the id it picked, as a share of the kept mass. With
random logits that distance is about 1e-3; a difference whose distance is far below it is a draw
that a rounding moved across a boundary. The verify's rows have the plain step's logits bit for
bit (arc.h), so every case should print "first_difference": null. One JSON line per case:

    python scripts/sampled_divergence.py --shapes stories15M,gqa --tokens 160

Cases: each shape at temperature 0.7; 1.0 with top-p 0.9; 0.3 with top-k 8 and top-p 0.8.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from arcpy.bench.loop import script_status
from arcpy.bench.speculate import DRAFTS, driver_tokens, repeating_prompt
from arcpy.devices.cuda import open_cuda_device
from arcpy.errors import ArcError
from arcpy.model import preset_formats, synthetic_model
from arcpy.sampling import Sampler, Sampling, draw_words

SETTINGS = [Sampling(temperature=0.7, seed=2), Sampling(temperature=1.0, top_p=0.9, seed=4),
            Sampling(temperature=0.3, top_k=8, top_p=0.8, seed=5)]


def boundary_distance(logits: np.ndarray, sampling: Sampling, position: int, token: int) -> dict:
    """Where the draw of `token` from `logits` at `position` lay in its id's interval."""
    sampler = Sampler(sampling)
    if sampler.sample(logits, position) != token:
        raise ArcError(f"position {position}: the host's draw from the read-back logits is not the device's {token}")
    q = sampler._kept_weights(logits).astype(np.uint64)
    ends = np.cumsum(q)
    total = int(ends[-1])
    target = (total * int(draw_words(sampling.seed, position))) >> 32
    low, high = int(ends[token] - q[token]), int(ends[token])
    return {"kept_ids": int((q > 0).sum()), "token_weight": int(q[token]),
            "distance_over_mass": min(target - low, high - 1 - target) / total}


def divergence(device, sampling: Sampling, tokens: int) -> dict:
    prompt = repeating_prompt(device.vocab, seed=4)
    plain = driver_tokens(device, prompt, sampling, tokens, speculative=False)
    spec = driver_tokens(device, prompt, sampling, tokens, speculative=True)
    j = next((i for i in range(min(len(plain), len(spec))) if plain[i] != spec[i]), None)
    row = {"sampling": str(sampling), "tokens": tokens, "first_difference": j}
    if j is None:
        return row
    driver_tokens(device, prompt, sampling, j + 1, speculative=False)  # its last step drew plain[j]
    fwd, ctx = device.forward, device.ctx
    logits, _ = ctx.pinned((fwd.width,), np.float32)
    ctx.wait_idle()
    ctx.download_async(logits, fwd.logits)
    ctx.wait_idle()
    row.update(plain=plain[j], speculative=spec[j], position=len(prompt) + j,
               **boundary_distance(logits[:device.vocab].copy(), sampling, len(prompt) + j, plain[j]))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="stories15M,gqa", help="comma-separated synthetic shapes (bf16)")
    ap.add_argument("--tokens", type=int, default=160, help="tokens each loop makes")
    a = ap.parse_args(argv)

    def body():
        shapes = a.shapes.split(",")
        for shape in shapes:
            preset_formats(shape)  # refuses an unknown shape before any GPU work
        for shape in shapes:
            with open_cuda_device(synthetic_model(shape, seed=3), max_seq=512, speculate=DRAFTS) as device:
                for sampling in SETTINGS:
                    print(json.dumps({"shape": shape, **divergence(device, sampling, a.tokens)}), flush=True)

    return script_status(body)


if __name__ == "__main__":
    sys.exit(main())
