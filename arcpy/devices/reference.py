"""The NumPy float32 forward: the oracle the CUDA kernels are tested against, and the CPU backend.

Numerics contract (libarc's kernels follow the same rules; differences are only summation order
and the last ulp of cos/sin/exp):
- Weights are bf16, converted exactly to float32, or quantized (arc.h's formats), dequantized once
  to float32 by arc.h's formulas (model.quant.dequantize). Activations stay float32: the residual
  stream, the normed input, q/k/v, scores and probabilities, the MLP and the logits. (libarc's
  quantized GEMVs also quantize their input to int8 per 32 values; model.quant.qgemv_reference
  computes that product alone. The forward here does not: compare with a tolerance.)
- The KV cache is bf16: k (after RoPE) and v are rounded to nearest even when stored and read back
  exactly as float32. Here it is held as float32 arrays of bf16-representable values (or of another
  form's values: kv_formats.py).
- RMSNorm: y = x * (1 / sqrt(mean(x*x) + eps)) * w.
- RoPE, rotate-half convention (as Hugging Face Llama): element i of a head pairs with element
  i + head_dim/2, both rotated by angle = float32(pos) * inv_freq[i], cos and sin in float32.
- Attention: scores = q.k / sqrt(head_dim) over positions 0..pos inclusive, softmax (max
  subtracted), then the weighted sum of v. Query head h reads kv head h // (n_heads // n_kv_heads).
- Optional q/k/v biases are added after the projection, before RoPE.
- MLP: down(silu(gate(x)) * up(x)), silu(g) = g / (1 + exp(-g)).
- A mixture of experts' layer (arc.h: ARC_OP_MOE_IN, ARC_OP_MOE_OUT): router logits = router @ n,
  routed as model.moe.route says (the order of softmax and top-k, ties to the lower expert); each
  chosen expert's GLU down-projected, times its weight, summed over the k in order of choice; plus
  the shared expert's GLU times sigmoid(its router's logit) where the config has one.
- gpt-oss's layer (arcpy/model/gpt_oss.py) in the same ops: ATTEND adds each query head's
  exp(sink) to its softmax's denominator (the maximum subtracted is the larger of the scores' and
  the sink); ATTN_OUT adds o_proj's bias; MOE_IN and MOE_OUT add the router's and the experts'
  biases to their products; every GLU is the clamped one where swiglu_limit is set.
- logits = lm_head @ rmsnorm(x, final_norm); greedy picks the first index of the maximum.
- Prefill (a chunk of positions per pass, libarc's arc_model_prefill): the same per position, but
  every matrix product runs on bf16 inputs with float32 sums: the normed inputs, the rotated q,
  the attention probabilities (unnormalized; the sum is divided out after the product with v) and
  output, and the SwiGLU output are rounded to bf16 first; the residual stream stays float32.
  Quantized weights enter those products rounded to bf16 (what arc_op_dequantize gives them).
  ReferenceModel.prefill(..., bf16_products=True) computes exactly that.
- Gemma 4 (arcpy/model/gemma4.py states its layer): its rows' ops are arcpy/devices/gemma4.py's;
  its KV cache holds every layer at the larger of the two layer kinds' kv heads and head width;
  its logits soft-capped, cap * tanh(logits / cap).
"""

from __future__ import annotations

import copy

import numpy as np

from arcpy.devices.deltanet import DeltaNetState
from arcpy.devices.kv_formats import check_kv_form, kv_round
from arcpy.devices.reference_layer import (
    PRODUCT_WEIGHTS,
    Layer,
    norm_factors,
    weights_f32,
)
from arcpy.devices.reference_ops import (
    F32,
    _exact,
    _is_int,
    _RowOps,
    argmax,
    gemv,
    rmsnorm,
    round_bf16,
)
from arcpy.errors import InvalidArgumentError
from arcpy.model import EMBED, FINAL_NORM, Model, bf16_to_f32
from arcpy.model.gemma4 import cache_dims
from arcpy.model.native import layer_program


class ReferenceModel:
    """A Model ready to run on the CPU: float32 weights, a preallocated bf16-valued KV cache.

    `max_seq` may shorten the cache below the config's context; positions must stay below it.
    `kv_cache`: the form its rows are held in (kv_formats.py; bf16, libarc's, by default).
    """

    def __init__(self, model: Model, max_seq: int | None = None, kv_cache: str = "bf16"):
        cfg = model.config
        if max_seq is not None and not (isinstance(max_seq, (int, np.integer)) and not isinstance(max_seq, bool)
                                        and 0 < max_seq <= cfg.max_seq):
            raise InvalidArgumentError(f"max_seq must be in 1..{cfg.max_seq}, got {max_seq!r}")
        self.config = cfg
        self.max_seq = int(max_seq or cfg.max_seq)
        self.embed = bf16_to_f32(model.tensor(EMBED))
        # A tied head is the same table: share the array rather than convert it twice.
        self.lm_head = self.embed if cfg.tied_embeddings else weights_f32(model.lm_head())
        self.final_norm = norm_factors(model, FINAL_NORM)
        layer, self._rows, self.per_layer_inputs = Layer, _RowOps, None
        if cfg.gemma4_layer:  # its layer's weights, ops and per-layer inputs (arcpy/devices/gemma4.py)
            from arcpy.devices.gemma4 import Gemma4Layer, Gemma4Rows, PerLayerInputs
            layer, self._rows = Gemma4Layer, Gemma4Rows
            self.per_layer_inputs = PerLayerInputs(model) if cfg.ple_dim else None
        self.layers = [layer(model, i) for i in range(cfg.n_layers)]
        self.programs = [layer_program(cfg, i) for i in range(cfg.n_layers)]
        self.routing: dict[int, np.ndarray] = {}  # MoE layer -> the last rows' chosen experts (T, k)
        self.route_gap: dict[int, float] = {}  # MoE layer -> its last rows' smallest lead of a choice
        self.quantized = model.quantized
        self._bf16_layers: list[Layer] | None = None  # quantized weights rounded to bf16, made on first use
        kv_heads, head_dim = cache_dims(cfg)  # a Gemma 4 layer's own dims fill what they need of it
        check_kv_form(kv_cache, head_dim)
        shape = (cfg.n_layers, kv_heads, self.max_seq, head_dim)
        self.k_cache = np.zeros(shape, dtype=F32)
        self.v_cache = np.zeros(shape, dtype=F32)
        self.kv_round = kv_round(kv_cache)  # what a stored row reads back
        # Each DeltaNet layer's recurrent state (arcpy.model.hybrid): the positions it has taken in.
        self.deltanet_state = {i: DeltaNetState(cfg) for i in range(cfg.n_layers) if cfg.is_linear_layer(i)}

    def reset(self) -> None:
        """Forget every cached position."""
        self.k_cache.fill(0.0)
        self.v_cache.fill(0.0)
        for state in self.deltanet_state.values():
            state.reset()

    def forward(self, token: int, pos: int, logits: bool = True) -> np.ndarray | None:
        """Run `token` at position `pos` -> logits (vocab,) f32. Writes k/v at `pos`; reads 0..pos.
        With logits=False only the KV cache is filled (a prompt position nobody samples)."""
        cfg = self.config
        self._check_token(token)
        if not _is_int(pos) or not 0 <= pos < self.max_seq:
            raise InvalidArgumentError(f"position {pos!r} out of range 0..{self.max_seq - 1}")
        x = self._run_rows([int(token)], int(pos), self.layers, _exact)[0]
        if not logits:
            return None
        return self._capped(gemv(self.lm_head, rmsnorm(x, self.final_norm, cfg.rms_eps)))

    def _capped(self, logits: np.ndarray) -> np.ndarray:
        """The logits, soft-capped where the config caps them: cap * tanh(logits / cap)."""
        cap = self.config.final_softcap
        return np.tanh(logits / F32(cap)) * F32(cap) if cap else logits

    def _check_token(self, token) -> None:
        if not _is_int(token) or not 0 <= token < self.config.vocab:
            raise InvalidArgumentError(f"token {token!r} out of range 0..{self.config.vocab - 1}")

    def prefill(self, tokens: list[int], start: int = 0, chunk: int | None = None,
                bf16_products: bool = False, every_row: bool = False, progress=None) -> np.ndarray:
        """Run `tokens` at positions start..start+len-1 -> the logits of the last (vocab,) f32, or
        with every_row those of every token (len, vocab), each as the last's.

        Writes k/v at every position, as forward() one token at a time would; the tokens of a chunk
        (`chunk` at a time, all at once by default) go through each layer together, each chunk
        attending to the cache the earlier ones wrote. Only summation order differs from forward().
        bf16_products: round what enters each matrix product to bf16 as libarc's tensor-core
        prefill does (the normed inputs, the rotated q, the attention probabilities and output,
        the SwiGLU output); the residual stream and every sum stay float32. `progress(done, total)`,
        where given, is called with the chunks done before the first and after each.
        """
        tokens = list(tokens)
        if not tokens:
            raise InvalidArgumentError("tokens must hold at least one token")
        for tok in tokens:
            self._check_token(tok)
        if not _is_int(start) or start < 0 or start + len(tokens) > self.max_seq:
            raise InvalidArgumentError(f"{len(tokens)} tokens from position {start!r} exceed max_seq {self.max_seq}")
        if chunk is not None and (not _is_int(chunk) or chunk < 1):
            raise InvalidArgumentError(f"chunk must be a positive integer, got {chunk!r}")
        step = int(chunk) if chunk is not None else len(tokens)
        offsets = range(0, len(tokens), step)
        xs = []
        for done, off in enumerate(offsets):
            if progress is not None:
                progress(done, len(offsets))
            xs.append(self._prefill_chunk([int(t) for t in tokens[off:off + step]], int(start) + off, bf16_products))
        if progress is not None:
            progress(len(offsets), len(offsets))
        rows = np.concatenate(xs) if every_row else xs[-1][-1:]
        logits = np.stack([self._capped(gemv(self.lm_head, rmsnorm(x, self.final_norm, self.config.rms_eps)))
                           for x in rows])
        return logits if every_row else logits[0]

    def _product_layers(self, bf16_products: bool) -> list[Layer]:
        """The layers whose weights the prefill's products read: with bf16 products, a quantized
        model's matrices rounded to bf16 (bf16 weights are already), made once."""
        if not (bf16_products and self.quantized):
            return self.layers
        if self._bf16_layers is None:
            self._bf16_layers = []
            for layer in self.layers:
                rounded = copy.copy(layer)
                for name in PRODUCT_WEIGHTS:
                    if hasattr(layer, name):
                        setattr(rounded, name, round_bf16(getattr(layer, name)))
                self._bf16_layers.append(rounded)
        return self._bf16_layers

    def _prefill_chunk(self, tokens: list[int], start: int, bf16_products: bool) -> np.ndarray:
        """The chunk's tokens through every layer -> their residual streams (T, dim) f32."""
        return self._run_rows(tokens, start, self._product_layers(bf16_products),
                              round_bf16 if bf16_products else _exact)

    def _run_rows(self, tokens: list[int], start: int, layers: list[Layer], r) -> np.ndarray:
        """Rows of tokens at positions start.. through every layer's program (libarc's
        arc_layer_program, the one the CUDA forwards run) -> their residual streams (T, dim) f32.
        `r` is applied to what enters a matrix product (bf16 rounding for the prefill's form)."""
        ops = self._rows(self, tokens, start, r)
        for li, L in enumerate(layers):
            for op in self.programs[li]:
                ops.run(op, li, L)
        return ops.x

    def greedy(self, prompt: list[int], n_new: int, start_pos: int = 0) -> list[int]:
        """Feed `prompt` from `start_pos`, then pick `n_new` tokens greedily; returns the new tokens."""
        if not prompt:
            raise InvalidArgumentError("prompt must hold at least one token")
        if n_new < 0 or start_pos + len(prompt) + max(n_new - 1, 0) > self.max_seq:
            raise InvalidArgumentError(f"prompt of {len(prompt)} + {n_new} new tokens from position "
                                       f"{start_pos} exceeds max_seq {self.max_seq}")
        pos = start_pos
        for tok in prompt:
            logits = self.forward(tok, pos)
            pos += 1
        out: list[int] = []
        for _ in range(n_new):
            out.append(argmax(logits))
            if len(out) < n_new:
                logits = self.forward(out[-1], pos)
                pos += 1
        return out
