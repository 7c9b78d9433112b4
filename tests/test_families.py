"""The families beyond Llama (CPU tier): Qwen3, SmolLM3, Phi-3/Phi-4 and the text model of Mistral
Small 3, from config.json and safetensors and from GGUF files written under llama.cpp's names;
their layer programs; their RoPE tables.

A file written here holds a random model of the family's preset (arcpy.model.presets: every
feature of the family active); loading it must give back that model, tensor for tensor, with the
family's config, and the NumPy reference must decode it as it decodes the preset itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from test_gguf import BYTE_VOCAB, converter_permute, gguf_name, load_error, put

from arcpy.codes import (
    OP_ATTEND,
    OP_ATTN_IN,
    OP_ATTN_OUT,
    OP_ATTN_OUT_NORM,
    OP_FFN_IN,
    OP_FFN_OUT,
    OP_FFN_OUT_NORM,
    OP_QK_NORM,
)
from arcpy.devices.reference import ReferenceModel
from arcpy.errors import ModelFileError
from arcpy.model import (
    SHAPES,
    LinearScaling,
    LongRopeScaling,
    Model,
    YarnScaling,
    bf16_to_f32,
    config_from_hf,
    config_to_hf,
    load_model,
    random_model,
    rope_inv_freq,
    save_model,
    save_safetensors,
)
from arcpy.model import gemma4
from arcpy.model.hybrid import is_hybrid
from arcpy.model.native import describe, expected_tensors, layer_program, place

FAMILIES = {"qwen3": "qwen3-tiny", "phi3": "phi3-tiny", "smollm3": "smollm3-tiny", "gemma3": "gemma3-tiny"}
V = len(BYTE_VOCAB["tokenizer.ggml.tokens"])


def preset(family: str, max_seq: int = 1024):
    cfg = dataclasses.replace(SHAPES[FAMILIES[family]], vocab=V, max_seq=max_seq)
    return random_model(cfg, seed=5, name=family)


# --- layer programs ---------------------------------------------------------------------------


def test_the_layer_program_is_llamas_unless_a_family_adds_an_op():
    llama = [OP_ATTN_IN, OP_ATTEND, OP_ATTN_OUT, OP_FFN_IN, OP_FFN_OUT]
    assert layer_program(SHAPES["gqa"], 0) == llama
    assert layer_program(SHAPES["qwen3-tiny"], 2) == [OP_ATTN_IN, OP_QK_NORM, *llama[1:]]
    assert describe(layer_program(SHAPES["qwen3-tiny"], 0)) == "ATTN_IN QK_NORM ATTEND ATTN_OUT FFN_IN FFN_OUT"
    for name in ("phi3-tiny", "smollm3-tiny"):  # what they change is data: the rotation, the tables
        assert layer_program(SHAPES[name], 0) == llama
    assert layer_program(SHAPES["gemma3-tiny"], 2) == [OP_ATTN_IN, OP_QK_NORM, OP_ATTEND, OP_ATTN_OUT_NORM, OP_FFN_IN,
                                                       OP_FFN_OUT_NORM]


def arc_h_shapes(cfg, layer: int = 0) -> dict[str, tuple[int, ...] | None]:
    """Each arc_tensor's shape in layer `layer` as arc.h's comments word it, evaluated for cfg
    (None: absent), read literally from the header: the documentation the one table in libarc must
    match."""
    text = (Path(__file__).resolve().parents[1] / "libarc" / "arc_model.h").read_text()
    names = {"dim": cfg.dim, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
             "ffn_dim": cfg.ffn_dim, "vocab": cfg.vocab, "rope_dim": cfg.rotary_dim, "n_experts": cfg.n_experts,
             "expert_ffn_dim": cfg.expert_ffn_dim, "shared_ffn_dim": cfg.shared_expert_ffn_dim,
             "dn_v_heads": cfg.linear_n_v_heads, "dn_head_dim": cfg.linear_k_head_dim,
             "dn_conv_kernel": cfg.linear_conv_kernel, "V": cfg.linear_n_v_heads * cfg.linear_v_head_dim,
             "ple_dim": cfg.ple_dim, "ple_vocab": cfg.ple_vocab, "n_layers": cfg.n_layers,
             "conv": 2 * cfg.linear_n_k_heads * cfg.linear_k_head_dim + cfg.linear_n_v_heads * cfg.linear_v_head_dim}
    moe, dn = cfg.is_moe_layer(layer), cfg.is_linear_layer(layer)
    shared = cfg.gemma4_layer and gemma4.kv_source(cfg, layer) != layer
    out = {}
    for name, doc in re.findall(r"ARC_TENSOR_(\w+) = \d+,\s*/\* (.*?) \*/", text, re.S):
        doc = " ".join(doc.split())
        dims = re.search(r"\(([^)]*)\)", doc).group(1)
        shape = tuple(int(eval(d, {}, names)) for d in dims.split(","))  # "n_heads * head_dim" and the like
        present = {"only with qkv_bias": cfg.qkv_bias, "only with qk_norm": cfg.qk_norm,
                   "only with post_norms": cfg.post_norms, "absent when tied": not cfg.tied_embeddings,
                   "only on MoE layers": moe, "absent on MoE layers": not moe,
                   "with a shared expert": cfg.shared_expert_ffn_dim > 0, "only with attn_gate": cfg.attn_output_gate,
                   "only on DeltaNet layers": dn, "absent on DeltaNet layers": not dn,
                   "absent on DeltaNet and shared layers": not dn and not shared, "only with ple_dim": cfg.ple_dim > 0,
                   "only with attn_sinks": cfg.attn_sinks, "only with o_bias": cfg.o_bias,
                   "only with expert_bias": cfg.expert_bias, "only with layer_scalar": cfg.gemma4_layer,
                   "only with experts_beside": cfg.gemma4_layer and moe}
        out[name] = None if any(k in doc and not v for k, v in present.items()) else shape
    return out


_GLOBAL_KEYS = ("EMBED", "FINAL_NORM", "LM_HEAD", "PLE_EMBED", "PLE_PROJECTION", "PLE_NORM")  # arc.h's global tensors


# A hybrid's files hold a gated q_proj whole and the convolution as (channels, 1, kernel):
# tests/test_qwen35.py checks its table against arc.h. Gemma 4's global layers take dims of their
# own (arc.h's config fields, not the tensors' comments) and its table past libarc's dense layer is
# arcpy's alone (arcpy/model/gemma4.py): tests/test_table.py and tests/test_gemma4.py hold it.
@pytest.mark.parametrize("shape", sorted(s for s in SHAPES if not is_hybrid(SHAPES[s]) and not SHAPES[s].gemma4_layer))
def test_the_tensor_table_is_libarcs_and_arc_h_documents_it(shape):
    """expected_tensors comes from libarc's table (arc_tensor_shape); every shape and presence
    equals what arc.h's comments say, for every preset and every family flag."""
    cfg = SHAPES[shape]
    shared = {} if cfg.expert_bias else {"shared_expert_ffn_dim": 256}  # gpt-oss's biases take no shared expert
    moe = ({**shared, "mlp_only_layers": (0,)}, {"moe_every": 2}) if cfg.n_experts else ()
    post = ({"post_norms": True, "tied_embeddings": True},) if not cfg.n_experts else ({"tied_embeddings": True},)
    for flags in ({}, {"qk_norm": True, "qkv_bias": True}, *post, *moe):
        c = dataclasses.replace(cfg, **flags)
        documented = {layer: arc_h_shapes(c, layer) for layer in range(min(c.n_layers, 4))}
        table = expected_tensors(c)
        seen = set()
        for name, got in table.items():
            tensor, layer = place(name, c)
            assert 0 <= layer < c.n_layers
            if layer >= 4:
                continue
            key = tensor[len("ARC_TENSOR_"):]
            assert documented[layer][key] == got, (shape, flags, name)
            seen.add((key, layer) if name.startswith("model.layers.") else (key, 0))
        stored = {(k, layer) for layer, doc in documented.items() for k, v in doc.items()
                  if v is not None and k != "ROPE_INV_FREQ" and (layer == 0 or k not in _GLOBAL_KEYS)}
        assert seen == stored, (shape, flags)


def test_a_layer_outside_the_model_has_no_program():
    with pytest.raises(Exception, match=r"layer must be in \[0, 3\), got 3"):
        layer_program(SHAPES["qwen3-tiny"], 3)


def test_the_reference_runs_the_q_k_norms_the_program_lists():
    """With the norm weights scaled, a model with QK_NORM in its program computes other logits; the
    same scaling leaves a model whose program lacks it unchanged (it reads no such weights)."""
    model = preset("qwen3", max_seq=64)
    tokens = [3, 17, 40, 5, 99]
    base = ReferenceModel(model).prefill(tokens)
    scaled = dict(model.tensors)
    for name in scaled:
        if name.endswith("k_norm.weight"):
            scaled[name] = np.ascontiguousarray((scaled[name].astype(np.uint32) + 0x0080).astype(np.uint16))
    other = ReferenceModel(Model(model.config, scaled, name="scaled", source="test")).prefill(tokens)
    assert np.max(np.abs(other - base)) > 1e-3


# --- RoPE tables ------------------------------------------------------------------------------


def test_a_layer_without_rope_has_a_zero_table_and_the_others_the_base():
    cfg = SHAPES["smollm3-tiny"]
    assert cfg.no_rope_layers == (3,)
    assert not np.any(rope_inv_freq(cfg, 3))
    want = (cfg.rope_theta ** (-np.arange(0, 64, 2) / 64)).astype(np.float32)
    np.testing.assert_allclose(rope_inv_freq(cfg, 0), want, rtol=1e-6)


def test_partial_rotary_rotates_only_the_first_elements():
    cfg = SHAPES["phi3-tiny"]
    assert cfg.rotary_dim == 48 and rope_inv_freq(cfg).shape == (24,)
    from arcpy.devices.reference_ops import rope
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    y = rope(x, 37, rope_inv_freq(cfg), cfg.rope_attention_factor)
    np.testing.assert_array_equal(y[:, 48:], x[:, 48:])
    assert not np.allclose(y[:, :48], x[:, :48])


def test_longrope_takes_the_long_factors_only_past_the_original_context():
    cfg = SHAPES["phi3-tiny"]
    rs = cfg.rope_scaling
    base = cfg.rope_theta ** (-np.arange(0, 48, 2) / 48)
    long_ = rope_inv_freq(dataclasses.replace(cfg, max_seq=rs.original_max_position_embeddings + 1))
    short = rope_inv_freq(dataclasses.replace(cfg, max_seq=rs.original_max_position_embeddings))
    np.testing.assert_allclose(long_, base / np.array(rs.long_factors), rtol=1e-6)
    np.testing.assert_allclose(short, base / np.array(rs.short_factors), rtol=1e-6)


def test_yarn_keeps_the_fast_pairs_and_interpolates_the_slow_ones():
    cfg = SHAPES["qwen3-tiny"]
    rs = cfg.rope_scaling
    base = cfg.rope_theta ** (-np.arange(0, 64, 2) / 64)
    got = rope_inv_freq(cfg).astype(np.float64)
    # A pair whose wavelength makes more than beta_fast turns in the original context is kept; one
    # with fewer than beta_slow is divided by the factor; those between lie between.
    turns = rs.original_max_position_embeddings * base / (2 * math.pi)
    np.testing.assert_allclose(got[turns > 2 * rs.beta_fast], base[turns > 2 * rs.beta_fast], rtol=1e-6)
    slow = turns < rs.beta_slow / 2
    np.testing.assert_allclose(got[slow], base[slow] / rs.factor, rtol=1e-6)
    assert np.all((got >= base / rs.factor * (1 - 1e-6)) & (got <= base * (1 + 1e-6)))
    assert cfg.rope_attention_factor == pytest.approx(0.1 * math.log(4.0) + 1.0)


# --- config.json and safetensors --------------------------------------------------------------


def hf_config(family: str) -> dict:
    return config_to_hf(preset(family).config)


@pytest.mark.parametrize("family", FAMILIES)
def test_config_json_round_trips_each_family(family):
    cfg = preset(family).config
    d = config_to_hf(cfg)
    assert d["model_type"] == {"gemma3": "gemma3_text"}.get(family, family)
    assert config_from_hf(json.loads(json.dumps(d)), "c") == cfg


def test_qwen3_config_reads_its_yarn_the_way_its_files_write_it():
    d = hf_config("qwen3")
    d["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    rs = config_from_hf(d, "c").rope_scaling
    assert rs == YarnScaling(4.0, 256, 0.1 * math.log(4.0) + 1.0)
    d["rope_scaling"]["attention_factor"] = 1.5
    assert config_from_hf(d, "c").rope_scaling.attention_factor == 1.5


def test_layers_without_rope_and_a_rope_attention_factor_are_refused_together():
    d = hf_config("smollm3")
    d["rope_scaling"] = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 512}
    with pytest.raises(ModelFileError, match="layers without RoPE and a RoPE scaling with an attention factor"):
        config_from_hf(d, "c")


def test_smollm3_reads_its_no_rope_list_or_interval():
    d = hf_config("smollm3")
    d["no_rope_layers"] = [1, 0, 1, 1]
    assert config_from_hf(d, "c").no_rope_layers == (1,)
    del d["no_rope_layers"]
    assert config_from_hf(d, "c").no_rope_layers == (3,)  # every 4th by default
    d["no_rope_layers"] = [1, 2, 1, 1]
    with pytest.raises(ModelFileError, match="'no_rope_layers' must list 0 or 1 for each of the 4 layers"):
        config_from_hf(d, "c")


def test_phi3_config_reads_partial_rotary_and_longrope_with_its_defaults():
    d = hf_config("phi3")
    rs = d.pop("rope_scaling")
    d["original_max_position_embeddings"] = rs["original_max_position_embeddings"]
    d["rope_scaling"] = {"type": "longrope", "short_factor": rs["short_factor"], "long_factor": rs["long_factor"]}
    cfg = config_from_hf(d, "c")
    assert cfg.rope_dim == 48 and cfg.rotary_dim == 48
    factor = d["max_position_embeddings"] / d["original_max_position_embeddings"]
    assert cfg.rope_attention_factor == pytest.approx(math.sqrt(1 + math.log(factor) / math.log(512)))
    d["partial_rotary_factor"] = 0.71  # 45.4 elements
    with pytest.raises(ModelFileError, match="partial_rotary_factor 0.71 of head_dim 64 gives 45"):
        config_from_hf(d, "c")
    d["partial_rotary_factor"] = 0.75
    d["rope_scaling"]["short_factor"] = d["rope_scaling"]["long_factor"] = [1.0] * 5
    with pytest.raises(ModelFileError, match="rope_scaling has 5 factors, the rotation 24 pairs"):
        config_from_hf(d, "c")


def write_fused_checkpoint(tmp_path, model):
    """Phi-3's files: q, k, v in one qkv_proj; gate and up in one gate_up_proj."""
    t = dict(model.tensors)
    for i in range(model.config.n_layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.qkv_proj.weight"] = np.concatenate([t.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
        t[p + "mlp.gate_up_proj.weight"] = np.concatenate([t.pop(p + "mlp.gate_proj.weight"), t.pop(p + "mlp.up_proj.weight")])
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(model.config)))
    save_safetensors(tmp_path / "model.safetensors", t, "BF16")
    return t


def test_phi3_fused_projections_are_read_as_their_parts(tmp_path):
    model = preset("phi3")
    write_fused_checkpoint(tmp_path, model)
    loaded = load_model(tmp_path)
    assert loaded.config == model.config
    assert set(loaded.tensors) == set(model.tensors)
    for name, words in model.tensors.items():
        np.testing.assert_array_equal(loaded.tensors[name], words, err_msg=name)


def test_a_fused_projection_of_the_wrong_shape_is_one_line(tmp_path):
    model = preset("phi3")
    t = write_fused_checkpoint(tmp_path, model)
    t["model.layers.1.mlp.gate_up_proj.weight"] = t["model.layers.1.mlp.gate_up_proj.weight"][:-2]
    save_safetensors(tmp_path / "model.safetensors", t, "BF16")
    with pytest.raises(ModelFileError, match=r"tensor 'model.layers.1.mlp.gate_up_proj.weight' has shape "
                                             r"\[1534, 256\], config expects \[1536, 256\] \(768 \+ 768 rows\)"):
        load_model(tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_safetensors_of_each_family_load_and_decode_as_the_preset(tmp_path, family):
    model = preset(family, max_seq=128)
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config == model.config
    tokens = [5, 9, 200, 31, 7, 64]
    for name, words in model.tensors.items():  # Gemma's norms too: held as its files hold them
        np.testing.assert_array_equal(loaded.tensors[name], words, err_msg=name)
    np.testing.assert_array_equal(ReferenceModel(loaded).prefill(tokens), ReferenceModel(model).prefill(tokens))


# --- GGUF -------------------------------------------------------------------------------------

GGUF_ARCH = {"qwen3": "qwen3", "phi3": "phi3", "smollm3": "smollm3", "gemma3": "gemma3"}
GEMMA_NORMS = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}
PERMUTED = {"smollm3"}  # llama.cpp's converter reorders q/k rows of these (LlamaModel's subclasses)


def gguf_meta(arch: str, cfg) -> dict:
    a = arch + "."
    meta = {a + "embedding_length": cfg.dim, a + "block_count": cfg.n_layers, a + "attention.head_count": cfg.n_heads,
            a + "attention.head_count_kv": cfg.n_kv_heads, a + "feed_forward_length": cfg.ffn_dim,
            a + "context_length": cfg.max_seq, a + "rope.freq_base": float(cfg.rope_theta),
            a + "rope.dimension_count": cfg.rotary_dim, a + "attention.key_length": cfg.head_dim,
            a + "attention.value_length": cfg.head_dim, a + "attention.layer_norm_rms_epsilon": float(cfg.rms_eps)}
    rs = cfg.rope_scaling
    if isinstance(rs, YarnScaling):
        meta.update({a + "rope.scaling.type": "yarn", a + "rope.scaling.factor": float(rs.factor),
                     a + "rope.scaling.original_context_length": rs.original_max_position_embeddings})
    if isinstance(rs, LongRopeScaling):
        meta.update({a + "rope.scaling.type": "longrope", a + "rope.scaling.attn_factor": float(rs.attention_factor),
                     a + "rope.scaling.original_context_length": rs.original_max_position_embeddings})
    if isinstance(rs, LinearScaling):
        meta.update({a + "rope.scaling.type": "linear", a + "rope.scaling.factor": float(rs.factor)})
    if cfg.sliding_window:
        meta.update({a + "attention.sliding_window": cfg.sliding_window,
                     a + "attention.sliding_window_pattern": cfg.window_pattern,
                     a + "rope.freq_base_swa": float(cfg.rope_local_theta)})
    return {**meta, **BYTE_VOCAB}


def family_gguf_tensors(family: str, model) -> dict[str, np.ndarray]:
    """The model's tensors as llama.cpp's converter writes them for the family (float32 values;
    norms' factors whole)."""
    cfg, out = model.config, {}
    for hf, words in model.tensors.items():
        x = bf16_to_f32(words)
        if hf.endswith("norm.weight"):
            x = x + np.float32(cfg.norm_add)
        if family in PERMUTED and hf.endswith(("q_proj.weight", "k_proj.weight")):
            x = converter_permute(x, cfg.n_heads if "q_proj" in hf else cfg.n_kv_heads)
        module = hf.split(".")[-2]
        if hf.endswith(("q_norm.weight", "k_norm.weight")):
            i, which = hf.split(".")[2], hf.split(".")[-2][0]
            out[f"blk.{i}.attn_{which}_norm.weight"] = x
        elif family == "gemma3" and module in GEMMA_NORMS:
            out[f"blk.{hf.split('.')[2]}.{GEMMA_NORMS[module]}.weight"] = x
        else:
            out[gguf_name(hf)] = x
    if family == "phi3":
        for i in range(cfg.n_layers):
            b = f"blk.{i}."
            out[b + "attn_qkv.weight"] = np.concatenate([out.pop(b + f"attn_{x}.weight") for x in "qkv"])
            out[b + "ffn_up.weight"] = np.concatenate([out.pop(b + "ffn_gate.weight"), out.pop(b + "ffn_up.weight")])
        rs = cfg.rope_scaling
        out["rope_factors_long.weight"] = np.array(rs.long_factors, np.float32)
        out["rope_factors_short.weight"] = np.array(rs.short_factors, np.float32)
    return out


def write_family_gguf(path, family: str, model, meta_overrides=None, drop=()) -> str:
    w = GGUFWriter(path, GGUF_ARCH[family])
    for key, value in {**gguf_meta(GGUF_ARCH[family], model.config), **(meta_overrides or {})}.items():
        put(w, key, value)
    for name, x in family_gguf_tensors(family, model).items():
        if name not in drop:
            w.add_tensor(name, np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def same_config(got, want) -> bool:
    """Equal, but for the scaling's attention factor, which a GGUF file holds as float32 and the
    reader gives back as the shortest decimal float32 prints."""
    a, b = got.rope_scaling, want.rope_scaling
    if a is not None and hasattr(a, "attention_factor"):
        assert a.attention_factor == pytest.approx(b.attention_factor, rel=1e-7)
        got = dataclasses.replace(got, rope_scaling=dataclasses.replace(a, attention_factor=b.attention_factor))
    return got == want


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_of_each_family_loads_as_the_preset(tmp_path, family):
    from arcpy.model import f32_to_bf16
    model = preset(family)
    if family == "gemma3":  # its files hold no scores' scale: llama.cpp's is 1/sqrt(head_dim) below 62 layers
        model = Model(dataclasses.replace(model.config, attn_scale=1 / 16), model.tensors, name="g", source="test")
    loaded = load_model(write_family_gguf(tmp_path / "m.gguf", family, model))
    # llama.cpp's files hold Gemma's norms' factors whole: read so, rounded once to bf16.
    assert same_config(loaded.config, dataclasses.replace(model.config, norm_plus_one=False))
    assert set(loaded.tensors) == set(model.tensors)
    for name, words in model.tensors.items():
        if name.endswith("norm.weight") and model.config.norm_plus_one:
            words = f32_to_bf16(bf16_to_f32(words) + np.float32(1))
        np.testing.assert_array_equal(loaded.tensors[name], words, err_msg=name)


def test_mistral3_text_gguf_loads_as_a_llama_with_its_head_size(tmp_path):
    cfg = dataclasses.replace(SHAPES["gqa"], dim=256, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=64, ffn_dim=512,
                              vocab=V, max_seq=256, rope_theta=1e9, rope_scaling=None)
    model = random_model(cfg, seed=2)
    w = GGUFWriter(tmp_path / "m.gguf", "mistral3")
    for key, value in gguf_meta("mistral3", cfg).items():
        put(w, key, value)
    for hf, words in model.tensors.items():
        x = bf16_to_f32(words)
        if hf.endswith(("q_proj.weight", "k_proj.weight")):
            x = converter_permute(x, cfg.n_heads if "q_proj" in hf else cfg.n_kv_heads)
        w.add_tensor(gguf_name(hf), np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    loaded = load_model(tmp_path / "m.gguf")
    assert loaded.config == cfg and cfg.q_dim != cfg.dim
    for name, words in model.tensors.items():
        np.testing.assert_array_equal(loaded.tensors[name], words, err_msg=name)


def test_phi3_gguf_without_its_rope_factors_is_one_line(tmp_path):
    path = write_family_gguf(tmp_path / "m.gguf", "phi3", preset("phi3"), drop=("rope_factors_long.weight",))
    assert "LongRoPE scaling needs tensor 'rope_factors_long.weight' of shape [24]" in load_error(path, load_model)


def test_phi3_gguf_with_a_fused_tensor_of_the_wrong_shape_is_one_line(tmp_path):
    model = preset("phi3")
    cfg = dataclasses.replace(model.config, n_kv_heads=4)  # the file's qkv rows are then too few
    path = write_family_gguf(tmp_path / "m.gguf", "phi3", model, {"phi3.attention.head_count_kv": cfg.n_kv_heads})
    assert ("tensor 'blk.0.attn_qkv.weight' has shape [512, 256], config expects [768, 256] (the parts 256 + 256 + 256)"
            in load_error(path, load_model))


def test_phi3_gguf_window_caps_the_context(tmp_path):
    path = write_family_gguf(tmp_path / "m.gguf", "phi3", preset("phi3"), {"phi3.attention.sliding_window": 200})
    assert load_model(path).config.max_seq == 200


# --- Gemma 3 ----------------------------------------------------------------------------------


def test_gemma3_norms_are_held_as_its_files_store_them_and_scale_by_one_plus_w(tmp_path):
    """Gemma's safetensors store each norm's factor less one: arcpy holds those words as they are
    (norm_plus_one) and every norm adds the one back in float32 (libarc's kernels, the reference)."""
    from arcpy.model.safetensors import read_bf16_words, read_header
    model = preset("gemma3", max_seq=64)
    assert model.config.norm_plus_one
    save_model(model, tmp_path)
    entries = read_header(tmp_path / "model.safetensors", 1000)
    for name in model.tensors:
        np.testing.assert_array_equal(read_bf16_words(name, entries[name], {}), model.tensors[name], err_msg=name)
    loaded = load_model(tmp_path)
    assert loaded.config.norm_plus_one
    ref = ReferenceModel(loaded)
    w = bf16_to_f32(model.tensors["model.layers.1.pre_feedforward_layernorm.weight"])
    np.testing.assert_array_equal(ref.layers[1].mlp_norm, w + np.float32(1))
    np.testing.assert_array_equal(ref.final_norm, bf16_to_f32(model.tensors["model.norm.weight"]) + np.float32(1))
    # Without the one, the same words give other logits.
    flat = Model(dataclasses.replace(loaded.config, norm_plus_one=False), loaded.tensors, name="flat", source="test")
    tokens = [5, 9, 200, 31]
    assert np.max(np.abs(ReferenceModel(flat).prefill(tokens) - ref.prefill(tokens))) > 1e-2


def test_a_gemma3_holding_whole_factors_is_saved_less_one(tmp_path):
    """A Gemma read from GGUF holds its norms' factors whole (llama.cpp's files add the one):
    saved as safetensors they are stored less one, and read back they compute the same model."""
    from arcpy.model import f32_to_bf16
    model = preset("gemma3", max_seq=64)
    whole = {n: f32_to_bf16(bf16_to_f32(t) + np.float32(1)) if n.endswith("norm.weight") else t
             for n, t in model.tensors.items()}
    held = Model(dataclasses.replace(model.config, norm_plus_one=False), whole, name="whole", source="test")
    save_model(held, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config == model.config
    name = "model.layers.0.post_attention_layernorm.weight"
    np.testing.assert_array_equal(loaded.tensors[name], f32_to_bf16(bf16_to_f32(whole[name]) - np.float32(1)))
    tokens = [5, 9, 200, 31, 7, 64]
    want = ReferenceModel(held).prefill(tokens)
    np.testing.assert_allclose(ReferenceModel(loaded).prefill(tokens), want, rtol=0, atol=0.05 * np.abs(want).max())


def test_gemma3_config_reads_layer_kinds_and_its_rope_by_kind():
    d = hf_config("gemma3")
    cfg = config_from_hf(d, "c")
    assert [cfg.window(i) for i in range(6)] == [32, 32, 0, 32, 32, 0]
    assert cfg.activation == "gelu_tanh" and cfg.post_norms and cfg.qk_norm
    assert cfg.embed_scale == pytest.approx(16.0) and cfg.scores_scale == pytest.approx(192 ** -0.5)
    d["layer_types"] = ["sliding_attention", "full_attention"] * 3
    assert [config_from_hf(d, "c").window(i) for i in range(6)] == [32, 0, 32, 0, 32, 0]
    d["layer_types"] = ["full_attention"] + ["sliding_attention"] * 5
    with pytest.raises(ModelFileError, match=r"every n-th layer full attention.*got full attention at layers \[0\]"):
        config_from_hf(d, "c")
    d = hf_config("gemma3")
    d["rope_parameters"] = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    cfg2 = config_from_hf(d, "c")
    assert cfg2.rope_scaling == LinearScaling(8.0) and cfg2.rope_local_theta == 10000.0 and cfg2.rope_theta == 1e6
    d["final_logit_softcapping"] = 30.0
    with pytest.raises(ModelFileError, match="final_logit_softcapping is not supported"):
        config_from_hf(d, "c")


def test_gemma3_layers_take_their_own_rope_base_and_only_global_ones_the_scaling():
    cfg = SHAPES["gemma3-tiny"]
    i = np.arange(0, 256, 2) / 256
    np.testing.assert_allclose(rope_inv_freq(cfg, 0), 10000.0 ** -i, rtol=1e-6)
    np.testing.assert_allclose(rope_inv_freq(cfg, 2), 1e6 ** -i / 8.0, rtol=1e-6)


def test_the_reference_window_hides_positions_before_it():
    """A windowed layer's output at p does not depend on a token more than `window` back: change
    the first token, and the logits at a position past the window change only through the global
    layers. With every layer windowed they do not change at all."""
    import dataclasses as dc
    cfg = dc.replace(SHAPES["gemma3-tiny"], vocab=V, max_seq=128, window_pattern=0, sliding_window=8, n_layers=2)
    model = random_model(cfg, seed=3)
    a = [5] + [9, 14, 2, 77, 31, 8, 40, 3, 12, 60, 1]
    b = [6] + a[1:]
    # layer 0 at position 11 reads 4..11 only; layer 1 reads layer 0's outputs at 4..11, which read 0..11
    # at the earliest from position 4 - 7 < 0: so use a two-window gap: positions >= 2 * 8 - 1 = 15.
    a += [21, 22, 23, 24, 25]
    b += [21, 22, 23, 24, 25]
    la, lb = ReferenceModel(model).prefill(a), ReferenceModel(model).prefill(b)
    np.testing.assert_array_equal(la, lb)
    full = random_model(dc.replace(cfg, sliding_window=0), seed=3)
    assert np.max(np.abs(ReferenceModel(full).prefill(a) - ReferenceModel(full).prefill(b))) > 1e-4
