"""Tiny random Gemma 4 checkpoints with transformers' float32 logits as goldens, for
tests/test_gemma4.py. Needs torch and transformers 5.x (which has models/gemma4), not arcpy's
dependencies:

    python scripts/gemma4_fixtures.py tests/data/gemma4

Three fixtures, each with sliding and full-attention layers and a window shorter than the sequence:
- dense: full-attention layers of their own head width and one kv head whose v is k's projection
  (attention_k_eq_v), proportional RoPE over a quarter of their heads, the logits capped at 30;
- moe: the experts beside the dense FFN (enable_moe_block), v projections of their own;
- ple: per-layer embeddings, the last two layers sharing the K/V of earlier ones, their FFN twice
  as wide (use_double_wide_mlp).
dense and ple are written as Gemma4ForConditionalGeneration's checkpoints are published: config.json
with the text model's keys under text_config (global_head_dim, num_global_key_value_heads), the
weights under model.language_model, and (ple) the k_proj, v_proj and k_norm that a shared layer's
files hold and nothing reads. moe is written as transformers' save_pretrained writes a
Gemma4ForCausalLM (per_layer_config, the experts packed in 3-D tensors).

Each OUTDIR/<name>/ gets config.json, model.safetensors (bf16) and golden.npz: tokens (int32: the
prompt, then the greedy continuation transformers picks in float32), n_prompt, logits (float32
(len(tokens), vocab): one forward over the whole sequence with the bf16 weights upcast), margin
(top-1 minus top-2). Every weight is drawn at random (norms, router scales and layer scalars about 1)
and rounded to bf16 before the float32 forward, so the files hold exactly what ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers_greedy import greedy_run
from safetensors.torch import save_file

N_PROMPT, N_GEN, VOCAB = 16, 16, 256
MIN_MARGIN = 0.05  # the least top-1/top-2 margin of every greedy step: seeds are tried until it holds
WINDOW = 6  # shorter than the 32 positions the goldens run
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}
COMMON = dict(vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=128, rms_norm_eps=1e-6, sliding_window=WINDOW, rope_parameters=ROPE,
              hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, hidden_size_per_layer_input=0)
KINDS = ["sliding_attention", "full_attention"]
FIXTURES = {
    "dense": (dict(num_hidden_layers=4, layer_types=KINDS * 2, intermediate_size=96, global_head_dim=32,
                   num_global_key_value_heads=1, attention_k_eq_v=True, final_logit_softcapping=30.0), 4001),
    "moe": (dict(num_hidden_layers=4, layer_types=KINDS * 2, intermediate_size=48, global_head_dim=32,
                 enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32,
                 final_logit_softcapping=30.0), 4002),
    "ple": (dict(num_hidden_layers=6, layer_types=KINDS * 3, intermediate_size=48, global_head_dim=32,
                 hidden_size_per_layer_input=16, num_kv_shared_layers=2,
                 use_double_wide_mlp=True, final_logit_softcapping=30.0), 4003),
}
PUBLISHED = ("dense", "ple")  # written as Gemma4ForConditionalGeneration's checkpoints are


def randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        tensors = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers()
                                                    if n.endswith("layer_scalar")]
        for name, p in tensors:
            if "norm" in name or name.endswith(("router.scale", "per_expert_scale", "layer_scalar")):
                w = 1.0 + 0.3 * torch.randn(p.shape, generator=g)  # factors as stored (no 1 + w)
            elif "embed" in name or "lm_head" in name:
                w = torch.randn(p.shape, generator=g)
            else:
                fan_in = p.shape[-1]
                w = torch.randn(p.shape, generator=g) * (1.5 / fan_in ** 0.5)
            p.copy_(w.to(torch.bfloat16).to(torch.float32))



def attempt(name: str, seed: int):
    extra, _ = FIXTURES[name]
    cfg = transformers.Gemma4TextConfig(**{**COMMON, **extra}, attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.Gemma4ForCausalLM(cfg).float().eval()
    randomize(model, seed)
    tokens, logits, top2 = greedy_run(model, seed, VOCAB, N_PROMPT, N_GEN)
    return model, tokens, logits, top2


def published(model, d: Path, name: str, seed: int) -> None:
    """The checkpoint as Google's are published: Gemma4ForConditionalGeneration's config.json (the
    text model's keys under text_config, the full-attention layers' dims as global_head_dim and
    num_global_key_value_heads) and its weights under model.language_model; a shared layer's
    files still hold k_proj, v_proj and k_norm."""
    extra, _ = FIXTURES[name]
    text = {"model_type": "gemma4_text", **COMMON, **extra}
    text.pop("tie_word_embeddings")
    doc = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
           "vision_config": None, "audio_config": None, "tie_word_embeddings": True,
           "transformers_version": transformers.__version__}
    (d / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    tensors = {"model.language_model." + n[len("model."):]: t.to(torch.bfloat16).contiguous()
               for n, t in model.state_dict().items() if n.startswith("model.")}
    g = torch.Generator().manual_seed(seed)
    n, shared = extra["num_hidden_layers"], extra.get("num_kv_shared_layers", 0)
    for i in range(n - shared, n):
        full = extra["layer_types"][i] == "full_attention"
        hd = extra["global_head_dim"] if full else COMMON["head_dim"]
        p = f"model.language_model.layers.{i}.self_attn."
        for proj in ("k_proj", "v_proj"):
            tensors[p + proj + ".weight"] = torch.randn((COMMON["num_key_value_heads"] * hd, COMMON["hidden_size"]),
                                                        generator=g).to(torch.bfloat16)
        tensors[p + "k_norm.weight"] = torch.ones(hd, dtype=torch.bfloat16)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


def build(out: Path, name: str) -> None:
    seed = FIXTURES[name][1]
    while True:
        model, tokens, logits, top2 = attempt(name, seed)
        if (top2[:, 1] - top2[:, 0])[N_PROMPT - 1:].min() >= MIN_MARGIN:
            break
        seed += 1000
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    if name in PUBLISHED:
        published(model, d, name, seed)
    else:
        model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
        (d / "generation_config.json").unlink(missing_ok=True)
    np.savez_compressed(d / "golden.npz", tokens=np.array(tokens, np.int32), n_prompt=N_PROMPT,
                        logits=logits.astype(np.float32), margin=(top2[:, 1] - top2[:, 0]).astype(np.float32))
    print(f"{name}: seed {seed}, {sum(f.stat().st_size for f in d.iterdir())} bytes, largest |logit| "
          f"{float(np.abs(logits).max()):.2f}, smallest greedy margin "
          f"{float((top2[:, 1] - top2[:, 0])[N_PROMPT - 1:].min()):.3f}, transformers {transformers.__version__}")


if __name__ == "__main__":
    outdir = Path(sys.argv[1])
    for fixture in FIXTURES:
        build(outdir, fixture)
