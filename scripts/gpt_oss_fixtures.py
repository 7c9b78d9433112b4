"""Tiny random gpt-oss checkpoints with transformers' float32 logits as goldens, for
tests/test_gpt_oss.py. Needs torch and transformers 5.x (which has models/gpt_oss), not arcpy's
dependencies:

    python scripts/gpt_oss_fixtures.py tests/data/gpt_oss

For each fixture it writes OUTDIR/<name>/: config.json and model.safetensors (bf16) as
transformers' save_pretrained writes them, and golden.npz: tokens (int32: the prompt, then the
greedy continuation transformers picks in float32), n_prompt, logits (float32 (len(tokens), vocab):
one forward over the whole sequence with the bf16 weights upcast, eager attention), margin (top-1
minus top-2), route_gap (the least lead of the 4th router logit over the 5th, every layer and
position: seeds are tried until it and the greedy steps' margins are clear). The model has 4 layers (sliding, full, sliding, full) whose window (8) is shorter than
the prompt, 8 experts of which 4 route, YaRN over an original context of 64, sinks drawn large
(std 2) so that they take a share of every head's softmax, and the GLU's limit lowered to 1.5 (7 in
gpt-oss) so that its clamps bind at these weights' scale. Every weight is drawn at random (biases
and norms included) and rounded to bf16 before the float32 forward, so the files hold exactly what
ran; the experts' values are drawn in MXFP4's grid (a power of two per 32 of a row times e2m1),
so the tests may store them in MXFP4 and lose nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers_greedy import greedy_run

N_PROMPT, N_GEN, VOCAB = 24, 12, 256
MIN_MARGIN = 0.05  # the least top-1/top-2 margin of every greedy step: seeds are tried until it holds
MIN_ROUTE_GAP = 0.005  # and the least lead of the 4th router logit over the 5th, every layer and position
CONFIG = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=32, num_local_experts=8, num_experts_per_tok=4, sliding_window=8,
              max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False, swiglu_limit=1.5,
              layer_types=["sliding_attention", "full_attention"] * 2,
              rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                               "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64})
FIXTURES = {"gpt_oss": 3001}
# The weights' scales: a matrix's std GAIN / sqrt(fan_in), a bias's BIAS, a norm's factors 1 +- NORM_SPREAD.
# Gentle enough that arcpy's bf16 KV cache moves the logits by under 1%, not by a routing flip.
GAIN, BIAS, NORM_SPREAD = 1.0, 0.2, 0.1
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


def on_mxfp4_grid(shape: tuple[int, ...], rows_axis: int, g: torch.Generator, std: float) -> torch.Tensor:
    """Values of `shape` each 32 along `rows_axis` of which share a power of two, times signed e2m1
    codes: exactly what an MXFP4 block holds (rms near `std`)."""
    codes = torch.randint(0, 8, shape, generator=g)
    signs = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    x = torch.from_numpy(E2M1)[codes] * signs
    blocks = list(shape)
    blocks[rows_axis] //= 32
    exps = torch.randint(-1, 2, blocks, generator=g).float() + float(np.floor(np.log2(std / 2.5)))
    return x * torch.repeat_interleave(torch.exp2(exps), 32, dim=rows_axis)


def randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                w = 2.0 * torch.randn(p.shape, generator=g)
            elif name.endswith("experts.gate_up_proj"):  # (experts, dim, 2 x width): a block runs along dim
                w = on_mxfp4_grid(tuple(p.shape), 1, g, GAIN / p.shape[1] ** 0.5)
            elif name.endswith("experts.down_proj"):  # (experts, width, dim): a block runs along width
                w = on_mxfp4_grid(tuple(p.shape), 1, g, GAIN / p.shape[1] ** 0.5)
            elif "norm" in name:
                w = 1.0 + NORM_SPREAD * torch.randn(p.shape, generator=g)
            elif name.endswith("bias"):
                w = BIAS * torch.randn(p.shape, generator=g)
            elif "embed" in name or "lm_head" in name:
                w = torch.randn(p.shape, generator=g)
            else:
                w = torch.randn(p.shape, generator=g) * (GAIN / p.shape[-1] ** 0.5)
            p.copy_(w.to(torch.bfloat16).to(torch.float32))



def route_gap(model, tokens: list[int]) -> float:
    """The least lead of the k-th router logit over the (k+1)-th, over every layer and position."""
    k = model.config.num_experts_per_tok
    with torch.no_grad():
        out = model(torch.tensor([tokens]), use_cache=False, output_router_logits=True)
    return min(float((s[:, k - 1] - s[:, k]).min()) for s in
               (torch.sort(r.float(), dim=-1, descending=True).values for r in out.router_logits))


def attempt(seed: int):
    cfg = transformers.GptOssConfig(**CONFIG)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(cfg).float().eval()
    randomize(model, seed)
    tokens, logits, top2 = greedy_run(model, seed, VOCAB, N_PROMPT, N_GEN)
    return model, tokens, logits, top2, route_gap(model, tokens)


def build(out: Path, name: str) -> None:
    seed = FIXTURES[name]
    while True:
        model, tokens, logits, top2, gap = attempt(seed)
        if (top2[:, 1] - top2[:, 0])[N_PROMPT - 1:].min() >= MIN_MARGIN and gap >= MIN_ROUTE_GAP:
            break
        seed += 1000
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    np.savez_compressed(d / "golden.npz", tokens=np.array(tokens, np.int32), n_prompt=N_PROMPT,
                        logits=logits.astype(np.float32), margin=(top2[:, 1] - top2[:, 0]).astype(np.float32),
                        route_gap=np.float32(gap))
    (d / "generation_config.json").unlink(missing_ok=True)
    doc = json.loads((d / "config.json").read_text())
    print(f"{name}: seed {seed}, {doc['architectures']}, {sum(f.stat().st_size for f in d.iterdir())} bytes, "
          f"smallest greedy margin {float((top2[:, 1] - top2[:, 0])[N_PROMPT - 1:].min()):.3f}, route gap {gap:.4f}, "
          f"transformers {transformers.__version__}")


if __name__ == "__main__":
    outdir = Path(sys.argv[1])
    for fixture in FIXTURES:
        build(outdir, fixture)
