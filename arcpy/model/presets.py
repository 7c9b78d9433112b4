"""Named model shapes with deterministic random weights: the embedded default and the benchmark models."""

from __future__ import annotations

import dataclasses
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from arcpy.errors import InvalidArgumentError
from arcpy.model.bf16 import f32_to_bf16
from arcpy.model.config import EMBED, FINAL_NORM, ModelConfig, RopeScaling, expected_tensors
from arcpy.model.tensors import Model

SHAPES: dict[str, ModelConfig] = {
    # The llama2.c "stories" shapes, with random weights instead of the trained ones.
    "stories15M": ModelConfig(dim=288, n_layers=6, n_heads=6, n_kv_heads=6, head_dim=48, ffn_dim=768,
                              vocab=32000, max_seq=1024, tied_embeddings=True),
    "stories110M": ModelConfig(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, head_dim=64, ffn_dim=2048,
                               vocab=32000, max_seq=1024, tied_embeddings=True),
    # The SmolLM2-135M shape: deep and narrow, GQA 9/3, tied.
    "smollm2-135M": ModelConfig(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, ffn_dim=1536,
                                vocab=49152, max_seq=2048, rms_eps=1e-5, rope_theta=100000.0,
                                tied_embeddings=True),
    # Llama 3 style: grouped-query attention, large theta, frequency scaling, untied head.
    "gqa": ModelConfig(dim=2048, n_layers=2, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=5632,
                       vocab=32000, max_seq=4096, rope_theta=500000.0,
                       rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192)),
    # The Llama-3.2-1B shape (16 layers, GQA 32/8, vocab 128256, tied), for benchmarks.
    "llama1B": ModelConfig(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=8192,
                           vocab=128256, max_seq=4096, rope_theta=500000.0,
                           rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192), tied_embeddings=True),
    # The Llama-3-8B shape (32 layers, GQA 32/8, untied): 16 GB of bf16, for benchmarks.
    "llama8B": ModelConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=14336,
                           vocab=128256, max_seq=8192, rms_eps=1e-5, rope_theta=500000.0,
                           rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192)),
    # Qwen2 style: q/k/v biases, large theta; small enough for fast tests.
    "qwen-tiny": ModelConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=384,
                             vocab=512, max_seq=512, rms_eps=1e-6, rope_theta=1000000.0, qkv_bias=True),
}

_EMBED_STD = 0.5
# q and k at twice unit scale give scores of std ~4: attention picks out a few positions, so the
# next token depends on the context, not only on the current token.
_QK_GAIN = 2.0


def _random_tensor(tname: str, shape: tuple[int, ...], seed: np.random.SeedSequence) -> np.ndarray:
    # The float32 values live only inside this call: a model's worth of them never exists at once.
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape, dtype=np.float32)
    if tname.endswith("norm.weight"):
        x = np.float32(1.0) + np.float32(0.05) * x
        if tname == FINAL_NORM:
            # With a tied head the residual still holds the current token's embedding, whose
            # logit e.(e*w) would win every step and repeat the token forever. Random signs
            # in the final norm make that self-score zero-mean; magnitudes stay near 1.
            x *= np.where(rng.random(shape) < 0.5, np.float32(-1.0), np.float32(1.0))
    elif tname.endswith(".bias"):
        x *= np.float32(0.1)
    elif tname == EMBED:
        x *= np.float32(_EMBED_STD)
    else:
        gain = _QK_GAIN if tname.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
        x *= np.float32(gain / math.sqrt(shape[1]))  # 1/sqrt(fan_in): unit-variance outputs
    return f32_to_bf16(x)


def random_model(cfg: ModelConfig, seed: int = 0, name: str = "random") -> Model:
    """Deterministic random weights for `cfg` (same seed, same words), scaled to keep activations O(1).

    Each tensor has its own child seed, so the tensors are made in parallel threads; each is drawn
    in float32 and rounded on its own, so host memory peaks near the bf16 model plus a float32
    copy of the tensors in flight.
    """
    shapes = expected_tensors(cfg)
    seeds = np.random.SeedSequence(seed).spawn(len(shapes))
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        arrays = pool.map(_random_tensor, shapes.keys(), shapes.values(), seeds)
        tensors = dict(zip(shapes.keys(), arrays))
    return Model(cfg, tensors, name=name, source=f"random:{name}:seed={seed}")


def synthetic_model(shape: str = "stories15M", seed: int = 0, max_seq: int | None = None) -> Model:
    """A preset of SHAPES with random weights, built in memory (the embedded default is stories15M)."""
    if shape not in SHAPES:
        raise InvalidArgumentError(f"unknown synthetic shape {shape!r} (choose from {', '.join(SHAPES)})")
    cfg = SHAPES[shape]
    if max_seq is not None:
        cfg = dataclasses.replace(cfg, max_seq=max_seq)
    return random_model(cfg, seed=seed, name=shape)
