"""Qwen3.5 / Qwen3.6's multi-token prediction (MTP) layer: its tensors, how the files name them,
and its config run alone (arcpy/devices/reference_mtp.py: what it computes, and the one-layer
model the NumPy reference runs it as).

The layer is held apart from the model's tensor table (Model.mtp, under the names below), because
that table is libarc's and has no place for it. Its decoder layer is a full-attention layer of the
main model's kind (gated attention, q/k norms, partial RoPE; the MLP, or the experts and the shared
expert where the model has them), kept under arcpy's table names with "mtp.layers.0." in place of
"model.layers.0." (the experts stacked, as the model's). Around it, four tensors of its own:

    mtp.fc.weight                      (dim, 2 dim)  Hugging Face files; GGUF: blk.N.nextn.eh_proj.weight
    mtp.pre_fc_norm_embedding.weight   (dim,)        GGUF: blk.N.nextn.enorm.weight
    mtp.pre_fc_norm_hidden.weight      (dim,)        GGUF: blk.N.nextn.hnorm.weight
    mtp.norm.weight                    (dim,)        GGUF: blk.N.nextn.shared_head_norm.weight

N is the main model's layer count: llama.cpp's converter appends the MTP layer as block N (its
metadata's nextn_predict_layers says 1) with the decoder layer's tensors under the usual block
names. It renames the four above to block N's eh_proj, enorm, hnorm and shared_head.norm before
its Qwen3-Next rule adds 1 to every tensor whose name ends in "norm.weight" (all but the DeltaNet's
gated norm), so all three norms get the 1 as the model's do, and the norms here follow the model's
convention (norm_plus_one) like its other norms. The embedding and the lm_head are the
main model's (shared); a file's optional nextn.embed_tokens / nextn.shared_head_head are not read.
The layer is optional: a checkpoint without it, or with an incomplete or malformed one, loads
without it (Model.mtp empty; a malformed one gets a line in the model's notes)."""

from __future__ import annotations

from arcpy.model.config import ModelConfig, one_layer
from arcpy.model.hybrid import FULL
from arcpy.model.native import expected_tensors, layer_prefix

PREFIX = "mtp."
LAYER = "mtp.layers.0."
FC = "mtp.fc.weight"
NORM_EMBEDDING = "mtp.pre_fc_norm_embedding.weight"
NORM_HIDDEN = "mtp.pre_fc_norm_hidden.weight"
NORM = "mtp.norm.weight"
# llama.cpp's names of the four, after "blk.N." (gguf-py's MODEL_TENSOR.NEXTN_*).
GGUF_NAMES = {FC: "nextn.eh_proj.weight", NORM_EMBEDDING: "nextn.enorm.weight", NORM_HIDDEN: "nextn.hnorm.weight",
              NORM: "nextn.shared_head_norm.weight"}
NORMS = (NORM_EMBEDDING, NORM_HIDDEN, NORM)


def mtp_config(cfg: ModelConfig) -> ModelConfig:
    """The config of the MTP layer run alone: the model's, one full-attention layer."""
    return one_layer(cfg, layer_types=(FULL,) if cfg.layer_types else ())


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The MTP decoder layer's tensors (under "model.layers.0.") and their shapes."""
    return {n: s for n, s in expected_tensors(mtp_config(cfg)).items() if n.startswith(layer_prefix(0))}


def mtp_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the MTP layer, under Model.mtp's names, and its shape."""
    own = {FC: (cfg.dim, 2 * cfg.dim), **{n: (cfg.dim,) for n in NORMS}}
    return {**own, **{LAYER + n[len(layer_prefix(0)):]: s for n, s in layer_shapes(cfg).items()}}

