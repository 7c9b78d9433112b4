"""Tensor parallelism, CPU tier: the split of a model over ranks (arcpy/parallel/shard.py) and its
NumPy reference (arcpy/parallel/reference.py) against the single-device reference."""

import dataclasses

import numpy as np
import pytest

from arcpy.codes import FORMAT_IQ4_XS, FORMAT_MXFP4, FORMAT_Q4_K, FORMAT_Q6_K, FORMAT_Q8_0
from arcpy.devices.reference import ReferenceModel
from arcpy.errors import InvalidArgumentError
from arcpy.model import LM_HEAD, SHAPES, layer_prefix, random_model, synthetic_model
from arcpy.model.quant import QUANT_FORMATS, dequantize
from arcpy.model.quant_pack import random_quant
from arcpy.parallel.reference import TensorParallelReference
from arcpy.parallel.shard import ShardPlan, block_of, shard_model, slice_columns

Q, O, DOWN = "self_attn.q_proj.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight"


# --- the split ------------------------------------------------------------------------------------

def test_each_rank_holds_its_heads_rows_and_the_matching_columns():
    c = SHAPES["qwen3-tiny"]  # 8 heads of 64, 2 key/value heads, FFN 768
    plan = ShardPlan(c, 2)
    hq, hkv, f = c.n_heads * c.head_dim // 2, c.n_kv_heads * c.head_dim // 2, c.ffn_dim // 2
    p = layer_prefix(1)
    assert plan.bounds(p + Q, 1) == (0, hq, 2 * hq)
    assert plan.bounds(p + "self_attn.k_proj.weight", 0) == (0, 0, hkv)
    assert plan.bounds(p + O, 1) == (1, hq, 2 * hq)
    assert plan.bounds(p + "mlp.up_proj.weight", 1) == (0, f, 2 * f)
    assert plan.bounds(p + DOWN, 0) == (1, 0, f)
    assert plan.bounds(p + "input_layernorm.weight", 1) is None  # every rank holds it whole
    cfg = plan.rank_config()
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.dim) == (c.n_heads // 2, c.n_kv_heads // 2, f, c.dim)


def test_every_rank_holds_the_lm_head_and_the_norms_whole():
    plan = ShardPlan(SHAPES["qwen3-tiny"], 2)
    for name in (LM_HEAD, "model.embed_tokens.weight", layer_prefix(0) + "input_layernorm.weight"):
        assert plan.bounds(name, 1) is None


def test_a_rank_model_holds_its_slices_under_its_config():
    model = synthetic_model("qwen3-tiny", seed=1)
    plan = ShardPlan(model.config, 2)
    rank = shard_model(model, plan, 1)
    assert rank.config == plan.rank_config()
    _, lo, hi = plan.bounds(layer_prefix(2) + DOWN, 1)
    assert np.array_equal(rank.tensor(layer_prefix(2) + DOWN), model.tensor(layer_prefix(2) + DOWN)[:, lo:hi])
    assert rank.lm_head() is model.lm_head()  # whole, the very array


@pytest.mark.parametrize("world, why", [
    (0, "give 1 to 8"), (9, "give 1 to 8"), (2.0, "give 1 to 8"),
    (4, "the model's 2 key/value heads do not divide among 4"),
    (3, "the model's 8 attention heads do not divide among 3"),
])
def test_a_split_that_cannot_be_made_is_refused_in_one_line(world, why):
    with pytest.raises(InvalidArgumentError, match=why):
        ShardPlan(SHAPES["qwen3-tiny"], world)


def test_an_ffn_that_does_not_divide_and_a_mixture_of_experts_are_refused():
    with pytest.raises(InvalidArgumentError, match="the model's 770 FFN rows do not divide among 4"):
        ShardPlan(dataclasses.replace(SHAPES["qwen3-tiny"], ffn_dim=770, n_kv_heads=4), 4)
    with pytest.raises(InvalidArgumentError, match="mixture of experts"):
        ShardPlan(SHAPES["qwen3moe-tiny"], 2)


def test_a_quantized_column_split_that_would_cut_a_block_is_refused():
    c = SHAPES["tiny-quant"]
    name = layer_prefix(0) + DOWN
    with pytest.raises(InvalidArgumentError, match=f"{name} would split its Q4_K blocks of 256 weights"):
        ShardPlan(c, 2, {name: FORMAT_Q4_K})
    with pytest.raises(InvalidArgumentError, match=f"{name} would split its IQ4_XS blocks of 256 weights"):
        ShardPlan(c, 2, {name: FORMAT_IQ4_XS})
    ShardPlan(c, 2, {name: FORMAT_Q8_0})  # blocks of 32: 384 columns a rank keep them whole
    ShardPlan(c, 2, {name: FORMAT_MXFP4})


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
def test_a_quantized_matrix_sliced_by_columns_on_its_blocks_is_those_columns(fmt):
    rng = np.random.default_rng(fmt)
    qt = random_quant(fmt, (6, 1024), rng)
    full = dequantize(qt)
    b = block_of(fmt)
    for lo, hi in ((0, 512), (512, 1024), (b, 2 * b), (0, 1024)):
        assert np.array_equal(dequantize(slice_columns(qt, lo, hi)), full[:, lo:hi]), (lo, hi)
    with pytest.raises(InvalidArgumentError, match="must lie on its"):
        slice_columns(qt, 16, 512 + 16)


def test_shard_hands_each_rank_its_rows_or_columns_in_every_form():
    c = SHAPES["qwen3-tiny"]
    plan = ShardPlan(c, 2, {layer_prefix(0) + DOWN: FORMAT_Q8_0, layer_prefix(0) + Q: FORMAT_Q6_K})
    rng = np.random.default_rng(1)
    q = random_quant(FORMAT_Q6_K, (c.n_heads * c.head_dim, c.dim), rng)
    down = random_quant(FORMAT_Q8_0, (c.dim, c.ffn_dim), rng)
    words = rng.integers(0, 1 << 16, (c.dim, c.n_heads * c.head_dim), dtype=np.uint16)
    for r in range(2):
        _, lo, hi = plan.bounds(layer_prefix(0) + Q, r)
        assert np.array_equal(dequantize(plan.shard(layer_prefix(0) + Q, q, r)), dequantize(q)[lo:hi])
        _, lo, hi = plan.bounds(layer_prefix(0) + DOWN, r)
        assert np.array_equal(dequantize(plan.shard(layer_prefix(0) + DOWN, down, r)), dequantize(down)[:, lo:hi])
        _, lo, hi = plan.bounds(layer_prefix(0) + O, r)
        part = plan.shard(layer_prefix(0) + O, words, r)
        assert np.array_equal(part, words[:, lo:hi]) and part.flags.c_contiguous
    with pytest.raises(InvalidArgumentError, match="rank 2 out of range"):
        plan.bounds(layer_prefix(0) + Q, 2)


# --- the reference ---------------------------------------------------------------------------------

def quantized_tiny():
    """qwen3-tiny with Q8_0 and Q4_0 matrices (blocks of 32: their columns split over 2 ranks)."""
    c = SHAPES["qwen3-tiny"]
    formats = {layer_prefix(i) + s: fmt for i in range(c.n_layers)
               for s, fmt in ((Q, FORMAT_Q8_0), (O, 2), (DOWN, FORMAT_Q8_0), ("mlp.up_proj.weight", 2))}
    return random_model(c, seed=4, name="qwen3-tiny-q8-q4", formats=formats)


MODELS = {"qwen3-tiny": lambda: synthetic_model("qwen3-tiny", seed=2),
          "phi3-tiny": lambda: synthetic_model("phi3-tiny", seed=2),
          "smollm3-tiny": lambda: synthetic_model("smollm3-tiny", seed=2),
          "stories15M": lambda: synthetic_model("stories15M", seed=2), "quantized": quantized_tiny}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("world", [2, 4])
def test_the_split_forward_gives_the_single_devices_logits_and_tokens(name, world):
    model = MODELS[name]()
    try:
        tp = TensorParallelReference(model, world, max_seq=96)
    except InvalidArgumentError:
        pytest.skip(f"{name} does not split over {world}")
    one = ReferenceModel(model, max_seq=96)
    prompt = [3, 17, 5, 29, 11, 2, 40]
    a, b = one.prefill(prompt, 0), tp.prefill(prompt, 0)
    assert np.allclose(a, b, rtol=1e-4, atol=1e-3 * np.abs(a).max())
    # rank r's heads where one keeps them, up to a bf16 rounding that a last-bit difference can move
    assert np.allclose(one.k_cache, tp.k_cache, rtol=2 ** -7, atol=2 ** -7)
    # Greedy, both following the single device's tokens: the split picks its token wherever the
    # single device's top two differ by more than the sums' order can move a logit.
    decided = 0
    for step in range(12):
        top2 = np.sort(a)[-2:]
        if top2[1] - top2[0] > 2e-3 * np.abs(a).max():
            assert int(np.argmax(b)) == int(np.argmax(a)), f"step {step}"
            decided += 1
        token, pos = int(np.argmax(a)), len(prompt) + step
        a, b = one.forward(token, pos), tp.forward(token, pos)
    assert decided >= 8


def test_one_rank_is_the_single_device_reference_bit_for_bit():
    model = synthetic_model("qwen3-tiny", seed=3)
    one, tp = ReferenceModel(model, max_seq=64), TensorParallelReference(model, 1, max_seq=64)
    for pos, tok in enumerate([1, 9, 4, 4, 7]):
        assert np.array_equal(one.forward(tok, pos), tp.forward(tok, pos))
    assert np.array_equal(one.prefill([5, 6, 7], 5, bf16_products=True), tp.prefill([5, 6, 7], 5, bf16_products=True))


def test_the_partial_sums_are_what_the_ranks_add():
    """A rank's o_proj partial alone is not the output: breaking the sum breaks the logits."""
    model = synthetic_model("qwen3-tiny", seed=5)
    one, tp = ReferenceModel(model, max_seq=32), TensorParallelReference(model, 2, max_seq=32)
    tp.ranks[1].layers[0].wo = tp.ranks[1].layers[0].wo * 0  # rank 1's heads lost from layer 0
    assert not np.allclose(one.forward(3, 0), tp.forward(3, 0), rtol=1e-3, atol=1e-3)
