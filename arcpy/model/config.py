"""The shape and numerics of a Llama-family decoder, its RoPE frequencies, and its tensor table."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from arcpy.checks import is_finite_real, is_int, is_real, quoted, require

_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32
_INT32_LIMIT = 2**31  # sizes, token ids and positions travel as int32 on the device


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 frequency scaling ("rope_type": "llama3" in config.json)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        for field in ("factor", "low_freq_factor", "high_freq_factor"):
            v = getattr(self, field)
            require(is_finite_real(v) and v > 0,
                    f"rope_scaling.{field} must be a finite number > 0, got {quoted(v)}")
        # The smooth band divides by (high - low); equal factors would leave it undefined.
        require(self.high_freq_factor > self.low_freq_factor,
                f"rope_scaling.high_freq_factor ({self.high_freq_factor}) must exceed "
                f"low_freq_factor ({self.low_freq_factor})")
        orig = self.original_max_position_embeddings
        require(is_int(orig) and 0 < orig < _INT32_LIMIT,
                f"rope_scaling.original_max_position_embeddings must be a positive int32, got {quoted(orig)}")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder. Invariants are checked on construction."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab: int
    max_seq: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tied_embeddings: bool = False
    qkv_bias: bool = False

    def __post_init__(self) -> None:
        for field in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab", "max_seq"):
            v = getattr(self, field)
            require(is_int(v) and 0 < v < _INT32_LIMIT, f"ModelConfig.{field} must be a positive int32, got {quoted(v)}")
        require(self.n_heads % self.n_kv_heads == 0,
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        require(self.head_dim % 2 == 0, f"head_dim must be even for RoPE, got {self.head_dim}")
        eps = self.rms_eps
        # The kernels add eps in float32: it must stay a positive, finite float32 there.
        require(is_real(eps) and 0 < eps < 1 and np.float32(eps) > 0,
                f"rms_eps must be a number in (0, 1) that float32 keeps non-zero, got {quoted(eps)}")
        require(self.rope_scaling is None or isinstance(self.rope_scaling, RopeScaling),
                f"rope_scaling must be None or RopeScaling, got {type(self.rope_scaling).__name__}")
        theta = self.rope_theta
        # A base at or below 1 would make later pairs rotate as fast or faster than the first.
        require(is_finite_real(theta) and theta > 1,
                f"rope_theta must be a finite number > 1, got {quoted(theta)}")
        require(_rope_in_float32_range(float(theta), self.head_dim, self.rope_scaling),
                f"rope_theta {quoted(theta)} with head_dim {self.head_dim} and this scaling gives "
                "frequencies float32 cannot hold")
        require(isinstance(self.tied_embeddings, bool) and isinstance(self.qkv_bias, bool),
                "tied_embeddings and qkv_bias must be bool")

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def n_params(self) -> int:
        """Number of stored weights (the embedding once when tied)."""
        return sum(math.prod(s) for s in expected_tensors(self).values())

    @property
    def weight_bytes(self) -> int:
        """bf16 bytes of weights streamed to decode one token: the bandwidth floor of a step, for
        a model held in bf16 throughout (Model.weight_bytes counts a model's own tensors).

        Every layer tensor, the final norm and the lm_head are read whole; of an untied embedding
        table only the token's row is read. When tied the table is the lm_head and counts once.
        """
        n = sum(math.prod(s) for name, s in expected_tensors(self).items() if name != EMBED)
        n += self.dim if not self.tied_embeddings else self.vocab * self.dim
        return 2 * n


def _rope_in_float32_range(theta: float, head_dim: int, rs: RopeScaling | None) -> bool:
    # With theta > 1 the unscaled frequencies fall from 1 (first pair) to their smallest at the
    # last pair, and Llama 3 scaling moves each one between f and f/factor: bounding those ends
    # bounds every frequency without computing head_dim/2 of them.
    lowest = theta ** (-(head_dim - 2) / head_dim)
    factor = rs.factor if rs is not None else 1.0
    return min(lowest, lowest / factor) >= _F32_TINY and max(1.0, 1.0 / factor) <= _F32_MAX


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies (head_dim//2,) float32: theta**(-2i/head_dim), Llama 3 scaled if configured.

    Llama 3 rule: wavelengths longer than original/low_freq_factor are slowed by `factor`, those
    shorter than original/high_freq_factor are kept, and the band between blends the two linearly
    in original/wavelength. Computed in float64, rounded once to float32.
    """
    i = np.arange(cfg.head_dim // 2, dtype=np.float64)
    freq = float(cfg.rope_theta) ** (-2.0 * i / cfg.head_dim)
    rs = cfg.rope_scaling
    if rs is not None:
        orig = float(rs.original_max_position_embeddings)
        wavelen = 2.0 * math.pi / freq
        slow = wavelen > orig / rs.low_freq_factor
        fast = wavelen < orig / rs.high_freq_factor
        blend = (orig / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
        mixed = (1.0 - blend) * freq / rs.factor + blend * freq
        freq = np.where(slow, freq / rs.factor, np.where(fast, freq, mixed))
    return freq.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# the tensor table: Hugging Face names and shapes

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"


def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."


def iter_tensors(cfg: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor a model of this config stores, (name, shape), in a fixed order.

    A generator, so a reader can stop at the first tensor a file lacks instead of first listing
    all of them for a config that claims a billion layers.
    """
    d, q, kv, f = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.ffn_dim
    yield EMBED, (cfg.vocab, d)
    for i in range(cfg.n_layers):
        p = layer_prefix(i)
        yield p + "input_layernorm.weight", (d,)
        yield p + "self_attn.q_proj.weight", (q, d)
        yield p + "self_attn.k_proj.weight", (kv, d)
        yield p + "self_attn.v_proj.weight", (kv, d)
        if cfg.qkv_bias:
            yield p + "self_attn.q_proj.bias", (q,)
            yield p + "self_attn.k_proj.bias", (kv,)
            yield p + "self_attn.v_proj.bias", (kv,)
        yield p + "self_attn.o_proj.weight", (d, q)
        yield p + "post_attention_layernorm.weight", (d,)
        yield p + "mlp.gate_proj.weight", (f, d)
        yield p + "mlp.up_proj.weight", (f, d)
        yield p + "mlp.down_proj.weight", (d, f)
    yield FINAL_NORM, (d,)
    if not cfg.tied_embeddings:
        yield LM_HEAD, (cfg.vocab, d)


# The matrix tensors: what the GEMVs read, and what may be held quantized (arc.h's arc_format).
_MATRIX_SUFFIXES = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def is_matrix(name: str) -> bool:
    """A per-layer projection or the lm_head: a tensor a quantized format may hold."""
    return name == LM_HEAD or (name.startswith("model.layers.") and name.endswith(_MATRIX_SUFFIXES))


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a model of this config stores, name -> shape, in a fixed order."""
    return dict(iter_tensors(cfg))
