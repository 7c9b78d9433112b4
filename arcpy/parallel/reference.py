"""The NumPy reference of tensor parallelism: `world` ranks, each with its slice of every layer
(arcpy/parallel/shard.py's ShardPlan), running each layer's program in lockstep; after o_proj and
down_proj the ranks' partial outputs are summed in rank order (what the all-reduce computes) and
added to every rank's copy of the residual stream, through the post-norm where the family has
one. Each rank would compute its rows of the logits; a logit is one row's dot product, so that
split changes no value, and the reference computes them at once.

It is a ReferenceModel (the same forward, prefill and greedy), whose KV cache is the ranks'
caches side by side: rank r's heads are rows r * n_kv / world.. of the one cache, so a position's
rows are where the single-device reference keeps them. Its logits equal the single-device
reference's up to the order of the sums that the split divides."""

from __future__ import annotations

import copy

import numpy as np

from arcpy.codes import OP_ATTN_OUT, OP_ATTN_OUT_NORM, OP_FFN_OUT, OP_FFN_OUT_NORM
from arcpy.devices.reference import ReferenceModel
from arcpy.devices.reference_ops import _RowOps, linear, rmsnorm
from arcpy.model import Model, layer_prefix
from arcpy.parallel.shard import ShardPlan


def _attn_partial(o: _RowOps, L) -> np.ndarray:
    """What a rank's o_proj adds to the residual stream: its heads' part (the op's own product)."""
    return linear(o.att.reshape(o.t, -1), L.wo)


def _ffn_partial(o: _RowOps, L) -> np.ndarray:
    return linear(o.h, L.w_down)


# The ops whose output is the ranks' partial sums: the partial, and the post-norm's weights if any.
_REDUCED = {OP_ATTN_OUT: (_attn_partial, None), OP_ATTN_OUT_NORM: (_attn_partial, "post_attn_norm"),
            OP_FFN_OUT: (_ffn_partial, None), OP_FFN_OUT_NORM: (_ffn_partial, "post_ffn_norm")}
# The float32 arrays of a layer that ranks slice, by the tensor they come from.
_LAYER_ARRAYS = {"wq": "self_attn.q_proj.weight", "bq": "self_attn.q_proj.bias",
                 "wk": "self_attn.k_proj.weight", "bk": "self_attn.k_proj.bias",
                 "wv": "self_attn.v_proj.weight", "bv": "self_attn.v_proj.bias",
                 "wo": "self_attn.o_proj.weight", "w_gate": "mlp.gate_proj.weight",
                 "w_up": "mlp.up_proj.weight", "w_down": "mlp.down_proj.weight"}


class TensorParallelReference(ReferenceModel):
    """`model` split over `world` ranks (InvalidArgumentError where it cannot split)."""

    def __init__(self, model: Model, world: int, max_seq: int | None = None):
        self.plan = ShardPlan.of(model, world)
        super().__init__(model, max_seq)
        self.world = world
        self.ranks = [self._rank(r) for r in range(world)]

    def _rank(self, r: int) -> ReferenceModel:
        """Rank r: a ReferenceModel of the rank's config over its slices and its heads' cache rows."""
        plan, c = self.plan, self.config
        rank = ReferenceModel.__new__(ReferenceModel)  # the whole model's fields, then the rank's own
        rank.__dict__.update(self.__dict__)
        rank.config = plan.rank_config()
        rank.layers = []
        for li, layer in enumerate(self.layers):
            mine = copy.copy(layer)
            for attr, suffix in _LAYER_ARRAYS.items():
                if getattr(layer, attr, None) is not None:
                    setattr(mine, attr, plan.shard(layer_prefix(li) + suffix, getattr(layer, attr), r))
            rank.layers.append(mine)
        rank._bf16_layers = None
        kv = slice(r * c.n_kv_heads // self.world, (r + 1) * c.n_kv_heads // self.world)
        rank.k_cache, rank.v_cache = self.k_cache[:, kv], self.v_cache[:, kv]  # views of the one cache
        return rank

    def _run_rows(self, tokens: list[int], start: int, layers, r) -> np.ndarray:
        bf16 = layers is not self.layers  # the prefill's form: each rank's own layers rounded
        ops = [_RowOps(rank, tokens, start, r) for rank in self.ranks]
        rank_layers = [rank._product_layers(bf16) for rank in self.ranks]
        for li in range(self.config.n_layers):
            for op in self.programs[li]:
                if op in _REDUCED:
                    partial, norm = _REDUCED[op]
                    parts = [partial(o, lr[li]) for o, lr in zip(ops, rank_layers)]
                    total = parts[0]
                    for p in parts[1:]:  # the all-reduce: a sum in rank order
                        total = total + p
                    if norm is not None:
                        total = rmsnorm(total, getattr(rank_layers[0][li], norm), self.config.rms_eps)
                    for o in ops:
                        o.x = o.x + total
                else:
                    for o, lr in zip(ops, rank_layers):
                        o.run(op, li, lr[li])
        return ops[0].x
