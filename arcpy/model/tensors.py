"""Model: a config and its weights, under the names of the config's tensor table."""

from __future__ import annotations

import numpy as np

from arcpy.checks import quoted, require
from arcpy.codes import FORMAT_BF16
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.model import bf16, quant
from arcpy.model.config import ModelConfig
from arcpy.model.moe import active_bytes
from arcpy.model.mtp import mtp_shapes
from arcpy.model.native import EMBED, LM_HEAD, expected_tensors, is_matrix
from arcpy.model.quant import QuantTensor

Tensor = np.ndarray | QuantTensor


class Model:
    """A config and its weights: bf16 words (uint16, C-contiguous; from files, often read-only
    mmap views), or for the matrix tensors (config.is_matrix) a QuantTensor in one of arc.h's
    quantized formats. `notes` are lines about how the weights were made (a loader's), for the
    caller to show. `mtp`: Qwen3.5's multi-token prediction layer where the checkpoint has one
    (arcpy/model/mtp.py: its names and shapes), held apart from the tensor table, which is
    libarc's; empty otherwise. Its bytes are not counted in the table's (stored_bytes and the
    others): no device holds it yet."""

    def __init__(self, config: ModelConfig, tensors: dict[str, Tensor], name: str, source: str,
                 notes: tuple[str, ...] | list[str] = (), mtp: dict[str, Tensor] | None = None):
        expected = expected_tensors(config)
        for tname, shape in expected.items():
            t = tensors.get(tname)
            require(t is not None, f"model {name}: missing tensor {tname}")
            if isinstance(t, QuantTensor):
                require(is_matrix(tname), f"model {name}: tensor {tname} must be bf16 words; only the "
                        f"projections and the lm_head may be quantized, got {t.format_name}")
            else:
                require(isinstance(t, np.ndarray) and t.dtype == np.uint16 and t.flags.c_contiguous,
                        f"model {name}: tensor {tname} must be C-contiguous uint16 bf16 words"
                        f"{' or a QuantTensor' if is_matrix(tname) else ''}, got {getattr(t, 'dtype', type(t).__name__)}")
            require(t.shape == shape, f"model {name}: tensor {tname} has shape {t.shape}, expected {shape}")
        extra = sorted(set(tensors) - set(expected))
        require(not extra, f"model {name}: unexpected tensor {extra[0] if extra else ''}")
        for mname, mshape in (mtp_shapes(config) if mtp else {}).items():
            require(mname in mtp and mtp[mname].shape == mshape, f"model {name}: MTP tensor {mname} is missing "
                    f"or not of shape {mshape}")
        require(not mtp or set(mtp) <= set(mtp_shapes(config)), f"model {name}: unexpected MTP tensor "
                f"{sorted(set(mtp or ()) - set(mtp_shapes(config)))[:1]}")
        self.config = config
        self.tensors = dict(tensors)
        self.mtp = dict(mtp or {})
        self.name = name
        self.source = source
        self.notes = tuple(notes)

    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise InvalidArgumentError(f"model {self.name}: no tensor named {name}") from None

    def lm_head(self) -> Tensor:
        """The (vocab, dim) output projection: the embedding table when tied."""
        return self.tensors[EMBED] if self.config.tied_embeddings else self.tensors[LM_HEAD]

    def format_of(self, name: str) -> int:
        """arc.h's arc_format of a tensor: FORMAT_BF16, or its QuantTensor's format."""
        t = self.tensor(name)
        return t.format if isinstance(t, QuantTensor) else FORMAT_BF16

    @property
    def quantized(self) -> bool:
        """Whether any tensor is held in a quantized format."""
        return any(isinstance(t, QuantTensor) for t in self.tensors.values())

    @property
    def stored_bytes(self) -> int:
        """Bytes of every tensor as held (what the device stores, the RoPE table aside)."""
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def full_weight_bytes(self) -> int:
        """Bytes of weights a step streams reading every layer tensor whole (quantized ones as
        their rows' bytes), the final norm and the lm_head; of an untied embedding table only the
        token's row; tied, the table is the lm_head and counts once."""
        embed = self.tensors[EMBED]
        n = sum(t.nbytes for name, t in self.tensors.items() if name != EMBED)
        return n + (embed.nbytes if self.config.tied_embeddings else embed.nbytes // embed.shape[0])

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights streamed to decode one token, as the tensors are held: the bandwidth
        floor of a step. full_weight_bytes, but of a mixture of experts' layers only the k experts
        a token is routed to (n_experts_used of n_experts; model.moe.step_bytes counts a step of
        several rows). For a dense bf16 model it is config.weight_bytes."""
        if self.config.n_experts == 0:
            return self.full_weight_bytes
        return active_bytes(self, self.config.n_experts_used)

    def __repr__(self) -> str:
        held = ", quantized" if self.quantized else ""
        return f"Model(name={self.name!r}, source={self.source!r}, n_params={self.config.n_params}{held})"


def require_nonzero(model: Model) -> None:
    """Refuse weights read from a file where a tensor no model works without is all zeros: the
    embedding, the lm_head, or a norm whose weights are its factors (not with norm_plus_one,
    where zeros are factors of one). Each would make every logit equal, every answer garbage."""
    cfg = model.config
    names = [EMBED] + [LM_HEAD] * (LM_HEAD in model.tensors)
    if not cfg.norm_plus_one:
        names += [name for name in model.tensors if name.endswith("norm.weight")]
    for name in names:
        t = model.tensors[name]
        if quant.all_zero(t) if isinstance(t, QuantTensor) else bf16.all_zero(t):
            raise ModelFileError(f"{model.source}: tensor {quoted(name)} is all zeros: a model cannot work with it "
                                 "(every logit would be equal)")
