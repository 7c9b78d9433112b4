"""CudaModel: an arc_model, libarc's Llama-family forward on a context (context.py's Context): the
weights uploaded under their arc_tensor ids (bf16 words, or a QuantTensor's rows in its arc_format),
the KV cache, the activations and the prefill's."""

from __future__ import annotations

import numpy as np

from arcpy import _lib
from arcpy.devices.context import Context
from arcpy.devices.kv_formats import check_kv_form, kv_position_bytes, libarc_form
from arcpy.errors import InvalidArgumentError, NoDeviceError
from arcpy.model import Model, QuantTensor, rope_inv_freq
from arcpy.model import gemma4
from arcpy.model.gpt_oss import cuda_refusal
from arcpy.model.hybrid import STATE_SLOTS, check_cuda, split_gate, state_bytes_per_token
from arcpy.model.native import native_config, place

# The longest run of prompt tokens one pass of the prefill takes; longer prompts go chunk by
# chunk, each reading all the weights again. Measured on the H200 (docs/PERF.md): 2,048 meets the
# time-to-first-token targets where 512 misses two; it reserves 101 MB of activations for the
# Llama-3.2-1B shape and 193 MB for Llama-3-8B.
PREFILL_CHUNK = 2048


def check_supported(cfg) -> None:
    """Refuses, before anything is allocated, what libarc's kernels do not take: DeltaNet heads of
    another size than its kernel's (arcpy/model/hybrid.py), a clamped GLU of other constants than
    gpt-oss's (arcpy/model/gpt_oss.py), what of Gemma 4 only the NumPy reference runs
    (arcpy/model/gemma4.py), one line."""
    check_cuda(cfg)
    refusal = cuda_refusal(cfg) or (gemma4.cuda_refusal(cfg) if cfg.gemma4_layer else "")
    if refusal:
        raise InvalidArgumentError(refusal)


def kv_heads(cfg) -> list[int]:
    """The head_dim of each kv head of each attention layer that keeps rows (not a Gemma 4 layer
    sharing an earlier one's), in the cache's order (arc_model_kv_planes: a Gemma 4 global layer's
    heads are wider): each a run of rows in every plane."""
    return [hd for layer in range(cfg.n_layers) if not cfg.is_linear_layer(layer) and gemma4.kv_source(cfg, layer) == layer
            for hd, n in [gemma4.layer_dims(cfg, layer)] for _ in range(n)]


def check_kv_cache(cfg, kv_cache: str) -> int:
    """arc_kv_form's value for a cache of form `kv_cache` of this model; one line where libarc
    holds none (an unknown form, fp8, q8_0 with heads of other than whole blocks of 32 or past 256)."""
    widths = set(kv_heads(cfg)) or {cfg.head_dim}
    for hd in sorted(widths):
        check_kv_form(kv_cache, hd)
    widest = max(widths)
    if kv_cache != "bf16" and widest > 256:
        raise InvalidArgumentError(f"a {kv_cache} KV cache takes heads of at most 256 values; this model's widest have "
                                   f"{widest}: use --kv-cache bf16")
    return libarc_form(kv_cache)


def _uploads(name: str, array, cfg):
    """(arc_tensor name, layer, array) of each tensor a model tensor is uploaded as: itself, or a
    gated attention's q_proj as its query rows (WQ) and its gate's (WQ_GATE)."""
    tensor, layer = place(name, cfg)
    if tensor == "ARC_TENSOR_WQ" and cfg.attn_output_gate:
        q, gate = split_gate(array, cfg.n_heads, cfg.head_dim)
        return [(tensor, layer, q), ("ARC_TENSOR_WQ_GATE", layer, gate)]
    if gemma4.shares_values(cfg, name):  # a Gemma 4 global layer's v is its k's (k_eq_v): WV too
        return [(tensor, layer, array), ("ARC_TENSOR_WV", layer, array)]
    return [(tensor, layer, array)]


def check_fits(model: Model, max_seq: int, free: int, kv_cache: str = "bf16") -> None:
    """Refuses, before anything is allocated, a model whose weights, DeltaNet states (a hybrid's:
    arc_model_state's 9 slots a layer) and KV cache for max_seq positions in form `kv_cache` (with a
    q8_0 cache, the prefill's bf16 copy of one layer's rows) exceed the device's free bytes: one line
    naming the bytes and the longest context that would fit."""
    cfg = model.config
    heads = kv_heads(cfg)  # every attention layer's
    per_position = sum(kv_position_bytes(kv_cache, 1, 1, hd) for hd in heads)
    if kv_cache != "bf16":
        per_position += kv_position_bytes("bf16", 1, cfg.n_kv_heads, cfg.head_dim)
    weights = model.stored_bytes + STATE_SLOTS * state_bytes_per_token(cfg) // 2  # a slot: the state read a token
    kv = per_position * max_seq
    if weights + kv <= free:
        return
    gb = 1e9
    fits = (free - weights) // per_position if free > weights else 0
    advice = (f"lower --max-seq to at most {fits}" if fits > 0
              else "its weights alone do not fit: use a smaller or more quantized model file")
    states = f", {(weights - model.stored_bytes) / gb:.2f} GB of DeltaNet states" if weights > model.stored_bytes else ""
    raise InvalidArgumentError(f"the model needs {model.stored_bytes / gb:.2f} GB of weights{states} and {kv / gb:.2f} GB "
                               f"of {kv_cache} KV cache for {max_seq} positions, and the device has {free / gb:.2f} GB "
                               f"free: {advice}")


class CudaModel:
    """An arc_model: libarc's Llama-family forward, its weights, KV cache and activations, and the
    prefill's activations for chunks of PREFILL_CHUNK tokens."""

    supports_prefill = True

    def __init__(self, ctx: Context, model: Model, max_seq: int, kv_cache: str = "bf16"):
        cfg = model.config
        check_supported(cfg)
        if not (isinstance(max_seq, int) and 0 < max_seq <= cfg.max_seq):
            raise InvalidArgumentError(f"max_seq must be in 1..{cfg.max_seq} (the model's context), got {max_seq}")
        form = check_kv_cache(cfg, kv_cache)
        check_fits(model, max_seq, ctx.memory()[0], kv_cache)
        self.ctx, self.ffi, self.lib = ctx, ctx.ffi, ctx.lib
        c = native_config(self.ffi, cfg, max_seq, form)
        pp = self.ffi.new("arc_model **")
        if model.quantized:
            formats = self.ffi.new("int32_t[]", self._formats(model))
            _lib.check(self._entry("arc_model_create_formats")(ctx.ptr, c, formats, pp))
        else:
            _lib.check(self.lib.arc_model_create(ctx.ptr, c, pp))  # validates the config, allocates
        self.ptr = pp[0]
        self.max_seq = max_seq
        self.prefill_chunk = min(PREFILL_CHUNK, max_seq)  # arc_model_prefill's chunks start at multiples of it
        self.kv_cache = kv_cache
        # Any form's (arc_model_kv_planes): (base, row bytes, rows a kv head) of each plane, each plane
        # a run of a (layer, kv head)'s rows for each head of kv_runs, a row's bytes in proportion to its
        # head_dim (kv_runs' entry) against kv_head_dim's.
        self.kv_runs, self.kv_head_dim = kv_heads(cfg), cfg.head_dim
        # A bf16 cache's layout (arc_model_kv_cache) where every layer's heads are alike: k's attention
        # layers then v's, each (kv heads, max_seq, head_dim) bf16; None where they differ.
        uniform = set(self.kv_runs) <= {cfg.head_dim} and len(self.kv_runs) == cfg.kv_layers * cfg.n_kv_heads
        self.kv_shape = (2 * cfg.kv_layers, cfg.n_kv_heads, max_seq, cfg.head_dim) if uniform else None
        try:
            count, base = self.ffi.new("int32_t *"), self.ffi.new("void *[]", self.lib.ARC_KV_MAX_PLANES)
            row_bytes, rows = (self.ffi.new("uint64_t[]", self.lib.ARC_KV_MAX_PLANES) for _ in range(2))
            _lib.check(self.lib.arc_model_kv_planes(self.ptr, count, base, row_bytes, rows))
            self.kv_planes = [(base[i], int(row_bytes[i]), int(rows[i])) for i in range(count[0])]
            self._upload(model)
            _lib.check(self.lib.arc_model_prefill_reserve(self.ptr, self.prefill_chunk))
            lp, wp = self.ffi.new("const float **"), self.ffi.new("int32_t *")
            _lib.check(self.lib.arc_model_logits(self.ptr, lp, wp))
            self.logits, self.width = lp[0], int(wp[0])
            # The DeltaNet layers' states (arc_model_state): (base, layers, slots, floats a slot).
            sp, nl, ns, nf = (self.ffi.new(t) for t in ("float **", "int32_t *", "int32_t *", "uint64_t *"))
            _lib.check(self.lib.arc_model_state(self.ptr, sp, nl, ns, nf))
            self.state = (sp[0], int(nl[0]), int(ns[0]), int(nf[0]))
        except BaseException:
            self.close()
            raise

    def _entry(self, name: str):
        """An entry point of libarc that a library built before quantized weights lacks."""
        try:
            return getattr(self.lib, name)
        except AttributeError:
            raise NoDeviceError(f"this libarc.so has no {name}: it predates quantized weights (rebuild it, "
                                "or load the model with quantized=False)") from None

    def _formats(self, model: Model) -> list[int]:
        """arc_model_create_formats' table: formats[tensor * n_layers + layer], global tensors at
        layer 0, ARC_TENSOR_COUNT tensors; bf16 (0) wherever nothing is quantized."""
        cfg = model.config
        table = [0] * (self.lib.ARC_TENSOR_COUNT * cfg.n_layers)
        for name in model.tensors:
            tensor, layer = place(name, cfg)
            tensors = [tensor] + (["ARC_TENSOR_WQ_GATE"] if tensor == "ARC_TENSOR_WQ" and cfg.attn_output_gate else [])
            for t in tensors:  # a gated q_proj's two parts share its format
                table[getattr(self.lib, t) * cfg.n_layers + layer] = model.format_of(name)
        return table

    def _upload(self, model: Model) -> None:
        cfg = model.config
        for name, array in model.tensors.items():
            for tensor, layer, part in _uploads(name, array, cfg):
                if isinstance(part, QuantTensor):
                    self._check_rows(name, part)
                    part = part.data
                self._put(tensor, layer, part)
        for layer in range(cfg.n_layers):
            if not cfg.is_linear_layer(layer):  # a DeltaNet layer rotates nothing
                self._put("ARC_TENSOR_ROPE_INV_FREQ", layer, rope_inv_freq(cfg, layer))
        # The copies read pageable memory the arrays own: wait for them once, here.
        self.ctx.wait_idle()

    def _check_rows(self, name: str, qt: QuantTensor) -> None:
        """The rows' bytes as libarc counts them (arc_format_row_bytes) equal arcpy's layout's."""
        out = self.ffi.new("uint64_t *")
        _lib.check(self._entry("arc_format_row_bytes")(qt.format, qt.cols, out))
        if int(out[0]) * qt.rows != qt.nbytes:
            raise InvalidArgumentError(f"tensor {name}: {qt.rows} rows of {qt.cols} {qt.format_name} weights take "
                                       f"{int(out[0])} bytes a row in libarc, {qt.nbytes // qt.rows} in arcpy")

    def _put(self, tensor: str, layer: int, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        _lib.check(self.lib.arc_model_upload(self.ptr, getattr(self.lib, tensor), layer,
                                             self.ffi.from_buffer(array), array.nbytes))

    def enqueue(self, loop) -> None:
        _lib.check(self.lib.arc_model_forward(self.ptr, loop))

    def enqueue_greedy(self, loop) -> None:
        # The argmax and its commit in the lm_head's kernel: a node less than after the forward.
        _lib.check(self.lib.arc_model_forward_commit(self.ptr, loop))

    def reserve_speculation(self, k: int) -> None:
        """Buffers for speculative steps of k drafts (libarc refuses a mixture of experts)."""
        _lib.check(self.lib.arc_model_speculate_reserve(self.ptr, k))

    def enqueue_speculate(self, loop, ngram: int, draw: bool = False) -> None:
        """The speculative step; with `draw` the sampled one (each row's token drawn, not its argmax)."""
        step = self.lib.arc_model_forward_speculate_draw if draw else self.lib.arc_model_forward_speculate
        _lib.check(step(self.ptr, loop, ngram))

    def prefill(self, tokens, n: int, start: int) -> None:
        _lib.check(self.lib.arc_model_prefill(self.ptr, tokens, n, start))

    def score(self, tokens, n: int, vocab: int, top_n: int, logprob, top_ids, top_values) -> None:
        """The prefill of tokens[0..n) from position 0, each token after the first scored against
        the row before it into the three device-readable arrays (arc_model_prompt_logprobs)."""
        _lib.check(self.lib.arc_model_prompt_logprobs(self.ptr, tokens, n, 0, vocab, top_n, logprob, top_ids,
                                                      top_values))

    def memory(self) -> tuple[int, int, int]:
        """Device bytes of (weights, KV cache, activations) this forward holds."""
        w, kv, act = (self.ffi.new("uint64_t *") for _ in range(3))
        _lib.check(self.lib.arc_model_memory(self.ptr, w, kv, act))
        return int(w[0]), int(kv[0]), int(act[0])

    def close(self) -> None:
        if self.ptr is not None:
            self.lib.arc_model_destroy(self.ptr)
            self.ptr = None
