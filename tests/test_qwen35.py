"""Qwen3.5 / Qwen3.6 (gated DeltaNet hybrids, dense and MoE) on the CPU: their checkpoints read into
the config and tensors arcpy/model/hybrid.py describes, and the NumPy reference against
transformers' float32 logits on tiny random checkpoints (tests/data/qwen35, made by
scripts/qwen35_fixtures.py with transformers 5.25.0); the CUDA backend refuses them in one line.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from arcpy.devices.cpu import NumpyDevice
from arcpy.devices.reference import ReferenceModel
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.model import SHAPES, load_model, save_model, synthetic_model
from arcpy.model.config import ModelConfig
from arcpy.model.hybrid import CUDA_REFUSAL, LINEAR, OP_DELTANET, state_bytes
from arcpy.model.native import describe, layer_program
from arcpy.model.safetensors import save_safetensors

DATA = Path(__file__).parent / "data" / "qwen35"
FIXTURES = ("qwen3_5", "qwen3_5_moe")
# The logits' largest error over a run, relative to their scale, against float32 transformers, with
# arcpy's bf16 KV cache: measured 0.37% (dense) and 0.34% (MoE). With a float32 cache the reference
# computes what transformers computes up to float32 sums: measured 2.1e-6 and 7.0e-6.
TOLERANCE = 0.01
EXACT = 1e-4


def golden(name: str) -> dict:
    with np.load(DATA / name / "golden.npz") as d:
        return {k: d[k] for k in d}


def run(model, tokens) -> np.ndarray:
    ref = ReferenceModel(model)
    return np.stack([ref.forward(int(t), i) for i, t in enumerate(tokens)])


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_the_fixtures_read_into_the_hybrid_config():
    dense, moe = (load_model(DATA / n).config for n in FIXTURES)
    for c in (dense, moe):
        assert c.layer_types == (LINEAR, "full_attention", LINEAR, "full_attention")
        assert (c.linear_n_k_heads, c.linear_n_v_heads, c.linear_k_head_dim, c.linear_v_head_dim,
                c.linear_conv_kernel) == (2, 4, 16, 16, 4)
        assert c.attn_output_gate and c.norm_plus_one and c.qk_norm
        assert (c.head_dim, c.rope_dim, c.rope_theta) == (32, 8, 1e7)
        assert [describe(layer_program(c, i)).split()[0] for i in range(4)] == ["DELTANET", "ATTN_IN"] * 2
    assert dense.n_experts == 0 and dense.ffn_dim == 96
    assert (moe.n_experts, moe.n_experts_used, moe.expert_ffn_dim, moe.shared_expert_ffn_dim) == (8, 2, 32, 48)
    assert moe.norm_topk_prob and all(moe.is_moe_layer(i) for i in range(4))


@pytest.mark.parametrize("name", FIXTURES)
def test_reference_logits_and_greedy_ids_match_transformers(name):
    g = golden(name)
    tokens, n = g["tokens"], int(g["n_prompt"])
    model = load_model(DATA / name)
    got, want = run(model, tokens)[n - 1:], g["logits"][n - 1:]
    err = relative_error(got, want)
    print(f"{name}: max relative logit error {err:.3g} over {len(want)} positions")
    assert err <= TOLERANCE
    assert np.all(g["margin"][n - 1:] > 2 * err * np.abs(want).max())  # every greedy step is clear of the error
    assert ReferenceModel(model).greedy([int(t) for t in tokens[:n]], len(tokens) - n) == [int(t) for t in tokens[n:]]


@pytest.mark.parametrize("name", FIXTURES)
def test_with_a_float32_cache_the_reference_computes_what_transformers_computes(name, monkeypatch):
    import arcpy.devices.reference as reference
    monkeypatch.setattr(reference, "round_bf16", lambda a: a)
    g = golden(name)
    err = relative_error(run(load_model(DATA / name), g["tokens"]), g["logits"])
    print(f"{name}: max relative logit error {err:.3g} with a float32 cache")
    assert err <= EXACT


@pytest.mark.parametrize("name", FIXTURES)
def test_the_prefill_in_chunks_gives_the_steps_logits(name):
    tokens = [int(t) for t in golden(name)["tokens"]]
    model = load_model(DATA / name)
    steps = run(model, tokens)
    rows = ReferenceModel(model).prefill(tokens, chunk=5, every_row=True)
    assert relative_error(rows, steps) <= 1e-4  # summation order (and a bf16 cache entry it tips)
    device = NumpyDevice(ReferenceModel(model))
    assert device.capabilities.prefix_granule == 0  # the recurrent state holds no prefix to resume
    device.enqueue_prefill(tokens, 0)
    assert relative_error(device.host_logits(), steps[-1]) <= 1e-4


def test_the_state_runs_forward_only_and_restarts_at_position_zero():
    model = load_model(DATA / "qwen3_5")
    tokens = [int(t) for t in golden("qwen3_5")["tokens"][:6]]
    ref = ReferenceModel(model)
    first = [ref.forward(t, i) for i, t in enumerate(tokens)]
    with pytest.raises(InvalidArgumentError, match="position 2 does not follow"):
        ref.forward(tokens[2], 2)
    again = [ref.forward(t, i) for i, t in enumerate(tokens)]  # position 0 starts afresh
    assert all(np.array_equal(a, b) for a, b in zip(first, again))


def test_a_multimodal_checkpoint_reads_its_text_model(tmp_path):
    """Qwen3_5ForConditionalGeneration's files: the text config under text_config, the weights under
    model.language_model, a vision tower and an MTP layer beside them, which are not read."""
    src, out = DATA / "qwen3_5", tmp_path / "vl"
    text = json.loads((src / "config.json").read_text())
    out.mkdir()
    (out / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": False,
        "text_config": {**text, "model_type": "qwen3_5_text", "architectures": None}, "vision_config": {"depth": 1}}))
    plain = load_model(src)
    words = {name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name: t
             for name, t in plain.tensors.items()}
    extra = np.zeros((4, 4), np.uint16)
    words.update({"model.visual.blocks.0.attn.qkv.weight": extra, "mtp.fc.weight": extra,
                  "mtp.layers.0.mlp.gate_proj.weight": extra})
    save_safetensors(out / "model.safetensors", words, "BF16")
    model = load_model(out)
    assert model.config == plain.config
    assert all(np.array_equal(model.tensors[n], t) for n, t in plain.tensors.items())


@pytest.mark.parametrize("name", FIXTURES)
def test_save_model_writes_what_load_model_reads(name, tmp_path):
    model = load_model(DATA / name)
    save_model(model, tmp_path / "out")
    back = load_model(tmp_path / "out")
    assert back.config == model.config
    assert all(np.array_equal(back.tensors[n], t) for n, t in model.tensors.items())


@pytest.mark.parametrize("shape", ["qwen3.5-tiny", "qwen3.5moe-tiny"])
def test_the_tiny_presets_run_on_the_reference(shape):
    model = synthetic_model(shape, max_seq=64)
    ref = ReferenceModel(model)
    out = ref.greedy([1, 2, 3, 4], 6)
    assert len(out) == 6 and all(0 <= t < model.config.vocab for t in out)
    assert any(op == OP_DELTANET for op in layer_program(model.config, 0))


def test_the_real_dims_presets():
    dense, moe = SHAPES["qwen3.6-27B"], SHAPES["qwen3.6-35B-A3B"]
    assert dense.layer_types.count(LINEAR) == 48 and moe.layer_types.count(LINEAR) == 30
    assert 26e9 < dense.n_params < 28e9 and 34e9 < moe.n_params < 36e9
    assert 2.5e9 < moe.weight_bytes / 2 < 3.5e9  # about 3B weights a token: the A3B
    assert state_bytes(dense) == 4 * 48 * (10240 * 3 + 48 * 128 * 128)


def test_cuda_refuses_a_hybrid_before_allocating_anything(monkeypatch):
    import arcpy.devices.cuda as cuda

    def no_context(*a, **k):
        raise AssertionError("a context was made")
    monkeypatch.setattr(cuda, "Context", no_context)
    model = synthetic_model("qwen3.5-tiny", max_seq=16)
    with pytest.raises(InvalidArgumentError) as e:
        cuda.open_cuda_device(model)
    assert str(e.value) == CUDA_REFUSAL and "\n" not in str(e.value)
    assert "numpy backend only" in CUDA_REFUSAL
    from arcpy.parallel.shard import ShardPlan
    with pytest.raises(InvalidArgumentError, match="DeltaNet"):
        ShardPlan.of(model, 2)


@pytest.mark.parametrize("change, message", [
    (dict(layer_types=("linear_attention",) * 3), "name each of the 4 layers"),
    (dict(layer_types=("linear_attention", "sliding", "x", "y")), "layer_types must be a tuple"),
    (dict(linear_n_v_heads=3), "multiple of linear_n_k_heads"),
    (dict(linear_conv_kernel=0), "needs linear_n_k_heads"),
    (dict(layer_types=(), attn_output_gate=True), "need layer_types"),
])
def test_config_checks(change, message):
    cfg = SHAPES["qwen3.5moe-tiny"]
    with pytest.raises(InvalidArgumentError, match=message):
        dataclasses.replace(cfg, **change)


def test_config_json_errors_are_one_line(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(DATA / "qwen3_5", d)
    doc = json.loads((d / "config.json").read_text())
    doc["layer_types"] = ["linear_attention", "moe"]
    (d / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match="key 'layer_types' must name full_attention or linear_attention"):
        load_model(d)
    assert isinstance(SHAPES["qwen3.6-27B"], ModelConfig)
