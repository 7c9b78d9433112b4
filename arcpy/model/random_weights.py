"""Deterministic random weights for a config (the presets' and the tests'): each tensor drawn from its
own seed, scaled so that a model's activations stay near unit size, in bf16 or directly in one of
arc.h's quantized formats."""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from arcpy.codes import FORMAT_BF16
from arcpy.model.bf16 import f32_to_bf16
from arcpy.model.config import ModelConfig
from arcpy.model.gemma4 import SCALES as GEMMA4_SCALES
from arcpy.model.native import EMBED, FINAL_NORM, expected_tensors
from arcpy.model.quant_pack import random_quant
from arcpy.model.tensors import Model

_EMBED_STD = 0.5
# q and k at twice unit scale give scores of std ~4: attention picks out a few positions, so the
# next token depends on the context, not only on the current token.
_QK_GAIN = 2.0
_UNIFORM_SLICE = 1 << 20


def _uniform_bf16(shape: tuple[int, ...], rng: np.random.Generator, std: float) -> np.ndarray:
    """bf16 words of values uniform in [-std*sqrt(3), std*sqrt(3)] (root mean square `std`), made
    from random bits a slice at a time: several times faster than normal draws."""
    out = np.empty(math.prod(shape), np.uint16)
    scale = np.float32(std * math.sqrt(3.0) / 32768.0)
    for start in range(0, out.size, _UNIFORM_SLICE):
        n = min(_UNIFORM_SLICE, out.size - start)
        x = rng.bit_generator.random_raw(-(-n // 4)).view(np.int16)[:n].astype(np.float32)
        x *= scale
        out[start:start + n] = x.view(np.uint32) >> np.uint32(16)  # truncated to bf16: still uniform
    return out.reshape(shape)


def _random_tensor(tname: str, shape: tuple[int, ...], seed: np.random.SeedSequence, fmt: int = FORMAT_BF16,
                   quick_embedding: bool = False, norm_add: float = 0.0, scale: float = 1.0):
    # The float32 values live only inside this call: a model's worth of them never exists at once.
    rng = np.random.default_rng(seed)
    if fmt != FORMAT_BF16:  # drawn in the format's rows directly, at the std of the bf16 weights below
        gain = _QK_GAIN if tname.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
        return random_quant(fmt, shape, rng, std=gain * scale / math.sqrt(shape[1]))
    if tname == EMBED and quick_embedding:
        return _uniform_bf16(shape, rng, _EMBED_STD)
    x = rng.standard_normal(shape, dtype=np.float32)
    if tname.endswith("linear_attn.norm.weight"):  # a DeltaNet's gated norm: its factors as stored
        x = np.float32(1.0) + np.float32(0.05) * x
    elif tname.endswith(("A_log", "dt_bias")):  # a DeltaNet's decay: exp(A_log) near 1
        x *= np.float32(0.5)
    elif tname.endswith(GEMMA4_SCALES):  # Gemma 4's router scales and layer scalars: factors near 1
        x = np.float32(1.0) + np.float32(0.05) * x
    elif tname.endswith("norm.weight"):
        x = np.float32(1.0) + np.float32(0.05) * x
        if tname == FINAL_NORM:
            # With a tied head the residual still holds the current token's embedding, whose
            # logit e.(e*w) would win every step and repeat the token forever. Random signs
            # in the final norm make that self-score zero-mean; magnitudes stay near 1.
            x *= np.where(rng.random(shape) < 0.5, np.float32(-1.0), np.float32(1.0))
        x -= np.float32(norm_add)  # held less one where the norms add it back (norm_plus_one)
    elif tname.endswith(".bias"):
        x *= np.float32(0.1 * scale)
    elif tname == EMBED:
        x *= np.float32(_EMBED_STD)
    else:
        gain = _QK_GAIN if tname.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
        x *= np.float32(gain * scale / math.sqrt(shape[-1]))  # 1/sqrt(fan_in): unit-variance outputs
    return f32_to_bf16(x)


def random_model(cfg: ModelConfig, seed: int = 0, name: str = "random", formats: dict[str, int] | None = None,
                 scales: dict[str, float] | None = None) -> Model:
    """Deterministic random weights for `cfg` (same seed, same words), scaled to keep activations O(1).

    Each tensor has its own child seed, so the tensors are made in parallel threads; each is drawn
    in float32 and rounded on its own, so host memory peaks near the bf16 model plus a float32
    copy of the tensors in flight. `formats` (tensor name -> arc_format) makes those matrix
    tensors random QuantTensors instead, drawn in their rows directly (quant_pack.random_quant);
    the embedding of such a model is drawn uniform (same root mean square), from random bits,
    which is several times faster than normal draws (an 8B model's is half a billion weights).
    `scales` (a name's ending -> a factor) multiplies the spread of those matrices, biases or sinks.
    """
    shapes = expected_tensors(cfg)
    formats = formats or {}
    factors = [next((f for end, f in (scales or {}).items() if n.endswith(end)), 1.0) for n in shapes]
    seeds = np.random.SeedSequence(seed).spawn(len(shapes))
    fmts = [formats.get(n, FORMAT_BF16) for n in shapes]
    quick = [any(f != FORMAT_BF16 for f in formats.values())] * len(shapes)
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        arrays = pool.map(_random_tensor, shapes.keys(), shapes.values(), seeds, fmts, quick,
                          [cfg.norm_add] * len(shapes), factors)
        tensors = dict(zip(shapes.keys(), arrays))
    return Model(cfg, tensors, name=name, source=f"random:{name}:seed={seed}")
