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
from reference_goldens import assert_greedy_goldens, read_golden, reference_logits, relative_error

from arcpy.devices.numpy_device import NumpyDevice
from arcpy.devices.reference import ReferenceModel
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.model import SHAPES, load_model, save_model, synthetic_model
from arcpy.model.config import ModelConfig
from arcpy.codes import (OP_ATTEND, OP_ATTN_GATE, OP_ATTN_IN, OP_ATTN_OUT, OP_DN_IN, OP_DN_OUT, OP_DN_STEP,
                         OP_FFN_IN, OP_FFN_OUT, OP_MOE_IN, OP_MOE_OUT, OP_QK_NORM)
from arcpy.model.hybrid import LINEAR
from arcpy.model.native import describe, layer_program
from arcpy.model.safetensors import save_safetensors

DATA = Path(__file__).parent / "data" / "qwen35"
FIXTURES = ("qwen3_5", "qwen3_5_moe")
# The logits' largest error over the greedy steps, relative to their scale, against float32
# transformers, with arcpy's bf16 KV cache: measured 0.19% (dense) and 0.073% (MoE). With a float32
# cache the reference computes what transformers computes up to float32 sums, over every position:
# measured 2.1e-6 and 1.6e-6.
TOLERANCE = 0.01
EXACT = 1e-4





def test_the_fixtures_read_into_the_hybrid_config():
    dense, moe = (load_model(DATA / n).config for n in FIXTURES)
    for c in (dense, moe):
        assert c.layer_types == (LINEAR, "full_attention", LINEAR, "full_attention")
        assert (c.linear_n_k_heads, c.linear_n_v_heads, c.linear_k_head_dim, c.linear_v_head_dim,
                c.linear_conv_kernel) == (2, 4, 16, 16, 4)
        assert c.attn_output_gate and c.norm_plus_one and c.qk_norm
        assert (c.head_dim, c.rope_dim, c.rope_theta) == (32, 8, 1e7)
        assert [describe(layer_program(c, i)).split()[0] for i in range(4)] == ["DN_IN", "ATTN_IN"] * 2
    assert dense.n_experts == 0 and dense.ffn_dim == 96
    assert (moe.n_experts, moe.n_experts_used, moe.expert_ffn_dim, moe.shared_expert_ffn_dim) == (8, 2, 32, 48)
    assert moe.norm_topk_prob and all(moe.is_moe_layer(i) for i in range(4))


@pytest.mark.parametrize("name", FIXTURES)
def test_reference_logits_and_greedy_ids_match_transformers(name):
    assert_greedy_goldens(DATA / name, TOLERANCE)


@pytest.mark.parametrize("name", FIXTURES)
def test_with_a_float32_cache_the_reference_computes_what_transformers_computes(name, monkeypatch):
    import arcpy.devices.kv_formats as kv_formats
    monkeypatch.setitem(kv_formats.ROUND, "bf16", lambda a: a)  # the KV cache in float32
    g = read_golden(DATA / name)
    err = relative_error(reference_logits(load_model(DATA / name), g["tokens"]), g["logits"])
    print(f"{name}: max relative logit error {err:.3g} with a float32 cache")
    assert err <= EXACT


@pytest.mark.parametrize("name", FIXTURES)
def test_the_prefill_in_chunks_gives_the_steps_logits(name):
    tokens = [int(t) for t in read_golden(DATA / name)["tokens"]]
    model = load_model(DATA / name)
    steps = reference_logits(model, tokens)
    rows = ReferenceModel(model).prefill(tokens, chunk=5, every_row=True)
    assert relative_error(rows, steps) <= 1e-4  # summation order (and a bf16 cache entry it tips)
    device = NumpyDevice(ReferenceModel(model))
    assert device.capabilities.prefix_state_bytes > 0  # a prefix resumes with its states (test_prefix_cache.py)
    device.enqueue_prefill(tokens, 0)
    assert relative_error(device.host_logits(), steps[-1]) <= 1e-4


def test_the_state_runs_forward_only_and_restarts_at_position_zero():
    model = load_model(DATA / "qwen3_5")
    tokens = [int(t) for t in read_golden(DATA / "qwen3_5")["tokens"][:6]]
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


def test_experts_packed_in_3d_tensors_read_as_the_per_expert_ones(tmp_path):
    """Qwen3.5-MoE's published files pack each layer's experts: mlp.experts.gate_up_proj (experts,
    2 x width, dim) and mlp.experts.down_proj (experts, dim, width)."""
    src, out = DATA / "qwen3_5_moe", tmp_path / "packed"
    plain = load_model(src)
    c = plain.config
    words = {}
    for name, t in plain.tensors.items():
        head, sep, proj = name.partition(".mlp.experts.")
        if not sep:
            words[name] = t
        elif proj == "gate_proj.weight":
            gate = t.reshape(c.n_experts, c.expert_ffn_dim, c.dim)
            up = plain.tensors[head + ".mlp.experts.up_proj.weight"].reshape(gate.shape)
            words[head + ".mlp.experts.gate_up_proj"] = np.ascontiguousarray(np.concatenate([gate, up], axis=1))
        elif proj == "down_proj.weight":
            words[head + ".mlp.experts.down_proj"] = t.reshape(c.n_experts, c.dim, c.expert_ffn_dim)
    out.mkdir()
    shutil.copy(src / "config.json", out / "config.json")
    save_safetensors(out / "model.safetensors", words, "BF16")
    model = load_model(out)
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
    ffn = [OP_MOE_IN, OP_MOE_OUT] if model.config.n_experts else [OP_FFN_IN, OP_FFN_OUT]
    assert layer_program(model.config, 0) == [OP_DN_IN, OP_DN_STEP, OP_DN_OUT] + ffn
    assert layer_program(model.config, 3) == [OP_ATTN_IN, OP_QK_NORM, OP_ATTEND, OP_ATTN_GATE, OP_ATTN_OUT] + ffn


def test_the_real_dims_presets():
    dense, moe = SHAPES["qwen3.6-27B"], SHAPES["qwen3.6-35B-A3B"]
    assert dense.layer_types.count(LINEAR) == 48 and moe.layer_types.count(LINEAR) == 30
    assert 26e9 < dense.n_params < 28e9 and 34e9 < moe.n_params < 36e9
    assert 2.5e9 < moe.weight_bytes / 2 < 3.5e9  # about 3B weights a token: the A3B


def test_cuda_refuses_deltanet_heads_its_kernel_does_not_take_before_allocating_anything(monkeypatch):
    import arcpy.devices.cuda as cuda

    def no_context(*a, **k):
        raise AssertionError("a context was made")
    monkeypatch.setattr(cuda, "Context", no_context)
    monkeypatch.setitem(SHAPES, "qwen3.5-heads32",
                        dataclasses.replace(SHAPES["qwen3.5-tiny"], linear_k_head_dim=32, linear_v_head_dim=32))
    model = synthetic_model("qwen3.5-heads32", max_seq=16)
    with pytest.raises(InvalidArgumentError) as e:
        cuda.open_cuda_device(model)
    assert "DeltaNet heads of 128" in str(e.value) and "heads of 32" in str(e.value) and "\n" not in str(e.value)
    model = synthetic_model("qwen3.5-tiny", max_seq=16)
    from arcpy.parallel.shard import ShardPlan
    with pytest.raises(InvalidArgumentError, match="DeltaNet"):
        ShardPlan.of(model, 2)


@pytest.mark.parametrize("change, message", [
    (dict(layer_types=("linear_attention",) * 3), "name each of the 4 layers"),
    (dict(layer_types=("linear_attention", "sliding", "x", "y")), "layer_types must be a tuple"),
    (dict(linear_n_k_heads=2, linear_n_v_heads=3), "multiple of linear_n_k_heads"),
    (dict(linear_conv_kernel=0), "needs linear_n_k_heads"),
    (dict(layer_types=(), attn_output_gate=True), "need layer_types"),
    (dict(linear_v_head_dim=64), "linear_k_head_dim .128. and linear_v_head_dim .64. must be equal"),
])
def test_config_checks(change, message):
    cfg = SHAPES["qwen3.5moe-tiny"]
    with pytest.raises(InvalidArgumentError, match=message):
        dataclasses.replace(cfg, **change)


def test_a_gate_alone_needs_layer_types():
    with pytest.raises(InvalidArgumentError, match="attn_output_gate need layer_types"):
        dataclasses.replace(SHAPES["qwen3-tiny"], attn_output_gate=True)


def test_config_json_errors_are_one_line(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(DATA / "qwen3_5", d)
    doc = json.loads((d / "config.json").read_text())
    doc["layer_types"] = ["linear_attention", "moe"]
    (d / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match="key 'layer_types' must name full_attention or linear_attention"):
        load_model(d)
    assert isinstance(SHAPES["qwen3.6-27B"], ModelConfig)


# ---------------------------------------------------------------------------------------------
# GGUF: the files llama.cpp's converter writes for qwen35 and qwen35moe


def converter_tensors(model) -> dict[str, np.ndarray]:
    """The model's tensors as llama.cpp's converter writes them (float32): the norms' factors
    whole (all but the DeltaNet's gated norm), A_log as -exp(A_log), the convolution (channels,
    kernel), every DeltaNet tensor's value heads from grouped to tiled order."""
    from arcpy.model import bf16_to_f32
    from arcpy.model.families import family_for
    from arcpy.model.gguf import _gguf_name
    cfg, family, out = model.config, family_for(model.config), {}
    n_k, group = cfg.linear_n_k_heads, cfg.linear_n_v_heads // cfg.linear_n_k_heads

    def tiled(x, axis, head, at=0):
        x = np.moveaxis(x, axis, 0)
        v = x[at:]
        v = v.reshape(n_k, group, head, *v.shape[1:]).swapaxes(0, 1).reshape(v.shape)
        return np.moveaxis(np.concatenate([x[:at], v]), 0, axis)
    for name, words in model.tensors.items():
        x = bf16_to_f32(words)
        if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            x = x + np.float32(cfg.norm_add)
        leaf = name.partition(".linear_attn.")[2]
        kd, dv = cfg.linear_n_k_heads * cfg.linear_k_head_dim, cfg.linear_v_head_dim
        if leaf == "A_log":
            x = -np.exp(x)
        if leaf == "conv1d.weight":
            x = x[:, 0, :]
        if leaf in ("in_proj_qkv.weight", "conv1d.weight"):
            x = tiled(x, 0, dv, 2 * kd)
        elif leaf in ("in_proj_z.weight", "out_proj.weight"):
            x = tiled(x, 0 if "z" in leaf else 1, dv)
        elif leaf in ("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias"):
            x = tiled(x, 0, 1)
        out[_gguf_name(name, family)] = np.ascontiguousarray(x, np.float32)
    return out


def mtp_converter_tensors(model) -> dict[str, np.ndarray]:
    """The model's MTP layer (model.mtp) as llama.cpp's converter writes it: block n_layers, its
    decoder layer under the usual block names, nextn.eh_proj, enorm, hnorm and shared_head_norm;
    the norms' factors whole, as the model's."""
    from arcpy.devices.reference_mtp import layer_model
    from arcpy.model import bf16_to_f32, mtp
    cfg, n = model.config, model.config.n_layers
    layer = converter_tensors(layer_model(model))
    out = {f"blk.{n}." + name[len("blk.0."):]: x for name, x in layer.items() if name.startswith("blk.0.")}
    out[f"blk.{n}.nextn.shared_head_norm.weight"] = layer["output_norm.weight"]
    for name in (mtp.FC, mtp.NORM_EMBEDDING, mtp.NORM_HIDDEN):
        x = bf16_to_f32(model.mtp[name]) + np.float32(cfg.norm_add if name != mtp.FC else 0)
        out[f"blk.{n}." + mtp.GGUF_NAMES[name]] = np.ascontiguousarray(x, np.float32)
    return out


def write_qwen35_gguf(path, model, mtp: bool = False, q8: tuple[str, ...] = (), q8_as_floats: bool = False,
                      fused: bool = False, drop: tuple[str, ...] = ()) -> Path:
    """The GGUF file llama.cpp's converter writes for model; the tensors whose names end in one of
    q8 as Q8_0 blocks (with q8_as_floats: those blocks' values, as float32); fused: the experts'
    gate and up in one ffn_gate_up_exps, as the converter writes them when asked to fuse them; the
    tensors named in drop left out."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from gguf import GGUFWriter
    from test_families import gguf_meta
    from test_gguf import fused_gate_up, put
    cfg = model.config
    arch = "qwen35moe" if cfg.n_experts else "qwen35"
    a = arch + "."
    meta = {**gguf_meta(arch, cfg), a + "full_attention_interval": 4, a + "ssm.conv_kernel": cfg.linear_conv_kernel,
            a + "ssm.state_size": cfg.linear_k_head_dim, a + "ssm.group_count": cfg.linear_n_k_heads,
            a + "ssm.time_step_rank": cfg.linear_n_v_heads,
            a + "ssm.inner_size": cfg.linear_n_v_heads * cfg.linear_v_head_dim,
            a + "rope.dimension_sections": [cfg.rotary_dim // 8, cfg.rotary_dim // 8, cfg.rotary_dim // 4, 0]}
    tensors = converter_tensors(model)
    if mtp:  # an MTP layer after the model's, as the converter appends it: the model's own, or a stub
        meta[a + "block_count"] = cfg.n_layers + 1
        meta[a + "nextn_predict_layers"] = 1
        tensors.update(mtp_converter_tensors(model) if model.mtp else {
            f"blk.{cfg.n_layers}.nextn.eh_proj.weight": np.zeros((cfg.dim, 2 * cfg.dim), np.float32),
            f"blk.{cfg.n_layers}.attn_norm.weight": np.ones(cfg.dim, np.float32)})
    if cfg.n_experts:
        del meta[a + "feed_forward_length"]
        meta.update({a + "expert_count": cfg.n_experts, a + "expert_used_count": cfg.n_experts_used,
                     a + "expert_feed_forward_length": cfg.expert_ffn_dim,
                     a + "expert_shared_feed_forward_length": cfg.shared_expert_ffn_dim})
        for i in range(cfg.n_layers + bool(mtp and model.mtp)):  # the experts as llama.cpp's 3-D tensors
            for part in ("gate", "up", "down"):
                name = f"blk.{i}.ffn_{part}_exps.weight"
                tensors[name] = tensors[name].reshape(cfg.n_experts, -1, tensors[name].shape[-1])
            if fused:
                gate, up = tensors.pop(f"blk.{i}.ffn_gate_exps.weight"), tensors.pop(f"blk.{i}.ffn_up_exps.weight")
                tensors[f"blk.{i}.ffn_gate_up_exps.weight"] = fused_gate_up(gate, up)
    w = GGUFWriter(path, arch)
    for key, value in meta.items():
        put(w, key, value)
    for name, x in tensors.items():
        if name in drop:
            continue
        if q8 and name.endswith(q8):
            from gguf import GGMLQuantizationType, quants
            blocks = quants.quantize(x, GGMLQuantizationType.Q8_0)
            if q8_as_floats:
                w.add_tensor(name, quants.dequantize(blocks, GGMLQuantizationType.Q8_0))
            else:
                w.add_tensor(name, blocks, raw_dtype=GGMLQuantizationType.Q8_0)
            continue
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


@pytest.mark.parametrize("shape", ["qwen3.5-tiny", "qwen3.5moe-tiny"])
@pytest.mark.parametrize("mtp", [False, True])
def test_a_gguf_written_as_llama_cpp_writes_it_reads_back(shape, mtp, tmp_path):
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_families import V
    from arcpy.model import bf16_to_f32, f32_to_bf16
    cfg = dataclasses.replace(SHAPES[shape], vocab=V, max_seq=128)
    from arcpy.model import random_model
    model = random_model(cfg, seed=7)
    loaded = load_model(write_qwen35_gguf(tmp_path / "m.gguf", model, mtp))
    # llama.cpp's files hold the norms' factors whole: read so, rounded once to bf16.
    assert loaded.config == dataclasses.replace(cfg, norm_plus_one=False)
    assert set(loaded.tensors) == set(model.tensors)
    for name, words in model.tensors.items():
        if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            words = f32_to_bf16(bf16_to_f32(words) + np.float32(1))
        got = loaded.tensors[name]
        np.testing.assert_array_equal(got, words, err_msg=name)  # A_log too: -exp and log in float32
    if not cfg.n_experts:  # the same model but for the norms' 1 + w rounded to bf16 (3% here; the MoE's
        tokens = [3, 1, 4, 1, 5, 9, 2, 6]  # routing flips with it)
        assert relative_error(reference_logits(loaded, tokens), reference_logits(model, tokens)) < 0.1


@pytest.mark.parametrize("q8", [(), ("exps.weight",)], ids=["bf16", "q8_0 kept packed"])
def test_a_gguf_with_the_experts_gate_and_up_fused_reads_as_one_with_them_apart(q8, tmp_path):
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_families import V
    from arcpy.model import random_model
    from arcpy.model.quant import QuantTensor
    model = random_model(dataclasses.replace(SHAPES["qwen3.5moe-tiny"], vocab=V, max_seq=128), seed=7)
    apart = load_model(write_qwen35_gguf(tmp_path / "apart.gguf", model, q8=q8))
    fused = load_model(write_qwen35_gguf(tmp_path / "fused.gguf", model, q8=q8, fused=True))
    assert fused.config == apart.config and set(fused.tensors) == set(apart.tensors)
    for name, want in apart.tensors.items():
        got = fused.tensors[name]
        assert isinstance(got, QuantTensor) == isinstance(want, QuantTensor) == (bool(q8) and ".experts." in name)
        np.testing.assert_array_equal(getattr(got, "data", got), getattr(want, "data", want), err_msg=name)


def test_a_gguf_missing_an_expert_tensor_names_both_forms(tmp_path):
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_families import V
    from arcpy.model import random_model
    model = random_model(dataclasses.replace(SHAPES["qwen3.5moe-tiny"], vocab=V, max_seq=128), seed=7)
    with pytest.raises(ModelFileError, match=r"missing tensor 'blk\.1\.ffn_up_exps\.weight' \(or the experts' fused "
                                             r"ffn_gate_up_exps\)"):
        load_model(write_qwen35_gguf(tmp_path / "m.gguf", model, drop=("blk.1.ffn_up_exps.weight",)))


@pytest.mark.parametrize("shape", ["qwen3.5-tiny", "qwen3.5moe-tiny", "qwen3.6-27B"])
def test_the_hybrids_table_is_libarcs_and_arc_h_documents_it(shape):
    """Every tensor of a DeltaNet layer and of a gated attention layer, as arc_tensor_shape gives it,
    equals what arc.h's comments say (the files' gated q_proj is WQ and WQ_GATE, their convolution
    (channels, 1, kernel) the table's (channels, kernel))."""
    from test_families import _GLOBAL_KEYS, arc_h_shapes

    from arcpy.model.native import _Table
    cfg = SHAPES[shape]
    table = _Table(cfg)
    for layer in (0, 3):  # a DeltaNet layer and an attention layer
        documented = arc_h_shapes(cfg, layer)
        for key, want in documented.items():
            if key in _GLOBAL_KEYS:
                continue
            got = table.shape(f"ARC_TENSOR_{key}", layer, len(want or ()) == 2)
            assert got == want, (shape, layer, key)
        assert (documented["DN_QKV"] is None) == (layer == 3) and (documented["WQ_GATE"] is None) == (layer == 0)


def test_a_quantized_gguf_keeps_the_deltanets_rows_packed_in_grouped_order(tmp_path):
    """The DeltaNet's projections as Q8_0 blocks read back packed, their value heads moved back to
    grouped order as whole rows; out_proj, whose heads are columns, as bf16: the same weights as a
    file holding the blocks' values as floats."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_families import V

    from arcpy.model import QuantTensor, bf16_to_f32, dequantize, f32_to_bf16, random_model
    # Two key heads of two value heads each: the converter's tiled order is not the grouped one.
    cfg = dataclasses.replace(SHAPES["qwen3.5-tiny"], vocab=V, max_seq=128, linear_n_k_heads=2, linear_n_v_heads=4)
    model = random_model(cfg, seed=9)
    q8 = ("attn_qkv.weight", "attn_gate.weight", "ssm_alpha.weight", "ssm_beta.weight", "ssm_out.weight")
    packed = load_model(write_qwen35_gguf(tmp_path / "q.gguf", model, q8=q8))
    floats = load_model(write_qwen35_gguf(tmp_path / "f.gguf", model, q8=q8, q8_as_floats=True))
    kinds = {}
    for name, t in packed.tensors.items():
        if ".linear_attn." not in name:
            continue
        want = floats.tensors[name]
        if isinstance(t, QuantTensor):
            kinds[name.partition(".linear_attn.")[2].removesuffix(".weight")] = "packed"
            assert np.array_equal(f32_to_bf16(dequantize(t)), want), name
        else:
            kinds[name.partition(".linear_attn.")[2].removesuffix(".weight")] = "bf16"
            assert np.array_equal(bf16_to_f32(t), bf16_to_f32(want)), name
    assert kinds == {"in_proj_qkv": "packed", "in_proj_z": "packed", "in_proj_a": "packed", "in_proj_b": "packed",
                     "out_proj": "bf16", "conv1d": "bf16", "norm": "bf16", "A_log": "bf16", "dt_bias": "bf16"}


def test_a_step_of_a_hybrid_reads_the_attention_layers_kv_and_the_deltanet_layers_state():
    from arcpy.bench.context import kv_read_bytes
    from arcpy.model.hybrid import state_bytes_per_token
    cfg = SHAPES["qwen3.6-27B"]
    # 16 attention layers of 4 kv heads of 256, k and v in bf16, at 100 positions
    assert kv_read_bytes(cfg, 99) == 16 * 2 * 4 * 256 * 2 * 100
    # 48 DeltaNet layers: 48 value heads' S of 128 x 128 and 3 inputs of 10,240 channels, float32, read and written
    assert state_bytes_per_token(cfg) == 2 * 4 * 48 * (48 * 128 * 128 + 3 * (2 * 16 * 128 + 48 * 128))
    assert state_bytes_per_token(SHAPES["qwen3-8B"]) == 0
