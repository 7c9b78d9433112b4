"""Model files: bf16 words, config.json parsing, RoPE frequencies, and the safetensors reader/writer.

Every bad-file case must raise ModelFileError with one line that names the file and the tensor.
Corrupt files are written byte by byte here, independently of arcpy's writer.
"""

from __future__ import annotations

import builtins
import dataclasses
import io
import json
import math
import os
import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.files import read_json_file
from arcpy.model import (
    LinearScaling,
    EMBED,
    FINAL_NORM,
    LM_HEAD,
    MAX_HEADER_BYTES,
    SHAPES,
    Model,
    ModelConfig,
    RopeScaling,
    bf16_to_f32,
    config_from_hf,
    config_to_hf,
    expected_tensors,
    f32_to_bf16,
    load_model,
    random_model,
    rope_inv_freq,
    save_model,
    save_safetensors,
)

TINY = ModelConfig(dim=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=4, ffn_dim=24, vocab=40, max_seq=32)
EMBED_BYTES = TINY.vocab * TINY.dim * 2


# ---------------------------------------------------------------------------------------------
# helpers


def raw_safetensors(path: Path, header: dict, data: bytes, header_len: int | None = None) -> None:
    """Write a safetensors file by hand: u64 LE header length, header bytes, data."""
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data)


def bf16_header_and_data(tensors: dict[str, np.ndarray]) -> tuple[dict, bytes]:
    header, chunks, off = {}, [], 0
    for name, words in tensors.items():
        b = words.astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(words.shape), "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    return header, b"".join(chunks)


def write_config(directory: Path, cfg: ModelConfig = TINY, **overrides) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    d = config_to_hf(cfg)
    d.update(overrides)
    (directory / "config.json").write_text(json.dumps(d))


def write_tiny_dir(directory: Path, tensors: dict[str, np.ndarray] | None = None, cfg: ModelConfig = TINY) -> dict:
    """A model directory written by hand (not by save_model); returns the tensors written."""
    if tensors is None:
        tensors = random_model(cfg, seed=3).tensors
    write_config(directory, cfg)
    header, data = bf16_header_and_data(tensors)
    raw_safetensors(directory / "model.safetensors", header, data)
    return tensors


def load_error(path) -> str:
    with pytest.raises(ModelFileError) as ei:
        load_model(path)
    msg = str(ei.value)
    assert "\n" not in msg, "error messages are one line"
    return msg


def llama3_8b_config() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
        "attention_bias": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    }


# ---------------------------------------------------------------------------------------------
# bf16 words


def word_of(f: float) -> int:
    return struct.unpack("<I", struct.pack("<f", f))[0]


def independent_bf16(f: float) -> int:
    """Nearest bf16 word to the float32 `f` by comparing both neighbours; ties to the even word."""
    bits = word_of(f)
    lo = bits >> 16
    down = struct.unpack("<f", struct.pack("<I", lo << 16))[0]
    up_bits = ((lo + 1) & 0xFFFF) << 16
    up = struct.unpack("<f", struct.pack("<I", up_bits))[0]
    dd, du = abs(f - down), abs(up - f)
    if dd < du or (dd == du and lo % 2 == 0):
        return lo
    return (lo + 1) & 0xFFFF


def test_every_bf16_word_round_trips_exactly_through_f32():
    words = np.arange(1 << 16, dtype=np.uint16)
    values = bf16_to_f32(words)
    back = f32_to_bf16(values)
    finite = ~np.isnan(values)
    assert np.array_equal(back[finite], words[finite])
    assert np.isnan(bf16_to_f32(back[~finite])).all()
    assert values[0x3F80] == 1.0 and values[0xC000] == -2.0


def test_f32_to_bf16_rounds_half_way_cases_to_the_even_word():
    # 1 + 2^-8 lies half way between 0x3F80 (even) and 0x3F81: stays at 0x3F80.
    # 1 + 3*2^-8 lies half way between 0x3F81 and 0x3F82 (even): goes up.
    ties = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)], dtype=np.float32)
    assert f32_to_bf16(ties).tolist() == [0x3F80, 0x3F82, 0xBF80]
    # Just past the half-way point rounds up, just before rounds down.
    near = np.array([1 + 2**-8 + 2**-20, 1 + 2**-8 - 2**-20], dtype=np.float32)
    assert f32_to_bf16(near).tolist() == [0x3F81, 0x3F80]


def test_f32_to_bf16_matches_an_independent_nearest_neighbour_rounding():
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(2000).astype(np.float32),
                        rng.uniform(-1e30, 1e30, 500).astype(np.float32),
                        (rng.standard_normal(500) * 1e-40).astype(np.float32)])  # subnormals
    expected = [independent_bf16(float(v)) for v in x]
    assert f32_to_bf16(x).tolist() == expected


def test_f32_to_bf16_keeps_nan_a_nan_and_overflows_to_infinity():
    # A NaN whose payload sits only in the dropped low bits would become inf if merely truncated.
    low_payload_nan = np.array([0x7F800001, 0xFF800001, 0x7FC00000], dtype=np.uint32).view(np.float32)
    out = bf16_to_f32(f32_to_bf16(low_payload_nan))
    assert np.isnan(out).all()
    big = np.array([np.finfo(np.float32).max, -np.finfo(np.float32).max, np.inf], dtype=np.float32)
    assert bf16_to_f32(f32_to_bf16(big)).tolist() == [np.inf, -np.inf, np.inf]
    assert f32_to_bf16(np.float32(-0.0)).tolist() == 0x8000


# ---------------------------------------------------------------------------------------------
# config.json


def test_llama3_config_parses_with_rope_scaling_and_gqa():
    cfg = config_from_hf(llama3_8b_config(), "cfg.json")
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (4096, 32, 32, 8, 128)
    assert (cfg.ffn_dim, cfg.vocab, cfg.max_seq) == (14336, 128256, 131072)
    assert cfg.rope_theta == 500000.0 and cfg.rms_eps == 1e-5
    assert cfg.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    assert not cfg.tied_embeddings and not cfg.qkv_bias
    assert cfg.q_dim == 4096 and cfg.kv_dim == 1024


def test_qwen2_config_turns_on_qkv_bias_and_expects_bias_tensors():
    d = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
         "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
         "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
         "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 32768}
    cfg = config_from_hf(d, "qwen.json")
    assert cfg.qkv_bias and cfg.tied_embeddings and cfg.head_dim == 64
    names = expected_tensors(cfg)
    assert names["model.layers.0.self_attn.k_proj.bias"] == (128,)
    assert LM_HEAD not in names


def test_head_dim_comes_from_config_when_given_else_dim_over_heads():
    d = llama3_8b_config()
    assert config_from_hf(d, "c").head_dim == 128
    d["head_dim"] = 256
    cfg = config_from_hf(d, "c")
    assert cfg.head_dim == 256 and cfg.q_dim == 8192
    assert expected_tensors(cfg)["model.layers.0.self_attn.o_proj.weight"] == (4096, 8192)


def test_model_type_is_used_when_architectures_is_absent():
    d = llama3_8b_config()
    del d["architectures"]
    d["model_type"] = "mistral"
    assert config_from_hf(d, "c").dim == 4096


def test_missing_config_key_is_named():
    d = llama3_8b_config()
    del d["intermediate_size"]
    with pytest.raises(ModelFileError, match=r"cfg\.json: missing key 'intermediate_size'"):
        config_from_hf(d, "cfg.json")


# Keys with a default: absent, the default holds; null is not absence (a config that says
# "rms_norm_eps": null does not say 1e-6), so it is refused like any other wrong value.
DEFAULTED = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "num_key_value_heads": 32, "head_dim": 128,
             "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu"}


@pytest.mark.parametrize("key", [*DEFAULTED, "hidden_size", "num_hidden_layers", "vocab_size", "use_sliding_window",
                                 "model_type"])
def test_a_key_given_as_null_is_refused_by_name(key):
    d = llama3_8b_config()
    d[key] = None
    if key == "model_type":
        del d["architectures"]
    with pytest.raises(ModelFileError) as ei:
        config_from_hf(d, "cfg.json")
    assert str(ei.value).startswith(f"cfg.json: key '{key}' must be") and str(ei.value).endswith("got None"), ei.value


@pytest.mark.parametrize("where", ["rope_parameters", "rope_scaling"])
def test_a_null_inside_the_rope_settings_is_refused_by_name(where):
    d = llama3_8b_config()
    if where == "rope_parameters":
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": None}
        del d["rope_scaling"]
        key = "rope_theta"
    else:
        d["rope_scaling"]["factor"] = None
        key = "factor"
    with pytest.raises(ModelFileError, match=f"key '{key}' must be a finite number, got None"):
        config_from_hf(d, "cfg.json")


GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "sliding_window": 512, "num_hidden_layers": 6}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 64, "long_factor": [1.0] * 64}


@pytest.mark.parametrize("change, words", [
    ({"head_dim": 10**400}, "key 'head_dim' must be a positive int32"),
    ({"hidden_size": 10**400}, "key 'hidden_size' must be a positive int32"),
    ({"num_attention_heads": 0}, "key 'num_attention_heads' must be a positive int32, got 0"),
    ({"max_position_embeddings": 10**400}, "key 'max_position_embeddings' must be a positive int32"),
    ({"num_hidden_layers": 2**40}, "key 'num_hidden_layers' must be a positive int32"),
    ({"partial_rotary_factor": 1e308}, "key 'partial_rotary_factor' must be in (0, 1], got 1e+308"),
    ({"partial_rotary_factor": -0.5}, "key 'partial_rotary_factor' must be in (0, 1], got -0.5"),
    ({"rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 0}},
     "key 'original_max_position_embeddings' must be a positive int32, got 0"),
    ({"rope_scaling": {**LONGROPE, "original_max_position_embeddings": 1}},
     "longrope's original_max_position_embeddings must be above 1"),
    ({**GEMMA3, "query_pre_attn_scalar": 0}, "key 'query_pre_attn_scalar' must be positive, got 0.0"),
], ids=lambda v: str(v)[:40])
def test_sizes_and_factors_are_range_checked_before_any_arithmetic(change, words):
    """A fuzzed config.json: no OverflowError or ZeroDivisionError, one line naming the key."""
    d = {**llama3_8b_config(), **change}
    with pytest.raises(ModelFileError) as ei:
        config_from_hf(d, "cfg.json")
    assert str(ei.value).startswith("cfg.json: ") and words in str(ei.value) and "\n" not in str(ei.value)


def test_config_with_neither_architectures_nor_model_type_names_the_missing_key():
    d = llama3_8b_config()
    del d["architectures"], d["model_type"]
    with pytest.raises(ModelFileError, match=r"cfg\.json: missing key 'architectures'"):
        config_from_hf(d, "cfg.json")


def test_absent_keys_take_their_defaults():
    d = llama3_8b_config()
    for key in DEFAULTED:
        d.pop(key, None)
    cfg = config_from_hf(d, "cfg.json")
    assert (cfg.rms_eps, cfg.rope_theta, cfg.n_kv_heads, cfg.head_dim) == (1e-6, 10000.0, 32, 128)
    assert not cfg.tied_embeddings and not cfg.qkv_bias
    # null keeps its meaning where the format gives it one: no scaling, no window
    d.update(rope_scaling=None, sliding_window=None, use_sliding_window=False)
    assert config_from_hf(d, "cfg.json").rope_scaling is None


@pytest.mark.parametrize("arch", ["GPT2LMHeadModel", "GemmaForCausalLM"])
def test_unsupported_architecture_is_refused_by_name(arch):
    d = llama3_8b_config()
    d["architectures"] = [arch]
    with pytest.raises(ModelFileError, match=f"cfg.json: unsupported architecture '{arch}'"):
        config_from_hf(d, "cfg.json")


@pytest.mark.parametrize("rope_type", ["dynamic", "mrope", "su"])
def test_unsupported_rope_scaling_type_is_refused(rope_type):
    d = llama3_8b_config()
    d["rope_scaling"] = {"rope_type": rope_type, "factor": 4.0}
    with pytest.raises(ModelFileError, match=f"cfg.json: unsupported rope scaling type '{rope_type}'"):
        config_from_hf(d, "cfg.json")


def test_legacy_rope_scaling_type_key_is_read():
    d = llama3_8b_config()
    d["rope_scaling"] = {"type": "linear", "factor": 2.0}
    assert config_from_hf(d, "c").rope_scaling == LinearScaling(2.0)
    d["rope_scaling"] = {"type": "dynamic", "factor": 2.0}
    with pytest.raises(ModelFileError, match="unsupported rope scaling type 'dynamic'"):
        config_from_hf(d, "c")


def test_active_qwen2_sliding_window_is_refused():
    d = llama3_8b_config()
    d.update(architectures=["Qwen2ForCausalLM"], use_sliding_window=True, sliding_window=4096)
    with pytest.raises(ModelFileError, match="unsupported active sliding window"):
        config_from_hf(d, "c")


def test_mistral_sliding_window_caps_the_context_at_the_window():
    d = llama3_8b_config()
    d.update(architectures=["MistralForCausalLM"], rope_scaling=None, sliding_window=4096,
             max_position_embeddings=32768)
    assert config_from_hf(d, "c").max_seq == 4096
    d["sliding_window"] = None
    assert config_from_hf(d, "c").max_seq == 32768


@pytest.mark.parametrize("key,value", [("attention_bias", True), ("mlp_bias", True), ("hidden_act", "gelu")])
def test_llama_variants_this_engine_cannot_run_are_refused(key, value):
    d = llama3_8b_config()
    d[key] = value
    with pytest.raises(ModelFileError, match=f"c: unsupported {key}"):
        config_from_hf(d, "c")


@pytest.mark.parametrize("kw", [dict(n_kv_heads=3), dict(head_dim=5), dict(dim=0), dict(vocab=-1),
                                dict(rms_eps=0.0), dict(n_layers=2.0)])
def test_model_config_rejects_inconsistent_shapes(kw):
    base = dict(dim=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=4, ffn_dim=24, vocab=40, max_seq=32)
    with pytest.raises(InvalidArgumentError):
        ModelConfig(**{**base, **kw})


def test_rope_scaling_rejects_equal_frequency_factors():
    with pytest.raises(InvalidArgumentError, match="high_freq_factor"):
        RopeScaling(8.0, 2.0, 2.0, 8192)


def test_param_count_and_streamed_bytes_follow_the_tensor_table():
    per_layer = 2 * 16 + 16 * 16 + 2 * 8 * 16 + 16 * 16 + 3 * 24 * 16
    assert TINY.n_params == 40 * 16 + 2 * per_layer + 16 + 40 * 16  # untied: embedding and head
    # Per token only one embedding row is read, but the whole untied head is.
    assert TINY.weight_bytes == 2 * (2 * per_layer + 16 + 40 * 16 + 16)
    tied = ModelConfig(**{**TINY.__dict__, "tied_embeddings": True})
    assert tied.n_params == 40 * 16 + 2 * per_layer + 16
    assert tied.weight_bytes == 2 * tied.n_params


# ---------------------------------------------------------------------------------------------
# RoPE frequencies


def independent_inv_freq(theta, head_dim, scaling=None):
    out = []
    for i in range(head_dim // 2):
        f = 1.0 / math.pow(theta, 2 * i / head_dim)
        if scaling is not None:
            factor, low, high, orig = scaling
            wl = 2 * math.pi / f
            if wl < orig / high:
                pass
            elif wl > orig / low:
                f = f / factor
            else:
                s = (orig / wl - low) / (high - low)
                f = (1 - s) * (f / factor) + s * f
        out.append(f)
    return np.array(out, dtype=np.float32)


def test_rope_inv_freq_without_scaling_is_the_theta_power_series():
    cfg = SHAPES["stories15M"]
    got = rope_inv_freq(cfg)
    assert got.dtype == np.float32 and got.shape == (24,)
    np.testing.assert_array_equal(got, independent_inv_freq(10000.0, 48))
    assert got[0] == 1.0


def test_rope_inv_freq_applies_llama3_scaling_in_all_three_bands():
    cfg = config_from_hf(llama3_8b_config(), "c")
    got = rope_inv_freq(cfg)
    expected = independent_inv_freq(500000.0, 128, (8.0, 1.0, 4.0, 8192))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
    plain = independent_inv_freq(500000.0, 128)
    assert got[0] == plain[0]  # high frequencies untouched
    np.testing.assert_allclose(got[-1], plain[-1] / 8, rtol=1e-6)  # low frequencies slowed by factor
    mid = (got != plain) & ~np.isclose(got, plain / 8, rtol=1e-6)
    assert mid.any()  # some frequencies fall in the blended band


# ---------------------------------------------------------------------------------------------
# reading and writing


def assert_same_model(a: Model, b: Model) -> None:
    assert a.config == b.config
    assert set(a.tensors) == set(b.tensors)
    for name in a.tensors:
        assert np.array_equal(a.tensors[name], b.tensors[name]), name


@pytest.mark.parametrize("cfg", [
    TINY,
    ModelConfig(**{**TINY.__dict__, "tied_embeddings": True}),
    ModelConfig(**{**TINY.__dict__, "qkv_bias": True, "rope_theta": 1e6}),
    ModelConfig(**{**TINY.__dict__, "rope_scaling": RopeScaling(32.0, 1.0, 4.0, 8192), "rope_theta": 5e5}),
], ids=["untied", "tied", "qwen-bias", "llama3-rope"])
def test_save_model_then_load_model_reproduces_config_and_every_word(tmp_path, cfg):
    m = random_model(cfg, seed=1)
    save_model(m, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert_same_model(m, loaded)
    assert loaded.name == "m"
    for t in loaded.tensors.values():
        assert t.dtype == np.uint16 and t.flags.c_contiguous


def test_tied_model_has_no_lm_head_tensor_and_serves_the_embedding():
    m = random_model(ModelConfig(**{**TINY.__dict__, "tied_embeddings": True}), seed=0)
    assert LM_HEAD not in m.tensors
    assert m.lm_head() is m.tensor(EMBED)
    untied = random_model(TINY, seed=0)
    assert untied.lm_head() is untied.tensor(LM_HEAD)
    with pytest.raises(InvalidArgumentError, match="no tensor named nope"):
        untied.tensor("nope")


def test_writer_output_follows_the_safetensors_layout(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    save_safetensors(tmp_path / "a.safetensors", {"x": x, "y": np.ones(3, np.float32)}, "F32")
    raw = (tmp_path / "a.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8:8 + n])
    b, e = header["x"]["data_offsets"]
    assert header["x"]["dtype"] == "F32" and header["x"]["shape"] == [2, 3]
    assert np.array_equal(np.frombuffer(raw[8 + n + b:8 + n + e], "<f4").reshape(2, 3), x)
    with pytest.raises(InvalidArgumentError):
        save_safetensors(tmp_path / "b.safetensors", {"x": x}, "F64")


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_each_float_dtype_is_read_back_as_bf16_words(tmp_path, dtype):
    m = random_model(TINY, seed=2)
    write_config(tmp_path)
    save_safetensors(tmp_path / "model.safetensors", m.tensors, dtype)
    loaded = load_model(tmp_path)
    for name, words in m.tensors.items():
        expected = words
        if dtype == "F16":  # what bf16 -> f16 -> bf16 keeps (f16 has fewer exponent bits)
            expected = f32_to_bf16(bf16_to_f32(words).astype(np.float16).astype(np.float32))
        assert np.array_equal(loaded.tensors[name], expected), name


def test_f32_weights_are_rounded_to_nearest_bf16_on_load(tmp_path):
    m = random_model(TINY, seed=2)
    values = {n: bf16_to_f32(w) for n, w in m.tensors.items()}
    values[FINAL_NORM] = np.full(16, 1 + 2**-8 + 2**-20, dtype=np.float32)  # just above a tie
    write_config(tmp_path)
    save_safetensors(tmp_path / "model.safetensors", values, "F32")
    assert (load_model(tmp_path).tensor(FINAL_NORM) == 0x3F81).all()


def test_sharded_checkpoint_is_assembled_from_its_index(tmp_path):
    m = random_model(TINY, seed=4)
    write_config(tmp_path)
    names = list(m.tensors)
    shards = {"model-00001-of-00002.safetensors": names[:7], "model-00002-of-00002.safetensors": names[7:]}
    weight_map = {}
    for shard, part in shards.items():
        save_safetensors(tmp_path / shard, {n: m.tensors[n] for n in part}, "BF16")
        weight_map.update({n: shard for n in part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert_same_model(m, load_model(tmp_path))


def test_index_naming_a_missing_shard_is_refused(tmp_path):
    write_config(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {EMBED: "model-00009.safetensors"}}))
    assert "model-00009.safetensors" in load_error(tmp_path)


def test_index_pointing_outside_the_model_directory_is_refused(tmp_path):
    write_config(tmp_path / "m")
    save_safetensors(tmp_path / "evil.safetensors", random_model(TINY).tensors)
    (tmp_path / "m" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {EMBED: "../evil.safetensors"}}))
    assert "invalid shard name" in load_error(tmp_path / "m")


# ---------------------------------------------------------------------------------------------
# corrupt and unsupported files


def test_truncated_file_is_refused_naming_the_tensor_past_the_end(tmp_path):
    tensors = write_tiny_dir(tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    last = list(tensors)[-1]
    msg = load_error(tmp_path)
    assert str(f) in msg and f"tensor '{last}'" in msg and "truncated" in msg


def test_data_offsets_outside_the_file_are_refused(tmp_path):
    tensors = write_tiny_dir(tmp_path)
    header, data = bf16_header_and_data(tensors)
    header[EMBED]["data_offsets"] = [10**9, 10**9 + EMBED_BYTES]
    raw_safetensors(tmp_path / "model.safetensors", header, data)
    msg = load_error(tmp_path)
    assert "model.safetensors" in msg and EMBED in msg and "past the end" in msg


def test_offsets_spanning_the_wrong_byte_count_are_refused(tmp_path):
    tensors = write_tiny_dir(tmp_path)
    header, data = bf16_header_and_data(tensors)
    header[EMBED]["data_offsets"] = [0, EMBED_BYTES - 2]
    raw_safetensors(tmp_path / "model.safetensors", header, data)
    msg = load_error(tmp_path)
    assert EMBED in msg and f"needs {EMBED_BYTES}" in msg


@pytest.mark.parametrize("header_len", [2**40, 10_000_000])
def test_header_length_beyond_cap_or_file_is_not_a_safetensors_file(tmp_path, header_len):
    tensors = write_tiny_dir(tmp_path)
    header, data = bf16_header_and_data(tensors)
    raw_safetensors(tmp_path / "model.safetensors", header, data, header_len=header_len)
    msg = load_error(tmp_path)
    assert "model.safetensors: not a safetensors file" in msg
    assert str(header_len) not in msg  # the length word is not echoed


def test_file_shorter_than_the_length_word_is_refused(tmp_path):
    write_config(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x01\x02")
    assert "model.safetensors: not a safetensors file (too short" in load_error(tmp_path)


def test_header_that_is_not_json_is_refused(tmp_path):
    write_config(tmp_path)
    junk = b"{not json at all"
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(junk)) + junk)
    assert "model.safetensors: not a safetensors file (header is not valid JSON" in load_error(tmp_path)


def test_tensor_shape_not_matching_the_config_is_refused(tmp_path):
    tensors = write_tiny_dir(tmp_path)
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = np.zeros((24, 16), np.uint16)  # transposed
    write_tiny_dir(tmp_path, tensors)
    msg = load_error(tmp_path)
    assert f"tensor '{name}' has shape [24, 16], config expects [16, 24]" in msg


@pytest.mark.parametrize("dtype,size", [("I32", 4), ("F64", 8), ("F8_E4M3", 1)])
def test_tensor_of_an_unsupported_dtype_is_refused(tmp_path, dtype, size):
    tensors = write_tiny_dir(tmp_path)
    header, data = bf16_header_and_data({n: t for n, t in tensors.items() if n != FINAL_NORM})
    header[FINAL_NORM] = {"dtype": dtype, "shape": [16], "data_offsets": [len(data), len(data) + 16 * size]}
    raw_safetensors(tmp_path / "model.safetensors", header, data + bytes(16 * size))
    msg = load_error(tmp_path)
    assert f"tensor '{FINAL_NORM}' has unsupported dtype '{dtype}'" in msg


def test_missing_tensor_is_named(tmp_path):
    tensors = random_model(TINY).tensors
    del tensors["model.layers.1.self_attn.v_proj.weight"]
    write_tiny_dir(tmp_path, tensors)
    assert "missing tensor 'model.layers.1.self_attn.v_proj.weight'" in load_error(tmp_path)


def test_unexpected_tensor_is_refused_but_rotary_buffers_are_ignored(tmp_path):
    tensors = random_model(TINY).tensors
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.zeros(2, np.uint16)
    write_tiny_dir(tmp_path / "ok", tensors)
    assert load_model(tmp_path / "ok").config == TINY
    tensors["model.layers.0.self_attn.o_proj.bias"] = np.zeros(16, np.uint16)
    write_tiny_dir(tmp_path / "bad", tensors)
    assert "unexpected tensor 'model.layers.0.self_attn.o_proj.bias'" in load_error(tmp_path / "bad")


def test_missing_directory_config_and_weights_are_each_named(tmp_path):
    assert "no such model directory" in load_error(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    assert "config.json: missing config.json" in load_error(tmp_path / "empty")
    write_config(tmp_path / "noweights")
    assert "no model.safetensors" in load_error(tmp_path / "noweights")


def test_reading_a_small_config_allocates_about_its_size(tmp_path):
    write_tiny_dir(tmp_path)
    tracemalloc.start()
    try:
        config_from_hf(read_json_file(tmp_path / "config.json", "config"), "config.json")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"{peak / 1e6:.1f} MB to read {(tmp_path / 'config.json').stat().st_size} bytes"


def test_config_that_is_not_json_is_refused(tmp_path):
    write_tiny_dir(tmp_path)
    (tmp_path / "config.json").write_text("{'hidden_size': 16,")
    assert "config.json: config is not valid JSON" in load_error(tmp_path)


def test_unsupported_architecture_in_a_directory_names_the_config_file(tmp_path):
    write_tiny_dir(tmp_path)
    write_config(tmp_path, architectures=["FalconForCausalLM"])
    msg = load_error(tmp_path)
    assert str(tmp_path / "config.json") in msg and "FalconForCausalLM" in msg


def test_unsupported_rope_type_in_a_directory_is_refused(tmp_path):
    write_tiny_dir(tmp_path)
    write_config(tmp_path, rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    assert "unsupported rope scaling type 'dynamic'" in load_error(tmp_path)


@pytest.fixture
def opened_paths(monkeypatch):
    """Records every file opened through open()/io.open/Path.open/os.open during the test."""
    seen: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def spy(file, *a, **kw):
        seen.append(str(file))
        return real_open(file, *a, **kw)

    def os_spy(file, *a, **kw):
        seen.append(str(file))
        return real_os_open(file, *a, **kw)

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(io, "open", spy)
    monkeypatch.setattr(os, "open", os_spy)
    return seen


def test_pickle_only_directory_is_refused_without_opening_it(tmp_path, opened_paths):
    write_config(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04 not really a pickle")
    opened_paths.clear()
    msg = load_error(tmp_path)
    assert "refusing pickle checkpoint 'pytorch_model.bin'" in msg
    assert not [p for p in opened_paths if p.endswith(".bin")]


def test_pickle_file_given_as_the_path_is_refused(tmp_path, opened_paths):
    f = tmp_path / "model.pt"
    f.write_bytes(b"junk")
    opened_paths.clear()
    assert "refusing pickle checkpoint" in load_error(f)
    assert str(f) not in opened_paths


def test_pickle_next_to_safetensors_is_ignored_and_never_opened(tmp_path, opened_paths):
    tensors = write_tiny_dir(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"junk")
    opened_paths.clear()
    m = load_model(tmp_path)
    assert np.array_equal(m.tensor(EMBED), tensors[EMBED])
    assert any(p.endswith("model.safetensors") for p in opened_paths)  # the spy does see reads
    assert not [p for p in opened_paths if p.endswith(".bin")]


def test_load_model_can_cap_the_context(tmp_path):
    write_tiny_dir(tmp_path)
    assert load_model(tmp_path, max_seq=8).config.max_seq == 8
    assert load_model(tmp_path, max_seq=10_000).config.max_seq == TINY.max_seq


def test_bf16_data_at_an_odd_offset_is_read_correctly(tmp_path):
    tensors = random_model(TINY, seed=6).tensors
    write_config(tmp_path)
    header, data = bf16_header_and_data(tensors)
    raw = json.dumps(header).encode()
    raw += b" " * (1 - len(raw) % 2)  # odd header length: the data starts at an odd address
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    m = load_model(tmp_path)
    for name, words in tensors.items():
        assert np.array_equal(m.tensors[name], words) and m.tensors[name].flags.aligned


def test_saving_over_the_files_a_model_was_loaded_from_is_safe(tmp_path):
    original = random_model(TINY, seed=7)
    save_model(original, tmp_path)
    loaded = load_model(tmp_path)  # memory-mapped from tmp_path/model.safetensors
    save_model(random_model(TINY, seed=8), tmp_path)
    assert_same_model(original, loaded)
    assert not np.array_equal(load_model(tmp_path).tensor(EMBED), loaded.tensor(EMBED))


@pytest.mark.parametrize("header", [
    b"[" * 100_000 + b"]" * 100_000,
    json.dumps({EMBED: {"dtype": ["BF16"], "shape": [40, 16], "data_offsets": [0, 1280]}}).encode(),
    json.dumps({EMBED: {"dtype": "BF16", "shape": [40, 16]}}).encode(),
    json.dumps({EMBED: {"dtype": "BF16", "shape": [40, -16], "data_offsets": [0, 1280]}}).encode(),
    json.dumps({EMBED: {"dtype": "BF16", "shape": [40, 16], "data_offsets": [8, 4]}}).encode(),
], ids=["deep-nesting", "dtype-not-a-string", "no-offsets", "negative-dim", "end-before-begin"])
def test_malformed_header_entries_are_refused_as_model_file_errors(tmp_path, header):
    write_config(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(1280))
    assert "model.safetensors" in load_error(tmp_path)


def test_writer_refuses_values_that_would_overflow_f16(tmp_path):
    with pytest.raises(InvalidArgumentError, match="tensor big"):
        save_safetensors(tmp_path / "x.safetensors", {"big": np.array([1e6], np.float32)}, "F16")


# ---------------------------------------------------------------------------------------------
# hostile files: each is one printable ModelFileError line, refused before any large work

FORGED = "silu\nerror: \x1b[2K\x1b[1Gforged second line"
LONG_INT = "1" + "0" * 4400  # more digits than Python converts from text


def hostile_error(path) -> str:
    msg = load_error(path)
    assert msg.isascii() and msg.isprintable(), f"message carries raw file bytes: {msg!r}"
    assert len(msg) < 600, "file text in messages is cut short"
    return msg


def write_config_text(directory: Path, text: str) -> None:
    (directory / "config.json").write_text(text)


def config_text_with(key: str, literal: str, cfg: ModelConfig = TINY) -> str:
    """config.json text for `cfg` with `key` set to a raw JSON literal json.dumps cannot write."""
    return json.dumps({**config_to_hf(cfg), key: "@value@"}).replace('"@value@"', literal)


def shard_dir(directory: Path, tensors: dict[str, np.ndarray]) -> dict:
    """A two-shard checkpoint with an index; returns the index document."""
    write_config(directory)
    names = list(tensors)
    weight_map = {}
    for i, part in enumerate((names[:5], names[5:])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        header, data = bf16_header_and_data({n: tensors[n] for n in part})
        raw_safetensors(directory / shard, header, data)
        weight_map.update({n: shard for n in part})
    return {"metadata": {"total_size": 0}, "weight_map": weight_map}


@pytest.mark.parametrize("where", ["config", "header", "index"])
def test_integer_with_more_digits_than_python_converts_is_a_model_file_error(tmp_path, where):
    tensors = write_tiny_dir(tmp_path)
    if where == "config":
        write_config_text(tmp_path, config_text_with("vocab_size", LONG_INT))
    elif where == "header":
        header, data = bf16_header_and_data(tensors)
        text = json.dumps(header).replace("[0, ", f"[{LONG_INT}, ", 1).encode()
        (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data)
    else:
        (tmp_path / "model.safetensors").unlink()
        index = json.dumps(shard_dir(tmp_path, tensors)).replace('"total_size": 0', f'"total_size": {LONG_INT}')
        (tmp_path / "model.safetensors.index.json").write_text(index)
    assert "number too long" in hostile_error(tmp_path)


@pytest.mark.parametrize("key,literal", [
    ("rms_norm_eps", "1" + "0" * 400),
    ("rms_norm_eps", "1e400"),
    ("rope_theta", "1" + "0" * 400),
    ("rope_scaling", '{"rope_type": "llama3", "factor": 1%s, "low_freq_factor": 1.0, "high_freq_factor": 4.0, '
                     '"original_max_position_embeddings": 8192}' % ("0" * 400)),
], ids=["eps-int-beyond-float", "eps-inf", "theta-int-beyond-float", "rope-factor-int-beyond-float"])
def test_numbers_beyond_the_float_range_are_refused(tmp_path, key, literal):
    write_tiny_dir(tmp_path)
    write_config_text(tmp_path, config_text_with(key, literal))
    assert "must be a finite number" in hostile_error(tmp_path)


@pytest.mark.parametrize("key,value,named", [
    ("rms_norm_eps", 1e39, "rms_eps"),     # infinite in float32
    ("rms_norm_eps", 1e-50, "rms_eps"),    # zero in float32
    ("rms_norm_eps", 1.5, "rms_eps"),
    ("rope_theta", 1e-30, "rope_theta"),
    ("rope_theta", 1.0, "rope_theta"),
    ("rope_theta", 1e300, "rope_theta"),   # the last pair's frequency underflows float32
])
def test_numerics_float32_cannot_hold_are_refused(tmp_path, key, value, named):
    write_tiny_dir(tmp_path)
    write_config(tmp_path, **{key: value})
    assert named in hostile_error(tmp_path)


def test_rope_scaling_factor_that_underflows_the_frequencies_is_refused():
    d = llama3_8b_config()
    d["rope_scaling"]["factor"] = 1e300
    with pytest.raises(ModelFileError, match="float32 cannot hold"):
        config_from_hf(d, "c")


@pytest.mark.parametrize("value", ["false", 1, 0, [False], float("nan")], ids=repr)
def test_tie_word_embeddings_must_be_a_json_bool(tmp_path, value):
    write_tiny_dir(tmp_path)  # untied: the file holds lm_head.weight, which a guessed tie would drop
    write_config(tmp_path, tie_word_embeddings=value)
    assert "key 'tie_word_embeddings' must be true or false" in hostile_error(tmp_path)


@pytest.mark.parametrize("key,value", [
    ("architectures", [[1]]),
    ("architectures", "LlamaForCausalLM"),
    ("hidden_size", "16"),
    ("num_hidden_layers", 2.0),
    ("num_key_value_heads", [2]),
    ("head_dim", True),
    ("rms_norm_eps", "1e-5"),
    ("rope_theta", {"value": 10000}),
    ("rope_parameters", ["rope_theta", 10000.0]),
    ("rope_scaling", "llama3"),
    ("rope_scaling", {"rope_type": "llama3", "factor": "8", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}),
    ("rope_scaling", {"rope_type": ["llama3"]}),
    ("attention_bias", "no"),
    ("mlp_bias", 0),
    ("use_sliding_window", "true"),
    ("hidden_act", ["silu"]),
], ids=lambda v: v if isinstance(v, str) else type(v).__name__)
def test_config_keys_of_the_wrong_type_are_one_model_file_error(key, value):
    d = llama3_8b_config()
    d[key] = value
    with pytest.raises(ModelFileError) as ei:
        config_from_hf(d, "cfg.json")
    msg = str(ei.value)
    assert msg.startswith("cfg.json: ") and "\n" not in msg


def test_model_type_of_the_wrong_type_is_refused_when_architectures_is_absent():
    d = llama3_8b_config()
    del d["architectures"]
    d["model_type"] = ["llama"]
    with pytest.raises(ModelFileError, match="key 'model_type' must be a string"):
        config_from_hf(d, "c")


def test_config_claiming_a_billion_layers_stops_at_the_first_layer_the_file_lacks(tmp_path):
    write_tiny_dir(tmp_path)
    write_config(tmp_path, num_hidden_layers=10**9)
    assert "missing tensor 'model.layers.2.input_layernorm.weight'" in hostile_error(tmp_path)


@pytest.mark.parametrize("shape, expected", [
    ([2] * 200_000, "header holds more JSON items than 23 tensors need"),  # refused before it is parsed
    ([2] * 20_000, "malformed shape"),
    ([1] * 9, "malformed shape"),
], ids=["200000-dims", "20000-dims", "9-dims"])
def test_shape_with_more_dims_than_a_weight_has_is_refused(tmp_path, shape, expected):
    write_config(tmp_path)
    header = json.dumps({EMBED: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 2]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(2))
    assert expected in hostile_error(tmp_path)


def test_shape_whose_size_dwarfs_the_file_is_refused_without_computing_it(tmp_path):
    write_config(tmp_path)
    header = json.dumps({EMBED: {"dtype": "BF16", "shape": [10**300] * 8, "data_offsets": [0, 2]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(2))
    assert "needs more than the file's 2 data bytes" in hostile_error(tmp_path)


def shifted(name: str, by: int):
    def corrupt(header: dict) -> None:
        header[name]["data_offsets"] = [o + by for o in header[name]["data_offsets"]]
    return corrupt


def widened(name: str, by: int):
    """Moves the begin of `name` down by `by` bytes, into its neighbour, keeping the byte count valid."""
    def corrupt(header: dict) -> None:
        begin, end = header[name]["data_offsets"]
        header[name]["data_offsets"] = [begin - by, end - by]
    return corrupt


@pytest.mark.parametrize("corrupt,extra", [
    (shifted("model.layers.0.self_attn.q_proj.weight", -2), b""),   # reads the end of its neighbour
    (shifted("model.layers.0.self_attn.q_proj.weight", 2), b""),    # leaves a hole, overlaps the next
    (shifted(LM_HEAD, -2), b"\0\0"),                                 # overlap, file padded to fit
    (widened(EMBED, -4), b"\0\0\0\0"),                                # the first region not at 0
    (None, b"\0\0"),                                                 # data nobody owns at the end
], ids=["into-previous", "into-next", "last-overlaps", "hole-at-start", "trailing-bytes"])
def test_data_regions_that_do_not_tile_the_data_section_are_refused(tmp_path, corrupt, extra):
    tensors = write_tiny_dir(tmp_path)
    header, data = bf16_header_and_data(tensors)
    if corrupt is not None:
        corrupt(header)
    raw_safetensors(tmp_path / "model.safetensors", header, data + extra)
    msg = hostile_error(tmp_path)
    assert "overlaps" in msg or "belong to no tensor" in msg


def test_header_length_one_short_is_refused_instead_of_reading_every_tensor_a_byte_early(tmp_path):
    tensors = write_tiny_dir(tmp_path)
    header, data = bf16_header_and_data(tensors)
    raw = json.dumps(header).encode() + b"        "  # space padding keeps the shorter header valid JSON
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw) - 1) + raw + data)
    assert "the last 1 data bytes belong to no tensor" in hostile_error(tmp_path)


def test_empty_tensors_between_others_still_tile(tmp_path):
    tensors = random_model(TINY, seed=5).tensors
    names = list(tensors)
    with_empty = {**{n: tensors[n] for n in names[:3]},
                  "model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(0, np.uint16),
                  **{n: tensors[n] for n in names[3:]}}
    write_tiny_dir(tmp_path, with_empty)
    assert np.array_equal(load_model(tmp_path).tensor(EMBED), tensors[EMBED])


def test_running_out_of_memory_copying_an_unaligned_tensor_names_the_tensor(tmp_path, monkeypatch):
    import arcpy.model.safetensors as st

    tensors = random_model(TINY, seed=6).tensors
    write_config(tmp_path)
    header, data = bf16_header_and_data(tensors)
    raw = json.dumps(header).encode()
    raw += b" " * (1 - len(raw) % 2)  # odd header length: every BF16 tensor needs a copy
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    real = st._as_bf16_words

    def no_memory_for_big_tensors(view, dtype):
        if view.nbytes >= EMBED_BYTES:
            raise MemoryError
        return real(view, dtype)

    monkeypatch.setattr(st, "_as_bf16_words", no_memory_for_big_tensors)
    msg = hostile_error(tmp_path)
    assert f"not enough memory to read tensor '{EMBED}'" in msg


def forge_hidden_act(d: Path) -> None:
    write_tiny_dir(d)
    write_config(d, hidden_act=FORGED)


def forge_architecture(d: Path) -> None:
    write_tiny_dir(d)
    write_config(d, architectures=[FORGED])


def forge_rope_type(d: Path) -> None:
    write_tiny_dir(d)
    write_config(d, rope_scaling={"rope_type": FORGED})


def forge_tensor_name(d: Path) -> None:
    tensors = random_model(TINY).tensors
    write_tiny_dir(d, {**tensors, FORGED: np.zeros(2, np.uint16)})


def forge_dtype(d: Path) -> None:
    tensors = write_tiny_dir(d)
    header, data = bf16_header_and_data(tensors)
    header[FINAL_NORM]["dtype"] = FORGED
    raw_safetensors(d / "model.safetensors", header, data)


def forge_shard_name(d: Path) -> None:
    write_config(d)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {EMBED: FORGED + ".safetensors"}}))


def forge_index_tensor_name(d: Path) -> None:
    index = shard_dir(d, random_model(TINY).tensors)
    index["weight_map"][FORGED] = "model-00001-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("forge", [forge_hidden_act, forge_architecture, forge_rope_type, forge_tensor_name,
                                   forge_dtype, forge_shard_name, forge_index_tensor_name],
                         ids=lambda f: f.__name__.removeprefix("forge_"))
def test_text_from_a_file_is_escaped_in_messages(tmp_path, forge):
    forge(tmp_path)
    msg = hostile_error(tmp_path)  # one printable line: no raw newline or escape code
    assert ascii(FORGED)[1:-1] in msg  # the text is still there to read, escaped


def test_long_text_from_a_file_is_cut_in_messages(tmp_path):
    write_tiny_dir(tmp_path)
    write_config(tmp_path, hidden_act="x" * 100_000)
    msg = hostile_error(tmp_path)
    assert "xxxx'..." in msg and "x" * 100 not in msg


def test_link_to_a_file_that_is_not_safetensors_never_echoes_its_bytes(tmp_path):
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    write_config(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").symlink_to(secret)
    msg = hostile_error(tmp_path / "m")
    assert "not a safetensors file" in msg
    assert "root" not in msg.replace(str(tmp_path), "")
    assert str(int.from_bytes(b"root:x:0", "little")) not in msg


def test_binary_file_with_a_small_length_word_is_not_a_safetensors_file(tmp_path):
    write_config(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 6) + b"\xff\xfesecret" + bytes(8))
    msg = hostile_error(tmp_path)
    assert "not a safetensors file" in msg and "secret" not in msg and "0xff" not in msg


def test_hugging_face_cache_layout_of_relative_links_loads(tmp_path):
    """Snapshots in the Hugging Face cache are directories of links into ../../blobs."""
    src = tmp_path / "src"
    original = random_model(TINY, seed=9)
    save_model(original, src)
    (tmp_path / "blobs").mkdir()
    snapshot = tmp_path / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for i, name in enumerate(["config.json", "model.safetensors"]):
        (src / name).rename(tmp_path / "blobs" / f"blob{i}")
        (snapshot / name).symlink_to(Path("..") / ".." / "blobs" / f"blob{i}")
    assert_same_model(original, load_model(snapshot))


@pytest.mark.parametrize("target", ["fifo", "directory"])
@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "model.safetensors.index.json"])
def test_link_to_something_other_than_a_regular_file_is_refused(tmp_path, target, name):
    write_tiny_dir(tmp_path / "m")
    if name != "config.json":
        (tmp_path / "m" / "model.safetensors").unlink()
    thing = tmp_path / target
    os.mkfifo(thing) if target == "fifo" else thing.mkdir()
    (tmp_path / "m" / name).unlink(missing_ok=True)
    (tmp_path / "m" / name).symlink_to(thing)
    assert f"{name}: not a regular file" in hostile_error(tmp_path / "m")


def test_index_that_is_not_an_object_with_a_weight_map_is_refused(tmp_path):
    write_config(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps([{"weight_map": {}}]))
    assert "not a safetensors index" in hostile_error(tmp_path)


# ---------------------------------------------------------------------------------------------
# presets


def test_benchmark_presets_have_the_published_shapes_and_parameter_counts():
    smol, l8 = SHAPES["smollm2-135M"], SHAPES["llama8B"]
    assert (smol.dim, smol.n_layers, smol.n_heads, smol.n_kv_heads, smol.head_dim, smol.ffn_dim, smol.vocab) == \
        (576, 30, 9, 3, 64, 1536, 49152)
    assert smol.tied_embeddings and smol.rope_theta == 100000.0 and smol.rms_eps == 1e-5 and smol.max_seq == 2048
    assert smol.n_params == 134_515_008  # as published for SmolLM2-135M
    assert (l8.dim, l8.n_layers, l8.n_heads, l8.n_kv_heads, l8.head_dim, l8.ffn_dim, l8.vocab) == \
        (4096, 32, 32, 8, 128, 14336, 128256)
    assert not l8.tied_embeddings and l8.rope_theta == 500000.0 and l8.max_seq == 8192
    assert l8.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    assert l8.n_params == 8_030_261_248  # as published for Meta-Llama-3-8B
    assert config_from_hf(llama3_8b_config(), "c") == dataclasses.replace(l8, max_seq=131072)


def test_random_model_host_memory_peaks_under_twice_its_bf16_bytes():
    # The llama8B layout at a sixteenth of the width: 32 layers, GQA 32/8, untied.
    cfg = dataclasses.replace(SHAPES["llama8B"], dim=256, head_dim=8, ffn_dim=896, vocab=8016)
    bf16_bytes = 2 * cfg.n_params
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        model = random_model(cfg, seed=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(t.nbytes for t in model.tensors.values()) == bf16_bytes
    assert peak < 2 * bf16_bytes, f"peak {peak / 1e6:.1f} MB for {bf16_bytes / 1e6:.1f} MB of bf16"


# ---------------------------------------------------------------------------------------------
# weights that are not finite: found at load, wherever they are


NAN_WORD, INF_WORD = 0x7FC1, 0xFF80  # a NaN; minus infinity
Q_PROJ = "model.layers.1.self_attn.q_proj.weight"


def with_word(tensors: dict, name: str, at: tuple, word: int) -> dict:
    t = tensors[name].copy()
    t[at] = word
    return {**tensors, name: t}


def as_values(tensors: dict, name: str, at: tuple, value: float) -> dict:
    out = {n: bf16_to_f32(w) for n, w in tensors.items()}
    out[name][at] = value
    return out


def nonfinite_bf16(d, name, at, word):
    write_tiny_dir(d, with_word(random_model(TINY, seed=12).tensors, name, at, word))


def nonfinite_values(dtype):
    def write(d, name, at, value):
        write_config(d)
        save_safetensors(d / "model.safetensors", as_values(random_model(TINY, seed=12).tensors, name, at, value), dtype)
    return write


def nonfinite_in_a_shard(d, name, at, word):
    tensors = with_word(random_model(TINY, seed=12).tensors, name, at, word)
    (d / "model.safetensors.index.json").write_text(json.dumps(shard_dir(d, tensors)))


@pytest.mark.parametrize("write, name, at, bad, expected", [
    # an embedding row no prompt may ever touch, and the lm_head every step reads
    (nonfinite_bf16, EMBED, (39, 5), NAN_WORD, "holds a NaN weight at [39, 5]"),
    (nonfinite_bf16, LM_HEAD, (0, 0), INF_WORD, "holds a weight that is infinite in bf16 at [0, 0]"),
    (nonfinite_values("F32"), Q_PROJ, (7, 3), float("nan"), "holds a NaN weight at [7, 3]"),
    (nonfinite_values("F32"), FINAL_NORM, (2,), 3.4e38, "infinite in bf16 at [2]"),  # finite, but not in bf16
    (nonfinite_values("F16"), "model.layers.0.mlp.down_proj.weight", (15, 23), float("-inf"), "infinite in bf16"),
    (nonfinite_in_a_shard, "model.layers.1.mlp.up_proj.weight", (23, 15), NAN_WORD, "holds a NaN weight"),
], ids=["bf16-nan-unused-row", "bf16-inf-lm-head", "f32-nan", "f32-beyond-bf16", "f16-inf", "bf16-nan-in-a-shard"])
def test_a_weight_that_is_nan_or_infinite_is_refused_at_load_naming_file_and_tensor(
        tmp_path, write, name, at, bad, expected):
    write(tmp_path, name, at, bad)
    msg = hostile_error(tmp_path)
    assert f"{tmp_path}" in msg and f"tensor '{name}' " in msg and expected in msg, msg


@pytest.mark.parametrize("write, name, at, bad, expected", [
    (nonfinite_values("F32"), EMBED, (39, 5), 1e38, "holds a weight of 9.97e+37 at [39, 5]"),
    (nonfinite_values("F32"), "model.layers.0.mlp.down_proj.weight", (15, 23), -1e38, "a weight of -9.97e+37"),
    (nonfinite_values("F32"), "model.layers.1.mlp.gate_proj.weight", (0, 0), 1.01e30, "a weight of 1.01e+30"),
    (nonfinite_bf16, FINAL_NORM, (3,), 0x714A, "a weight of 1e+30 at [3]"),  # the first word past 1e30
], ids=["embedding", "ffn-down", "ffn-gate", "norm-first-word-past"])
def test_a_weight_no_trained_model_has_is_refused_at_load(tmp_path, write, name, at, bad, expected):
    write(tmp_path, name, at, bad)
    msg = hostile_error(tmp_path)
    assert f"tensor '{name}' " in msg and expected in msg and "beyond 1e+30" in msg, msg


def test_the_largest_weight_a_model_may_hold_is_the_last_bf16_word_at_most_1e30(tmp_path):
    assert bf16_to_f32(np.array([0x7149, 0x714A], dtype=np.uint16)).tolist() == pytest.approx([9.953e29, 1.0003e30],
                                                                                             rel=1e-4)
    write_tiny_dir(tmp_path, with_word(random_model(TINY, seed=12).tensors, FINAL_NORM, (3,), 0xF149))
    assert load_model(tmp_path).tensors[FINAL_NORM][3] == 0xF149  # -9.95e29: loads


@pytest.mark.parametrize("name", [EMBED, LM_HEAD, FINAL_NORM, "model.layers.1.input_layernorm.weight",
                                  "model.layers.0.post_attention_layernorm.weight"])
def test_a_tensor_no_model_works_without_that_is_all_zeros_is_refused_at_load(tmp_path, name):
    tensors = random_model(TINY, seed=12).tensors
    write_tiny_dir(tmp_path, {**tensors, name: np.zeros_like(tensors[name])})
    assert hostile_error(tmp_path) == (f"{tmp_path}: tensor '{name}' is all zeros: a model cannot work with it "
                                       "(every logit would be equal)")
    negative = np.full_like(tensors[name], 0x8000)  # -0.0 everywhere: as zero
    write_tiny_dir(tmp_path, {**tensors, name: negative})
    assert "is all zeros" in hostile_error(tmp_path)
    one = np.zeros_like(tensors[name])
    one.reshape(-1)[-1] = 0x3F80  # a single 1.0, at the very end: enough
    write_tiny_dir(tmp_path, {**tensors, name: one})
    load_model(tmp_path)


def test_the_finiteness_scan_keeps_loading_a_mapped_bf16_checkpoint_light(tmp_path):
    cfg = dataclasses.replace(TINY, dim=256, head_dim=64, ffn_dim=1024, vocab=4096)  # 10 MB of bf16
    save_model(random_model(cfg, seed=13), tmp_path)
    size = (tmp_path / "model.safetensors").stat().st_size
    tracemalloc.start()
    try:
        load_model(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size / 4, f"peak {peak / 1e6:.1f} MB to load {size / 1e6:.1f} MB"


# ---------------------------------------------------------------------------------------------
# headers near the size limit


def counted(template: bytes, n: int) -> bytes:
    """`n` copies of `template`, joined by commas, its run of '#' replaced by the copy's number."""
    at, width = template.index(b"#"), template.count(b"#")
    rows = np.tile(np.frombuffer(template + b",", np.uint8), (n, 1))
    i = np.arange(n)
    for k in range(width):
        rows[:, at + width - 1 - k] = ord("0") + i // 10**k % 10
    return rows.tobytes()[:-1]


def header_near_the_limit(kind: str) -> tuple[bytes, bytes]:
    """A header of about MAX_HEADER_BYTES, and the data it needs."""
    room = MAX_HEADER_BYTES - 100
    if kind == "tiny-entries":  # distinct empty tensors
        entry = b'"t#######":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]}'
        n = room // (len(entry) + 1)
        return b"{" + counted(entry, n) + b"}", b""
    if kind == "metadata-keys":
        entry = b'"#######":""'
        return b'{"__metadata__":{' + counted(entry, room // (len(entry) + 1)) + b"}}", b""
    if kind == "long-shape":
        return b'{"w":{"dtype":"BF16","shape":[' + b"1," * (room // 2) + b'1],"data_offsets":[0,2]}}', bytes(2)
    return b'{"w":[' + b"[]," * (room // 3) + b"[]]}", b""  # nested empty lists


def timed_error(directory):
    """(the one-line error of loading `directory`, seconds it took, peak traced bytes)."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        msg = hostile_error(directory)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return msg, time.perf_counter() - start, peak


@pytest.mark.parametrize("kind", ["tiny-entries", "metadata-keys", "long-shape", "nested-lists"])
def test_a_header_near_the_size_limit_is_refused_quickly_and_in_little_memory(tmp_path, kind):
    write_config(tmp_path)
    header, data = header_near_the_limit(kind)
    assert MAX_HEADER_BYTES - 1000 < len(header) <= MAX_HEADER_BYTES
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + data)
    msg, seconds, peak = timed_error(tmp_path)
    assert "header holds more JSON items than" in msg
    assert seconds < 2 and peak < 32 * 2**20, f"{seconds:.1f} s, peak {peak / 2**20:.0f} MiB"


def test_an_index_near_the_size_limit_is_refused_quickly_and_in_little_memory(tmp_path):
    write_config(tmp_path)
    entry = b'"t########":"model-00001-of-00002.safetensors"'
    index = b'{"weight_map":{' + counted(entry, (MAX_HEADER_BYTES - 100) // (len(entry) + 1)) + b"}}"
    (tmp_path / "model.safetensors.index.json").write_bytes(index)
    msg, seconds, peak = timed_error(tmp_path)
    assert "safetensors index holds more than 65996 JSON items" in msg
    assert seconds < 2 and peak < 32 * 2**20, f"{seconds:.1f} s, peak {peak / 2**20:.0f} MiB"


def test_a_header_listing_more_tensors_than_the_config_has_is_refused(tmp_path):
    tensors = write_tiny_dir(tmp_path)
    extra = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": np.zeros(0, np.uint16) for i in range(100)}
    write_tiny_dir(tmp_path, {**tensors, **extra})
    msg = hostile_error(tmp_path)
    assert f"lists {len(tensors) + 100} tensors, more than the 23 a checkpoint of this config may hold" in msg


def test_a_checkpoint_with_every_entry_a_config_tolerates_still_loads(tmp_path):
    cfg = dataclasses.replace(TINY, qkv_bias=True, tied_embeddings=True)
    tensors = random_model(cfg, seed=15).tensors
    extra = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": np.zeros(2, np.uint16) for i in range(cfg.n_layers)}
    write_tiny_dir(tmp_path, {**tensors, LM_HEAD: tensors[EMBED], **extra}, cfg)  # a tied lm_head, stored anyway
    assert load_model(tmp_path).config == cfg
