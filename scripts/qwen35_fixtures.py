"""Tiny random Qwen3.5 checkpoints (dense and MoE) with transformers' float32 logits as goldens, for
tests/test_qwen35.py. Needs torch and transformers 5.x (which has models/qwen3_5), not arcpy's
dependencies:

    python scripts/qwen35_fixtures.py tests/data/qwen35

For each fixture it writes OUTDIR/<name>/: config.json and model.safetensors (bf16) as
transformers' save_pretrained writes them, and golden.npz: tokens (int32: the prompt, then the
greedy continuation transformers picks in float32), n_prompt, logits (float32 (len(tokens), vocab):
one forward over the whole sequence with the bf16 weights upcast), margin (top-1 minus top-2).
Every weight is drawn at random (norms included, so that 1 + w differs from 1; A_log and dt_bias
too) and rounded to bf16 before the float32 forward, so the files hold exactly what ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers_greedy import greedy_run

N_PROMPT, N_GEN, VOCAB = 16, 16, 256
MIN_MARGIN = 0.05  # the least top-1/top-2 margin of every greedy step: seeds are tried until it holds
KINDS = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=len(KINDS), num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, max_position_embeddings=128, rms_norm_eps=1e-6,
              layer_types=KINDS, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=16, linear_conv_kernel_dim=4, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                               "mrope_section": [1, 1, 2], "mrope_interleaved": True})
FIXTURES = {
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(intermediate_size=96), 2001),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
                    dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                         shared_expert_intermediate_size=48), 2002),
}


def randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                w = torch.rand(p.shape, generator=g) * 2.0 - 1.5
            elif name.endswith("dt_bias"):
                w = torch.randn(p.shape, generator=g) * 0.5
            elif name.endswith("linear_attn.norm.weight"):
                w = 1.0 + 0.3 * torch.randn(p.shape, generator=g)
            elif "norm" in name:
                w = 0.3 * torch.randn(p.shape, generator=g)  # the factor is 1 + w
            elif "embed" in name or "lm_head" in name:
                w = torch.randn(p.shape, generator=g)
            else:
                fan_in = p.shape[-1]
                w = torch.randn(p.shape, generator=g) * (1.5 / fan_in ** 0.5)
            p.copy_(w.to(torch.bfloat16).to(torch.float32))



def attempt(name: str, seed: int):
    config_class, model_class, extra, _ = FIXTURES[name]
    cfg = getattr(transformers, config_class)(**COMMON, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(cfg).float().eval()
    randomize(model, seed)
    tokens, logits, top2 = greedy_run(model, seed, VOCAB, N_PROMPT, N_GEN)
    return model, tokens, logits, top2


def build(out: Path, name: str) -> None:
    seed = FIXTURES[name][3]
    while True:
        model, tokens, logits, top2 = attempt(name, seed)
        if (top2[:, 1] - top2[:, 0])[N_PROMPT - 1:].min() >= MIN_MARGIN:
            break
        seed += 1000
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    np.savez_compressed(d / "golden.npz", tokens=np.array(tokens, np.int32), n_prompt=N_PROMPT,
                        logits=logits.astype(np.float32), margin=(top2[:, 1] - top2[:, 0]).astype(np.float32))
    (d / "generation_config.json").unlink(missing_ok=True)
    doc = json.loads((d / "config.json").read_text())
    print(f"{name}: seed {seed}, {doc['architectures']}, {sum(f.stat().st_size for f in d.iterdir())} bytes, "
          f"smallest greedy margin {float((top2[:, 1] - top2[:, 0])[N_PROMPT - 1:].min()):.3f}, transformers {transformers.__version__}")


if __name__ == "__main__":
    outdir = Path(sys.argv[1])
    for fixture in FIXTURES:
        build(outdir, fixture)
