"""The shape and numerics of a decoder of the Llama family and its kin (the layer program's data)
and its RoPE frequencies; its tensor table is libarc's (native.py)."""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass
import numpy as np

from arcpy.checks import is_finite_real, is_int, is_real, quoted, require
from arcpy.codes import ACTIVATIONS, ROUTINGS
from arcpy.model.gpt_oss import check_gpt_oss
from arcpy.model.gemma4 import check_gemma4, inv_freq_exponents, row_tables
from arcpy.model.hybrid import LINEAR, check_hybrid
from arcpy.model.moe import EXPERT_SUFFIXES
from arcpy.model.native import EMBED, expected_tensors

_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32
INT32_LIMIT = 2**31  # sizes, token ids and positions travel as int32 on the device
_MAX_DENSE_LISTED = 128  # arc_model_config's dense_layers mask holds layers 0..127


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
        require(is_int(orig) and 0 < orig < INT32_LIMIT,
                f"rope_scaling.original_max_position_embeddings must be a positive int32, got {quoted(orig)}")


@dataclass(frozen=True)
class LinearScaling:
    """Positions slowed by `factor` ("rope_type": "linear"): every frequency divided by it."""

    factor: float

    def __post_init__(self) -> None:
        require(is_finite_real(self.factor) and self.factor > 0,
                f"rope_scaling.factor must be a finite number > 0, got {quoted(self.factor)}")


@dataclass(frozen=True)
class YarnScaling:
    """YaRN ("rope_type": "yarn"): frequencies blended between interpolated (divided by `factor`)
    and kept, by a linear ramp over the pairs whose wavelengths fall between beta_fast and
    beta_slow rotations of the original context; cos and sin times `attention_factor`."""

    factor: float
    original_max_position_embeddings: int
    attention_factor: float
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True

    def __post_init__(self) -> None:
        for field in ("factor", "attention_factor", "beta_fast", "beta_slow"):
            v = getattr(self, field)
            require(is_finite_real(v) and v > 0, f"rope_scaling.{field} must be a finite number > 0, got {quoted(v)}")
        orig = self.original_max_position_embeddings
        require(is_int(orig) and 0 < orig < INT32_LIMIT,
                f"rope_scaling.original_max_position_embeddings must be a positive int32, got {quoted(orig)}")
        require(isinstance(self.truncate, bool), "rope_scaling.truncate must be true or false")


@dataclass(frozen=True)
class LongRopeScaling:
    """LongRoPE ("rope_type": "longrope", Phi-3 and Phi-4): pair i's frequency divided by a factor
    of its own, cos and sin times `attention_factor`. A model whose context (max_seq) exceeds the
    original one takes the long factors, else the short ones: chosen once, by the context."""

    short_factors: tuple[float, ...]
    long_factors: tuple[float, ...]
    original_max_position_embeddings: int
    attention_factor: float

    def __post_init__(self) -> None:
        for field in ("short_factors", "long_factors"):
            v = getattr(self, field)
            require(isinstance(v, tuple) and v and all(is_finite_real(f) and f > 0 for f in v),
                    f"rope_scaling.{field} must be a non-empty list of finite numbers > 0")
        require(len(self.short_factors) == len(self.long_factors),
                "rope_scaling's short and long factors must be as many")
        orig = self.original_max_position_embeddings
        require(is_int(orig) and 0 < orig < INT32_LIMIT,
                f"rope_scaling.original_max_position_embeddings must be a positive int32, got {quoted(orig)}")
        require(is_finite_real(self.attention_factor) and self.attention_factor > 0,
                f"rope_scaling.attention_factor must be a finite number > 0, got {quoted(self.attention_factor)}")

    def factors(self, max_seq: int) -> tuple[float, ...]:
        return self.long_factors if max_seq > self.original_max_position_embeddings else self.short_factors


Scaling = RopeScaling | LinearScaling | YarnScaling | LongRopeScaling


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder. Invariants are checked on construction."""

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
    rope_scaling: Scaling | None = None
    tied_embeddings: bool = False
    qkv_bias: bool = False
    # The layer program's data (libarc/arc.h documents each): q and k heads RMS-normed before RoPE;
    # RoPE over the first rope_dim elements of a head (0: all of them); layers without RoPE.
    qk_norm: bool = False
    rope_dim: int = 0
    no_rope_layers: tuple[int, ...] = ()
    # Gemma 3's: the attention's and the FFN's outputs RMS-normed before their residual adds; the
    # GLU's activation ("silu" or "gelu_tanh"); the embedding rows' factor; the scores' factor (None:
    # 1/sqrt(head_dim)); a window of positions for the layers it applies to (every one, or all but
    # every window_pattern-th), whose RoPE base is rope_local_theta, unscaled, where that is set;
    # norms whose factor is 1 + w, their weights w stored less one (as Gemma's safetensors hold them).
    post_norms: bool = False
    activation: str = "silu"
    embed_scale: float = 1.0
    attn_scale: float | None = None
    sliding_window: int = 0
    window_pattern: int = 0
    rope_local_theta: float | None = None
    norm_plus_one: bool = False
    # A mixture of experts (n_experts 0: none; libarc/arc.h's arc_model_config documents each field):
    # the experts, those a token uses, an expert's GLU width, the routing ("softmax_topk": softmax
    # over all experts, then the top k, divided by their sum with norm_topk_prob, Qwen3-MoE's;
    # "topk_softmax": the top k logits, then their softmax, Mixtral's), a shared expert's width
    # (Qwen2-MoE's; 0: none), and the layers that keep the dense FFN: all but every moe_every-th
    # (decoder_sparse_step), and those mlp_only_layers lists.
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn_dim: int = 0
    routing: str = "softmax_topk"
    norm_topk_prob: bool = False
    shared_expert_ffn_dim: int = 0
    moe_every: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # Gemma 4's layer (arcpy/model/gemma4.py documents it): its v norms, layer scalars and experts
    # beside the dense FFN; its full-attention layers' head width and kv heads (0: as the others')
    # and the elements of their heads proportional RoPE turns (0: all); their v the k projection's;
    # the logits' tanh cap (0: none); per-layer embeddings of ple_dim from a table of ple_vocab rows;
    # the last kv_shared_layers layers reading an earlier layer's K/V, their FFN twice as wide with
    # double_wide_mlp.
    gemma4_layer: bool = False
    global_head_dim: int = 0
    global_n_kv_heads: int = 0
    global_rope_dim: int = 0
    k_eq_v: bool = False
    final_softcap: float = 0.0
    ple_dim: int = 0
    ple_vocab: int = 0
    kv_shared_layers: int = 0
    double_wide_mlp: bool = False
    # A hybrid of attention and gated DeltaNet layers (Qwen3.5; arcpy/model/hybrid.py documents it):
    # each layer's kind ("full_attention" or "linear_attention"; empty: every layer attends), the
    # DeltaNet's key and value heads, their widths and its causal convolution's kernel; and a sigmoid
    # gate on the attention's output, its rows after each query head's in q_proj.
    layer_types: tuple[str, ...] = ()
    linear_n_k_heads: int = 0
    linear_n_v_heads: int = 0
    linear_k_head_dim: int = 0
    linear_v_head_dim: int = 0
    linear_conv_kernel: int = 0
    attn_output_gate: bool = False
    # gpt-oss's layer (arcpy/model/gpt_oss.py documents it): a learned sink logit per query head in
    # the attention's softmax; o_proj's bias; biases on the router and the experts; the experts'
    # clamped GLU (swiglu_limit > 0: min(gate, limit) and up clamped to +-limit, then
    # gate * sigmoid(swiglu_alpha * gate) * (up + 1); 0: the activation's plain GLU).
    attn_sinks: bool = False
    o_bias: bool = False
    expert_bias: bool = False
    swiglu_limit: float = 0.0
    swiglu_alpha: float = 0.0

    def __post_init__(self) -> None:
        for field in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab", "max_seq"):
            v = getattr(self, field)
            require(is_int(v) and 0 < v < INT32_LIMIT, f"ModelConfig.{field} must be a positive int32, got {quoted(v)}")
        require(self.n_heads % self.n_kv_heads == 0,
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        require(self.head_dim % 2 == 0, f"head_dim must be even for RoPE, got {self.head_dim}")
        eps = self.rms_eps
        # The kernels add eps in float32: it must stay a positive, finite float32 there.
        require(is_real(eps) and 0 < eps < 1 and np.float32(eps) > 0,
                f"rms_eps must be a number in (0, 1) that float32 keeps non-zero, got {quoted(eps)}")
        require(self.rope_scaling is None or isinstance(self.rope_scaling, Scaling),
                f"rope_scaling must be None or a scaling of config.py, got {type(self.rope_scaling).__name__}")
        rd = self.rope_dim
        require(is_int(rd) and 0 <= rd <= self.head_dim and rd % 2 == 0,
                f"rope_dim must be even and in 0..head_dim ({self.head_dim}), got {quoted(rd)}")
        if isinstance(self.rope_scaling, LongRopeScaling):
            require(len(self.rope_scaling.short_factors) == self.rotary_dim // 2,
                    f"rope_scaling has {len(self.rope_scaling.short_factors)} factors, the rotation "
                    f"{self.rotary_dim // 2} pairs")
        nr = self.no_rope_layers
        require(isinstance(nr, tuple) and all(is_int(i) and 0 <= i < self.n_layers for i in nr)
                and list(nr) == sorted(set(nr)),
                f"no_rope_layers must be ascending distinct layer indices below {self.n_layers}, got {quoted(nr)}")
        # libarc multiplies every layer's q and k by the RoPE factor, a layer without RoPE's too.
        require(not nr or float(getattr(self.rope_scaling, "attention_factor", 1.0)) == 1.0,
                "layers without RoPE and a RoPE scaling with an attention factor (YaRN, LongRoPE) are not "
                "supported together")
        theta = self.rope_theta
        # A base at or below 1 would make later pairs rotate as fast or faster than the first.
        require(is_finite_real(theta) and theta > 1,
                f"rope_theta must be a finite number > 1, got {quoted(theta)}")
        require(_rope_in_float32_range(float(theta), self.rotary_dim, self.rope_scaling),
                f"rope_theta {quoted(theta)} with head_dim {self.head_dim} and this scaling gives "
                "frequencies float32 cannot hold")
        require(isinstance(self.tied_embeddings, bool) and isinstance(self.qkv_bias, bool)
                and isinstance(self.qk_norm, bool) and isinstance(self.post_norms, bool)
                and isinstance(self.norm_plus_one, bool),
                "tied_embeddings, qkv_bias, qk_norm, post_norms and norm_plus_one must be bool")
        require(self.activation in ACTIVATIONS,
                f"activation must be one of {', '.join(ACTIVATIONS)}, got {quoted(self.activation)}")
        for field in ("embed_scale",) + (("attn_scale",) if self.attn_scale is not None else ()):
            v = getattr(self, field)
            require(is_finite_real(v) and 0 < v < _F32_MAX, f"{field} must be a finite number > 0, got {quoted(v)}")
        for field in ("sliding_window", "window_pattern"):
            v = getattr(self, field)
            require(is_int(v) and 0 <= v < INT32_LIMIT, f"{field} must be a non-negative int32, got {quoted(v)}")
        local = self.rope_local_theta
        require(local is None or (is_finite_real(local) and local > 1
                                  and _rope_in_float32_range(float(local), self.rotary_dim, None)),
                f"rope_local_theta must be None or a finite number > 1, got {quoted(local)}")
        check_gemma4(self)
        self._check_experts()
        check_hybrid(self)
        check_gpt_oss(self)

    def _check_experts(self) -> None:
        for field in ("n_experts", "n_experts_used", "expert_ffn_dim", "shared_expert_ffn_dim", "moe_every"):
            v = getattr(self, field)
            require(is_int(v) and 0 <= v < INT32_LIMIT, f"{field} must be a non-negative int32, got {quoted(v)}")
        require(self.routing in ROUTINGS, f"routing must be one of {', '.join(ROUTINGS)}, got {quoted(self.routing)}")
        require(isinstance(self.norm_topk_prob, bool), "norm_topk_prob must be bool")
        dense = self.mlp_only_layers
        require(isinstance(dense, tuple) and all(is_int(i) and 0 <= i < min(self.n_layers, _MAX_DENSE_LISTED)
                                                 for i in dense) and list(dense) == sorted(set(dense)),
                f"mlp_only_layers must be ascending distinct layer indices below {min(self.n_layers, _MAX_DENSE_LISTED)}"
                f", got {quoted(dense)}")
        if self.n_experts == 0:
            require(not (self.n_experts_used or self.expert_ffn_dim or self.shared_expert_ffn_dim or dense),
                    "n_experts_used, expert_ffn_dim, shared_expert_ffn_dim and mlp_only_layers need n_experts > 0")
            return
        require(1 <= self.n_experts_used <= self.n_experts,
                f"n_experts_used must be in 1..n_experts ({self.n_experts}), got {self.n_experts_used}")
        require(self.expert_ffn_dim > 0, "expert_ffn_dim must be positive in a mixture of experts")
        require(not self.post_norms or self.gemma4_layer, "post_norms and mixture-of-experts layers do not combine")

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer `layer`'s FFN is the mixture of experts (else the dense GLU of ffn_dim)."""
        every = self.moe_every or 1
        return self.n_experts > 0 and (layer + 1) % every == 0 and layer not in self.mlp_only_layers

    def is_linear_layer(self, layer: int) -> bool:
        """Whether layer `layer` is a gated DeltaNet layer (else it attends)."""
        return bool(self.layer_types) and self.layer_types[layer] == LINEAR

    @property
    def kv_layers(self) -> int:
        """The layers that keep KV rows: those that attend (a DeltaNet layer keeps a state instead)."""
        return sum(not self.is_linear_layer(layer) for layer in range(self.n_layers))

    def window(self, layer: int) -> int:
        """The positions layer `layer`'s attention reads back from the current one (0: all)."""
        if self.sliding_window == 0:
            return 0
        n = self.window_pattern
        return 0 if n > 0 and layer % n == n - 1 else self.sliding_window

    @property
    def norm_add(self) -> float:
        """What every norm adds to its weights to make its factors: 1 with norm_plus_one, else 0."""
        return 1.0 if self.norm_plus_one else 0.0

    @property
    def scores_scale(self) -> float:
        """What q . k is multiplied by before the softmax."""
        return self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def rotary_dim(self) -> int:
        """The elements of a head RoPE rotates (the first ones; the rest pass unrotated)."""
        return self.rope_dim or self.head_dim

    @property
    def rope_attention_factor(self) -> float:
        """What cos and sin are multiplied by: YaRN's and LongRoPE's attention factor, else 1."""
        return float(getattr(self.rope_scaling, "attention_factor", 1.0))

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
        table only the token's row is read. When tied the table is the lm_head and counts once. Of a
        mixture of experts' layers only the n_experts_used experts a token is routed to are read.
        """
        n = sum(math.prod(s) * (self.n_experts_used / self.n_experts if name.endswith(EXPERT_SUFFIXES) else 1)
                for name, s in expected_tensors(self).items() if name != EMBED)
        n += self.dim if not self.tied_embeddings else self.vocab * self.dim
        n -= sum(math.prod(s) - s[1] for name, s in expected_tensors(self).items() if name in row_tables(self))
        return 2 * round(n)


def _rope_in_float32_range(theta: float, head_dim: int, rs: RopeScaling | None) -> bool:
    # With theta > 1 the unscaled frequencies fall from 1 (first pair) to their smallest at the
    # last pair, and Llama 3 scaling moves each one between f and f/factor: bounding those ends
    # bounds every frequency without computing head_dim/2 of them.
    lowest = theta ** (-(head_dim - 2) / head_dim)
    if isinstance(rs, LongRopeScaling):
        factors = (min(rs.short_factors + rs.long_factors), max(rs.short_factors + rs.long_factors))
    else:
        factors = (getattr(rs, "factor", 1.0),)
    return all(min(lowest, lowest / f) >= _F32_TINY and max(1.0, 1.0 / f) <= _F32_MAX for f in factors)


def rope_inv_freq(cfg: ModelConfig, layer: int = 0) -> np.ndarray:
    """Inverse frequencies of a layer (rotary_dim // 2,) float32: theta**(-2i/rotary_dim), scaled
    as the config's rope_scaling says; zeros for a layer without RoPE (its rotation is then the
    identity). Computed in float64, rounded once to float32.

    A windowed layer of a config with rope_local_theta takes that base, unscaled. Llama 3 rule: wavelengths longer than original/low_freq_factor are slowed by `factor`, those
    shorter than original/high_freq_factor are kept, and the band between blends the two linearly
    in original/wavelength. Linear: every frequency divided by factor. YaRN: pair i keeps its
    frequency by a weight ramping from 1 (pairs at or below the dimension where a wavelength makes
    beta_fast turns in the original context) to 0 (at or above beta_slow's), and takes freq/factor
    by the rest. LongRoPE: pair i's frequency divided by factor i (long or short by the context).
    """
    dim = cfg.rotary_dim
    if layer in cfg.no_rope_layers:
        return np.zeros(dim // 2, dtype=np.float32)
    proportional = inv_freq_exponents(cfg, layer)
    if proportional is not None:  # Gemma 4's global layers (arcpy/model/gemma4.py)
        turning, head_dim = proportional
        i = np.arange(head_dim // 2, dtype=np.float64)
        freq = np.where(i < turning, float(cfg.rope_theta) ** (-2.0 * i / head_dim), 0.0)
        return (freq / getattr(cfg.rope_scaling, "factor", 1.0)).astype(np.float32)
    i = np.arange(dim // 2, dtype=np.float64)
    local = cfg.rope_local_theta is not None and cfg.window(layer) > 0
    theta = float(cfg.rope_local_theta if local else cfg.rope_theta)
    freq = theta ** (-2.0 * i / dim)
    rs = None if local else cfg.rope_scaling
    if isinstance(rs, RopeScaling):
        orig = float(rs.original_max_position_embeddings)
        wavelen = 2.0 * math.pi / freq
        slow = wavelen > orig / rs.low_freq_factor
        fast = wavelen < orig / rs.high_freq_factor
        blend = (orig / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
        mixed = (1.0 - blend) * freq / rs.factor + blend * freq
        freq = np.where(slow, freq / rs.factor, np.where(fast, freq, mixed))
    elif isinstance(rs, LinearScaling):
        freq = freq / rs.factor
    elif isinstance(rs, YarnScaling):
        def at(turns: float) -> float:  # the (fractional) pair whose wavelength makes `turns` turns
            return dim * math.log(rs.original_max_position_embeddings / (turns * 2 * math.pi)) / (2 * math.log(theta))
        low, high = at(rs.beta_fast), at(rs.beta_slow)
        if rs.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        keep = 1.0 - np.clip((i - low) / (high - low), 0.0, 1.0)
        freq = freq / rs.factor * (1.0 - keep) + freq * keep
    elif isinstance(rs, LongRopeScaling):
        freq = freq / np.asarray(rs.factors(cfg.max_seq), dtype=np.float64)
    return freq.astype(np.float32)


def one_layer(cfg: ModelConfig, **changes) -> ModelConfig:
    """cfg with its first layer alone (and `changes`): what one layer's table is counted from."""
    changes.setdefault("mlp_only_layers", tuple(i for i in cfg.mlp_only_layers if i == 0))
    changes.setdefault("layer_types", cfg.layer_types[:1])
    changes.setdefault("kv_shared_layers", 0)  # layer 0 of a Gemma 4 config holds its own K/V
    changes.setdefault("double_wide_mlp", False)
    return dataclasses.replace(cfg, n_layers=1, no_rope_layers=tuple(i for i in cfg.no_rope_layers if i == 0),
                               **changes)
