"""The NumPy reference of Qwen3.5 / Qwen3.6's multi-token prediction (MTP) layer: one draft step,
and a greedy chain of k of them (arcpy/model/mtp.py: its tensors and names).

What a step computes (as vLLM's Qwen3_5MultiTokenPredictor, SGLang's Qwen3NextForCausalLMMTP and
llama.cpp's qwen35 MTP graph do): given the main model's hidden state h_p at position p, after its
final norm (what its lm_head reads), and the token x at position p + 1,

    e = embed[x]                                        the main model's embedding
    u = fc @ concat(rmsnorm(e, pre_fc_norm_embedding), rmsnorm(h_p, pre_fc_norm_hidden))
    y = the MTP decoder layer on u at position p         full attention over its own KV cache
    g = rmsnorm(y, mtp.norm)
    logits = lm_head @ g                                 the main model's head: the token at p + 2

The embedding comes first in the concatenation. Every norm scales by 1 + w where the model's do
(norm_plus_one). The layer's RoPE position and KV cache slot are p, the hidden state's position
(not x's): a row of the MTP layer pairs each position's hidden state with the token that follows
it, and its cache holds one such row per position, filled over the prompt as the main model runs.
The next draft step takes g as its hidden state, the drafted token as its x, at p + 1.
"""

from __future__ import annotations

import numpy as np

from arcpy.devices.reference import ReferenceModel
from arcpy.devices.reference_layer import weights_f32
from arcpy.devices.reference_ops import _exact, _RowOps, argmax, gemv, rmsnorm
from arcpy.errors import InvalidArgumentError
from arcpy.model import EMBED, FINAL_NORM, LM_HEAD, Model, bf16_to_f32, layer_prefix, mtp

F32 = np.float32


def layer_model(model: Model) -> Model:
    """The MTP layer as a one-layer Model the reference runs: its decoder layer as layer 0,
    mtp.norm as the final norm, the main model's embedding and lm_head."""
    if not model.mtp:
        raise InvalidArgumentError(f"model {model.name}: no multi-token prediction layer was read")
    cfg = mtp.mtp_config(model.config)
    tensors = {EMBED: model.tensors[EMBED], FINAL_NORM: model.mtp[mtp.NORM],
               **{layer_prefix(0) + n[len(mtp.LAYER):]: t for n, t in model.mtp.items() if n.startswith(mtp.LAYER)}}
    if not cfg.tied_embeddings:
        tensors[LM_HEAD] = model.tensors[LM_HEAD]
    return Model(cfg, tensors, name=model.name + " (MTP layer)", source=model.source)


def final_hidden(ref: ReferenceModel, token: int, pos: int) -> tuple[np.ndarray, np.ndarray]:
    """The main model's step at `pos` -> (its hidden state after the final norm, what the MTP layer
    takes; its logits). Advances `ref`'s caches as forward() does."""
    x = ref._run_rows([int(token)], int(pos), ref.layers, _exact)[0]
    h = rmsnorm(x, ref.final_norm, ref.config.rms_eps)
    return h, ref._capped(gemv(ref.lm_head, h))


class MtpReference:
    """The MTP layer of `model` as float32 weights, with its own bf16-valued KV cache."""

    def __init__(self, model: Model, max_seq: int | None = None):
        self.layer = ReferenceModel(layer_model(model), max_seq)  # its decoder layer, mtp.norm, the head
        norm = lambda n: bf16_to_f32(model.mtp[n]) + F32(model.config.norm_add)  # noqa: E731
        self.norm_embedding, self.norm_hidden = norm(mtp.NORM_EMBEDDING), norm(mtp.NORM_HIDDEN)
        self.fc = weights_f32(model.mtp[mtp.FC])
        self.eps = model.config.rms_eps

    def reset(self) -> None:
        """Forget every cached position."""
        self.layer.reset()

    def step(self, hidden: np.ndarray, token: int, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """One MTP row: the hidden state at `pos` (after the final norm) and the token at pos + 1
        -> (logits of the token at pos + 2, the hidden state g a next step takes). Writes the
        layer's k/v at `pos`; reads 0..pos."""
        m = self.layer
        m._check_token(token)
        e = rmsnorm(m.embed[int(token)], self.norm_embedding, self.eps)
        h = rmsnorm(np.asarray(hidden, F32), self.norm_hidden, self.eps)
        ops = _RowOps(m, [int(token)], int(pos), _exact)
        ops.x = gemv(self.fc, np.concatenate([e, h]))[None]  # the layer's input, in place of the embedding
        for op in m.programs[0]:
            ops.run(op, 0, m.layers[0])
        g = rmsnorm(ops.x[0], m.final_norm, self.eps)
        return gemv(m.lm_head, g), g

    def draft(self, hidden: np.ndarray, token: int, pos: int, k: int) -> tuple[list[int], list[np.ndarray]]:
        """k greedy drafts after the main model's step at `pos` (its hidden state there) chose
        `token` for pos + 1 -> (the drafted tokens for pos + 2 .. pos + k + 1, each step's hidden
        state). Each step feeds the last's hidden state and drafted token, one position on."""
        tokens: list[int] = []
        hiddens: list[np.ndarray] = []
        for i in range(k):
            logits, hidden = self.step(hidden, token, pos + i)
            token = argmax(logits)
            tokens.append(token)
            hiddens.append(hidden)
        return tokens, hiddens
