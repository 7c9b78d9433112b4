"""Tensor parallelism's split of a model over `world` ranks (the Megatron split), and the slicing
that hands each rank its part of a tensor.

Every rank holds:
- its q/k/v heads: rows of q_proj (n_heads / world heads) and of k_proj and v_proj (n_kv_heads /
  world heads, so rank r's query heads read rank r's key and value heads, as grouped-query
  attention maps them), their biases alike, and those heads' KV cache;
- the matching columns of o_proj: each rank's product is a partial sum of the full output;
- its rows of gate_proj and up_proj (ffn_dim / world) and the matching columns of down_proj;
- a copy of everything else: the embedding, the norms, the residual stream, and the lm_head, whole,
  so that every rank's x, equal after each sum, gives every rank the same logits and the same token
  to commit with no exchange of the token (a split of the lm_head by vocabulary rows would save its
  share of the bytes, about a tenth at 8B, at the cost of a combined argmax or draw).
After o_proj and after down_proj the ranks' partial outputs are summed (the all-reduce), in rank
order, and every rank adds the sum to its copy of the residual stream (through the post-norm
where the family has one). A head count or FFN width that `world` does not divide is refused, as
is a quantized matrix whose column split would cut a block (32 weights; 256 for the _K formats),
and a mixture of experts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from arcpy.checks import is_int
from arcpy.codes import FORMAT_BF16, FORMAT_NAMES, MAX_WORLD
from arcpy.errors import InvalidArgumentError
from arcpy.model import Model, layer_prefix
from arcpy.model.config import ModelConfig
from arcpy.model.hybrid import is_hybrid
from arcpy.model.quant import K_FORMATS, SUPER, SUPER_FORMATS, UNIT, QuantTensor, layout

# Each layer tensor a rank slices: (axis, what the split divides). Rows are axis 0.
_LAYER_SPLITS = {
    "self_attn.q_proj.weight": (0, "q"), "self_attn.q_proj.bias": (0, "q"),
    "self_attn.k_proj.weight": (0, "kv"), "self_attn.k_proj.bias": (0, "kv"),
    "self_attn.v_proj.weight": (0, "kv"), "self_attn.v_proj.bias": (0, "kv"),
    "self_attn.o_proj.weight": (1, "q"),
    "mlp.gate_proj.weight": (0, "ffn"), "mlp.up_proj.weight": (0, "ffn"),
    "mlp.down_proj.weight": (1, "ffn"),
}


def block_of(fmt: int) -> int:
    """The weights a quantized format's column split must keep whole (1 for bf16)."""
    return 1 if fmt == FORMAT_BF16 else SUPER if fmt in SUPER_FORMATS else UNIT


@dataclass(frozen=True)
class ShardPlan:
    """The split of a model of `config` over `world` ranks; `formats` gives each matrix tensor's
    arc_format (absent: bf16), for the block check. Construction refuses what cannot split."""

    config: ModelConfig
    world: int
    formats: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        c, w = self.config, self.world
        if not (is_int(w) and 1 <= w <= MAX_WORLD):
            raise InvalidArgumentError(f"tensor parallel over {w!r} ranks: give 1 to {MAX_WORLD}")
        if c.n_experts:
            raise InvalidArgumentError("tensor parallel: a mixture of experts does not split yet")
        if is_hybrid(c):
            raise InvalidArgumentError("tensor parallel: gated DeltaNet layers and gated attention do not split yet")
        if c.gemma4_layer:
            raise InvalidArgumentError("tensor parallel: Gemma 4's layers do not split yet")
        for n, what in ((c.n_heads, "attention heads"), (c.n_kv_heads, "key/value heads"),
                        (c.ffn_dim, "FFN rows")):
            if n % w:
                raise InvalidArgumentError(f"tensor parallel over {w} ranks: the model's {n} {what} do not divide "
                                           f"among {w}")
        for li in range(c.n_layers):
            for suffix, (axis, what) in _LAYER_SPLITS.items():
                name = layer_prefix(li) + suffix
                fmt = self.formats.get(name, FORMAT_BF16)
                if axis == 1 and self.part(what) % block_of(fmt):
                    raise InvalidArgumentError(
                        f"tensor parallel over {w} ranks: {name} would split its {FORMAT_NAMES[fmt]} blocks of "
                        f"{block_of(fmt)} weights ({self.part(what)} columns a rank)")

    @classmethod
    def of(cls, model: Model, world: int) -> "ShardPlan":
        """The split of `model`, with its quantized matrices' formats."""
        formats = {name: t.format for name, t in model.tensors.items() if isinstance(t, QuantTensor)}
        return cls(model.config, world, formats)

    def part(self, what: str) -> int:
        """The rows or columns of one rank's share: of q (heads x head_dim), of kv, of the FFN."""
        c = self.config
        return {"q": c.n_heads * c.head_dim, "kv": c.n_kv_heads * c.head_dim, "ffn": c.ffn_dim}[what] // self.world

    def rank_config(self) -> ModelConfig:
        """The config of one rank's layers: its heads and its FFN width, the same dim."""
        c = self.config
        return dataclasses.replace(c, n_heads=c.n_heads // self.world, n_kv_heads=c.n_kv_heads // self.world,
                                   ffn_dim=c.ffn_dim // self.world)

    def split(self, name: str) -> tuple[int, str] | None:
        """(axis, what divides it) of a tensor every rank slices; None where every rank holds it whole."""
        for suffix, split in _LAYER_SPLITS.items():
            if name.endswith("." + suffix) and name.startswith("model.layers."):
                return split
        return None

    def bounds(self, name: str, rank: int) -> tuple[int, int, int] | None:
        """(axis, lo, hi) of rank `rank`'s slice of tensor `name`; None: it holds the whole."""
        if not (is_int(rank) and 0 <= rank < self.world):
            raise InvalidArgumentError(f"rank {rank!r} out of range 0..{self.world - 1}")
        split = self.split(name)
        if split is None:
            return None
        axis, what = split
        n = self.part(what)
        return axis, rank * n, (rank + 1) * n

    def shard(self, name: str, tensor, rank: int):
        """Rank `rank`'s part of `tensor` (bf16 words, float32, or a QuantTensor)."""
        b = self.bounds(name, rank)
        if b is None:
            return tensor
        axis, lo, hi = b
        if isinstance(tensor, QuantTensor):
            if axis == 0:
                return QuantTensor(tensor.format, (hi - lo, tensor.cols), tensor.data[lo:hi])
            return slice_columns(tensor, lo, hi)
        return tensor[lo:hi] if axis == 0 else np.ascontiguousarray(tensor[..., lo:hi])


def shard_model(model: Model, plan: ShardPlan, rank: int) -> Model:
    """Rank `rank`'s model: the rank's config (its heads, its FFN rows) over its slices of every
    tensor (views where the rows are whole, copies where the columns are cut)."""
    tensors = {name: plan.shard(name, t, rank) for name, t in model.tensors.items()}
    return Model(plan.rank_config(), tensors, f"{model.name} (rank {rank} of {plan.world})", model.source,
                 model.notes)


def slice_columns(qt: QuantTensor, lo: int, hi: int) -> QuantTensor:
    """Columns [lo, hi) of a quantized matrix, on block boundaries: each row's four arrays cut to
    the units (and superblocks) of those columns and laid out again for the narrower row."""
    block = block_of(qt.format)
    if not (0 <= lo < hi <= qt.cols and lo % block == 0 and hi % block == 0):
        raise InvalidArgumentError(f"columns [{lo}, {hi}) of a {qt.format_name} matrix of {qt.cols} columns must "
                                   f"lie on its {block}-weight blocks")
    src, dst = layout(qt.format, qt.cols), layout(qt.format, hi - lo)
    u0, u1, s0, s1 = lo // UNIT, hi // UNIT, lo // SUPER, hi // SUPER
    out = np.zeros((qt.rows, dst.row_bytes), np.uint8)
    k_format = qt.format in K_FORMATS
    arrays = ((src.a, src.a_len, dst.a, True), (src.b, src.b_len, dst.b, True),  # A, B: records a unit
              (src.c, src.c_len, dst.c, not k_format),  # C: a unit's, or a _K superblock's
              (src.d, src.d_len, dst.d, False))  # D: a superblock's
    for start_src, length, start_dst, per_unit in arrays:
        if length == 0:
            continue
        size = length // (qt.cols // UNIT if per_unit else qt.cols // SUPER)  # bytes a record
        i0, i1 = (u0, u1) if per_unit else (s0, s1)
        out[:, start_dst:start_dst + size * (i1 - i0)] = qt.data[:, start_src + size * i0:start_src + size * i1]
    return QuantTensor(qt.format, (qt.rows, hi - lo), out)
