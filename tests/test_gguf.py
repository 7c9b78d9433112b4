"""GGUF files: the header walk, config and tensors (dequantized, q/k rows restored), the tokenizer.

Model files are written with gguf.GGUFWriter in the converter's layout (q/k rows permuted for
interleaved RoPE); hostile files are written byte by byte. Every bad file must be one
ModelFileError line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFWriter
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from tokenizers import pre_tokenizers

from arcpy.demo import FETCH_HINT, demo_model_path
from arcpy.devices.reference import ReferenceModel
from arcpy.devices.reference_ops import rope
from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.loading import load_gguf
from arcpy.model import (
    EMBED,
    LM_HEAD,
    ModelConfig,
    QuantTensor,
    RopeScaling,
    bf16_to_f32,
    f32_to_bf16,
    load_model,
    open_gguf,
    random_model,
    rope_inv_freq,
    unpermute_rotary_rows,
)
from arcpy.model import dequantize as dequantize_rows
from arcpy.text import gguf_text_spec
from arcpy.vocabulary import Vocabulary

# ---------------------------------------------------------------------------------------------
# a tiny byte-level vocabulary: three control tokens, the 256 byte symbols, six merged tokens

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BYTE_SYMBOLS = sorted(pre_tokenizers.ByteLevel.alphabet())
MERGES = ["h e", "\u0120 t", "\u0120t he", "c a", "ca t", "\u0120 cat", "1 2", "3 4"]
TOKENS = SPECIALS + BYTE_SYMBOLS + [m.replace(" ", "") for m in MERGES]
TYPES = [3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS))
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
BYTE_VOCAB = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": TOKENS,
              "tokenizer.ggml.token_type": TYPES, "tokenizer.ggml.merges": MERGES,
              "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
              "tokenizer.ggml.add_bos_token": False, "tokenizer.chat_template": TEMPLATE}
V = len(TOKENS)

TINY = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96, vocab=V, max_seq=64,
                   rope_theta=10000.0)
# Every row a multiple of 256, the block of the K-quants.
WIDE = ModelConfig(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=256, vocab=V, max_seq=64)

HF_TO_GGUF = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str:
    top = {EMBED: "token_embd.weight", "model.norm.weight": "output_norm.weight", LM_HEAD: "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{HF_TO_GGUF[rest.removesuffix('.weight')]}.weight"


def converter_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter: within each head, row j*half + i moves to row 2i + j."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_meta(cfg: ModelConfig) -> dict:
    return {"llama.embedding_length": cfg.dim, "llama.block_count": cfg.n_layers,
            "llama.attention.head_count": cfg.n_heads, "llama.attention.head_count_kv": cfg.n_kv_heads,
            "llama.feed_forward_length": cfg.ffn_dim, "llama.context_length": cfg.max_seq,
            "llama.rope.freq_base": float(cfg.rope_theta), "llama.rope.dimension_count": cfg.head_dim,
            "llama.attention.key_length": cfg.head_dim, "llama.attention.value_length": cfg.head_dim,
            "llama.attention.layer_norm_rms_epsilon": float(cfg.rms_eps)}


def fused_gate_up(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """An expert layer's gate and up tensors as the converter writes them apart, (experts, f, cols)
    or biases (experts, f), as llama.cpp's fused ffn_gate_up_exps holds them: each expert's gate
    rows, then its up rows, (experts, 2 f, ...), float32."""
    return np.ascontiguousarray(np.concatenate([gate, up], axis=1), np.float32)


def put(w: GGUFWriter, key: str, value) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int) and value < 0:
        w.add_int32(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        w.add_array(key, list(value))


def gguf_tensors(model, permute: bool = True) -> dict[str, np.ndarray]:
    """The model's tensors as float32 under GGUF names, q/k rows in the converter's order."""
    cfg, out = model.config, {}
    for hf, words in model.tensors.items():
        x = bf16_to_f32(words)
        if permute and hf.endswith("q_proj.weight"):
            x = converter_permute(x, cfg.n_heads)
        elif permute and hf.endswith("k_proj.weight"):
            x = converter_permute(x, cfg.n_kv_heads)
        out[gguf_name(hf)] = x
    return out


def write_gguf(path: Path, tensors: dict[str, np.ndarray], meta: dict, arch: str = "llama",
               types: dict[str, Q] | None = None) -> Path:
    """A GGUF file of `tensors` (GGUF names), each quantized to types[name] or stored as it is
    (uint8 arrays are blocks already quantized to types[name])."""
    w = GGUFWriter(path, arch)
    for key, value in meta.items():
        put(w, key, value)
    for name, x in tensors.items():
        qtype = (types or {}).get(name)
        if qtype is None:
            w.add_tensor(name, np.ascontiguousarray(x))
        elif x.dtype == np.uint8:  # blocks already quantized
            w.add_tensor(name, x, raw_dtype=qtype)
        elif qtype == Q.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, quantize(x, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_model(path: Path, model, meta_overrides: dict | None = None, drop=(), **kw) -> Path:
    meta = {**llama_meta(model.config), **BYTE_VOCAB, **(meta_overrides or {})}
    tensors = {k: v for k, v in gguf_tensors(model).items() if k not in drop}
    return write_gguf(path, tensors, meta, **kw)


def load_error(path, loader=load_gguf) -> str:
    with pytest.raises(ModelFileError) as ei:
        loader(path)
    msg = str(ei.value)
    assert "\n" not in msg, "error messages are one line"
    return msg


# ---------------------------------------------------------------------------------------------
# the q/k row order


def test_unpermute_inverts_the_converters_row_order():
    rng = np.random.default_rng(0)
    for n_heads, head_dim in [(4, 16), (2, 8), (1, 64)]:
        w = rng.standard_normal((n_heads * head_dim, 12)).astype(np.float32)
        permuted = converter_permute(w, n_heads)
        assert not np.array_equal(permuted, w)
        assert np.array_equal(unpermute_rotary_rows(permuted, n_heads), w)
        assert np.array_equal(converter_permute(unpermute_rotary_rows(w, n_heads), n_heads), w)
    # One head of 4 rows: the converter interleaves the halves (0 1 | 2 3 -> 0 2 1 3).
    assert unpermute_rotary_rows(np.array([0, 2, 1, 3]), 1).tolist() == [0, 1, 2, 3]


def interleaved_rope(x: np.ndarray, pos: int, inv_freq: np.ndarray) -> np.ndarray:
    """RoPE on pairs (2i, 2i+1), as llama.cpp runs a "llama" model."""
    angle = np.float32(pos) * inv_freq
    cos, sin = np.cos(angle), np.sin(angle)
    even, odd = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2], out[:, 1::2] = even * cos - odd * sin, odd * cos + even * sin
    return out


def test_interleaved_rope_on_permuted_rows_is_rotate_half_rope_on_the_original():
    rng = np.random.default_rng(1)
    n_heads, head_dim, dim = 3, 8, 10
    w = rng.standard_normal((n_heads * head_dim, dim)).astype(np.float32)
    x = rng.standard_normal(dim).astype(np.float32)
    inv_freq = (10000.0 ** (-np.arange(0, head_dim, 2) / head_dim)).astype(np.float32)
    hf = rope((w @ x).reshape(n_heads, head_dim), 5, inv_freq)
    gg = interleaved_rope((converter_permute(w, n_heads) @ x).reshape(n_heads, head_dim), 5, inv_freq)
    # Attention only takes dot products of q and k: the same per-head row order on both is the same.
    assert np.allclose(converter_permute(hf.reshape(-1), n_heads), gg.reshape(-1), atol=1e-5)


# ---------------------------------------------------------------------------------------------
# config and tensors


@pytest.mark.parametrize("tied", [False, True])
def test_f32_file_loads_every_word_exactly_and_decodes_like_the_source(tmp_path, tied):
    source = random_model(dataclasses.replace(TINY, tied_embeddings=tied), seed=4)
    model, _ = load_gguf(write_model(tmp_path / "m.gguf", source))
    assert model.config == source.config
    assert (LM_HEAD in model.tensors) is not tied
    for name, words in source.tensors.items():
        assert np.array_equal(model.tensors[name], words), name
    prompt = [5, 40, 77, 3]
    assert ReferenceModel(model).greedy(prompt, 12) == ReferenceModel(source).greedy(prompt, 12)


def test_rms_eps_theta_context_and_heads_come_from_the_metadata(tmp_path):
    cfg = dataclasses.replace(TINY, rms_eps=1e-6, rope_theta=500000.0, max_seq=48, n_kv_heads=1)
    model, _ = load_gguf(write_model(tmp_path / "m.gguf", random_model(cfg)))
    c = model.config
    assert (c.n_kv_heads, c.max_seq, c.rope_theta) == (1, 48, 500000.0)
    assert c.rms_eps == pytest.approx(1e-6, rel=1e-6)


# Bound on |loaded - source| relative to the tensor's largest value, per storage type.
QUANTIZED = {Q.F16: 1e-2, Q.BF16: 0.0, Q.Q8_0: 2e-2, Q.Q5_0: 8e-2, Q.Q5_1: 8e-2, Q.Q4_0: 0.16, Q.Q4_1: 0.16,
             Q.MXFP4: 0.25}
KEPT = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4, Q.IQ4_NL, Q.IQ4_XS, Q.Q5_0,
        Q.Q5_1, Q.Q3_K, Q.Q2_K)  # held quantized: arc.h's formats
KEPT_NOTE = "the GPU keeps " + ", ".join(q.name for q in KEPT) + " quantized"


def held(t) -> np.ndarray:
    """A loaded tensor's weights as float32: bf16 words converted, a QuantTensor dequantized."""
    return dequantize_rows(t) if isinstance(t, QuantTensor) else bf16_to_f32(t)


def unpermuted(hf: str, x: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """A loaded q or k tensor's rows back in the file's order (others as they are)."""
    heads = {"q_proj": cfg.n_heads, "k_proj": cfg.n_kv_heads}.get(hf.split(".")[-2])
    return converter_permute(x, heads) if heads else x


@pytest.mark.parametrize("quantized", [True, False], ids=["quantized", "bf16"])
@pytest.mark.parametrize("qtype", list(QUANTIZED), ids=lambda q: q.name)
def test_quantized_weights_load_as_their_values_kept_quantized_or_rounded_to_bf16(tmp_path, qtype, quantized):
    source = random_model(TINY, seed=5)
    tensors = gguf_tensors(source)
    types = {name: qtype for name, x in tensors.items() if x.ndim == 2}
    path = write_gguf(tmp_path / "m.gguf", tensors, {**llama_meta(TINY), **BYTE_VOCAB}, types=types)
    model, _ = load_gguf(path, quantized=quantized)
    kept = quantized and qtype in KEPT
    for hf, words in source.tensors.items():
        name = gguf_name(hf)
        loaded = model.tensors[hf]
        matrix = name in types and name != "token_embd.weight"
        assert isinstance(loaded, QuantTensor) is (kept and matrix), name
        if name in types and qtype not in (Q.F16, Q.BF16):
            stored = dequantize(quantize(tensors[name], qtype), qtype)
            back = unpermuted(hf, held(loaded), TINY)
            # Kept quantized: the stored values exactly; else rounded to bf16.
            assert np.array_equal(back, stored if isinstance(loaded, QuantTensor) else bf16_to_f32(f32_to_bf16(stored))), name
        src = bf16_to_f32(words)
        err = np.abs(held(loaded) - src).max()
        assert err <= QUANTIZED[qtype] * np.abs(src).max() if name in types else err == 0, (name, err)
    assert model.notes == ()  # every type here is kept or unquantized


def test_tensors_of_a_type_without_a_gpu_kernel_are_dequantized_and_the_note_says_which(tmp_path):
    """TQ2_0 has no arc format: its matrices are made bf16 (their values rounded), and the model's
    one note lists them by name and layers."""
    source = random_model(WIDE, seed=5)
    tensors = gguf_tensors(source)
    types = {name: Q.TQ2_0 for name, x in tensors.items() if x.ndim == 2 and name != "token_embd.weight"}
    path = write_gguf(tmp_path / "m.gguf", tensors, {**llama_meta(WIDE), **BYTE_VOCAB}, types=types)
    model, _ = load_gguf(path, quantized=True)
    for hf in source.tensors:
        name = gguf_name(hf)
        if name in types:
            loaded = model.tensors[hf]
            assert not isinstance(loaded, QuantTensor), name
            stored = bf16_to_f32(f32_to_bf16(dequantize(quantize(tensors[name], Q.TQ2_0), Q.TQ2_0)))
            assert np.array_equal(unpermuted(hf, held(loaded), WIDE), stored), name
    assert model.notes == (f"m.gguf: 15 quantized tensors dequantized to bf16 ({KEPT_NOTE}): TQ2_0 attn_q.weight "
                           "(blk 0-1); TQ2_0 attn_k.weight (blk 0-1); TQ2_0 attn_v.weight (blk 0-1); TQ2_0 "
                           "attn_output.weight (blk 0-1); TQ2_0 ffn_gate.weight (blk 0-1); TQ2_0 ffn_up.weight "
                           "(blk 0-1); TQ2_0 ffn_down.weight (blk 0-1); TQ2_0 output.weight",)


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.IQ4_XS], ids=lambda q: q.name)
def test_iq4_matrices_are_kept_packed_with_the_files_values(tmp_path, qtype):
    """The gguf package does not quantize to the IQ4 types: random blocks of small scales, written
    as they are, load as QuantTensors whose weights are the package's dequantization of them."""
    tensors = gguf_tensors(random_model(WIDE, seed=6))
    rng = np.random.default_rng(6)
    block, size = GGML_QUANT_SIZES[qtype]
    types = {}
    for name, x in tensors.items():
        if x.ndim == 2 and name != "token_embd.weight":
            raw = rng.integers(0, 256, (x.size // block, size), dtype=np.uint8)
            raw[:, 0:2] = (rng.standard_normal((x.size // block, 1)) * 0.002).astype(np.float16).view(np.uint8)
            types[name], tensors[name] = qtype, raw.reshape(x.shape[0], -1)
    path = write_gguf(tmp_path / "m.gguf", tensors, {**llama_meta(WIDE), **BYTE_VOCAB}, types=types)
    model, _ = load_gguf(path, quantized=True)
    assert model.notes == ()
    for hf in model.tensors:
        name = gguf_name(hf)
        if name in types:
            loaded = model.tensors[hf]
            assert isinstance(loaded, QuantTensor) and loaded.format_name == qtype.name, name
            assert np.array_equal(unpermuted(hf, held(loaded), WIDE), dequantize(tensors[name], qtype)), name


def test_a_layer_whose_gate_and_up_differ_in_type_holds_both_in_bf16_and_says_why(tmp_path):
    """The GPU reads a layer's [gate; up] as one matrix of one format: where a file gives them two
    types, both are made bf16 (their values rounded), the other layers stay quantized."""
    source = random_model(TINY, seed=7)
    tensors = gguf_tensors(source)
    types = {name: Q.Q8_0 for name, x in tensors.items() if x.ndim == 2}
    types["blk.0.ffn_up.weight"] = Q.Q4_0
    path = write_gguf(tmp_path / "mixed.gguf", tensors, {**llama_meta(TINY), **BYTE_VOCAB}, types=types)
    model, _ = load_gguf(path, quantized=True)
    for layer, held_quantized in ((0, False), (1, True)):
        for part in ("gate", "up"):
            hf = f"model.layers.{layer}.mlp.{part}_proj.weight"
            name = gguf_name(hf)
            loaded = model.tensors[hf]
            assert isinstance(loaded, QuantTensor) is held_quantized, hf
            stored = dequantize(quantize(tensors[name], types[name]), types[name])
            want = stored if held_quantized else bf16_to_f32(f32_to_bf16(stored))
            assert np.array_equal(held(loaded), want), hf
    assert isinstance(model.tensors["model.layers.0.mlp.down_proj.weight"], QuantTensor)
    assert model.format_of("model.layers.1.mlp.gate_proj.weight") == model.format_of("model.layers.1.mlp.up_proj.weight")
    assert model.notes == (f"mixed.gguf: 2 quantized tensors dequantized to bf16 ({KEPT_NOTE}, and reads a layer's "
                           "ffn_gate and ffn_up as one matrix of one type (of two types in blk 0)): Q8_0 ffn_gate.weight "
                           "(blk 0); Q4_0 ffn_up.weight (blk 0)",)


def test_quantized_is_true_or_false(tmp_path):
    path = write_model(tmp_path / "m.gguf", random_model(TINY, seed=5))
    with pytest.raises(InvalidArgumentError, match=r"quantized must be True, False or None \(auto\), got 'no'"):
        load_gguf(path, quantized="no")


def test_the_main_job_prints_the_loaders_note_in_one_line(tmp_path):
    tensors = gguf_tensors(random_model(WIDE, seed=5))
    types = {name: Q.TQ2_0 for name in tensors if name.startswith("blk.0.ffn_") and name != "blk.0.ffn_norm.weight"}
    types["blk.1.attn_q.weight"] = Q.Q4_0  # kept quantized
    path = write_gguf(tmp_path / "m.gguf", tensors, {**llama_meta(WIDE), **BYTE_VOCAB}, types=types)
    out = subprocess.run([sys.executable, "-m", "arcpy.decode", "--model", str(path), "--prompt-ids", "5 40", "-n", "3",
                          "--backend", "numpy", "--weights", "quantized"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert [line for line in out.stderr.splitlines() if line.startswith("note: m.gguf")] == [
        f"note: m.gguf: 3 quantized tensors dequantized to bf16 ({KEPT_NOTE}): TQ2_0 ffn_gate.weight (blk 0); "
        "TQ2_0 ffn_up.weight (blk 0); TQ2_0 ffn_down.weight (blk 0)"]


def random_k_blocks(qtype: Q, n_blocks: int, rng) -> np.ndarray:
    """Random K-quant blocks with small, finite fp16 scales where the format keeps them."""
    size = {Q.Q2_K: 84, Q.Q3_K: 110, Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}[qtype]
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    scales = np.full((n_blocks, 1), 0.01, dtype=np.float16).view(np.uint8)
    where = {Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}[qtype]
    for at in where:
        blocks[:, at:at + 2] = scales
    return blocks


def write_k_model(path: Path, cfg: ModelConfig, qtype: Q, rng, tied: bool = False) -> dict[str, np.ndarray]:
    """A GGUF file of random `qtype` blocks for every matrix (and the embedding) -> the gguf
    package's dequantization of each, by GGUF name."""
    source = random_model(dataclasses.replace(cfg, tied_embeddings=tied), seed=6)
    tensors = gguf_tensors(source)
    w = GGUFWriter(path, "llama")
    for key, value in {**llama_meta(cfg), **BYTE_VOCAB}.items():
        put(w, key, value)
    stored = {}
    for name, x in tensors.items():
        if x.ndim == 2:
            raw = random_k_blocks(qtype, x.size // 256, rng).reshape(x.shape[0], -1)
            stored[name] = dequantize(raw, qtype)
            w.add_tensor(name, raw, raw_dtype=qtype)
        else:
            w.add_tensor(name, x)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return stored


@pytest.mark.parametrize("qtype", [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda q: q.name)
def test_k_quant_weights_load_as_the_gguf_package_dequantizes_them(tmp_path, qtype):
    stored = write_k_model(tmp_path / "m.gguf", WIDE, qtype, np.random.default_rng(6))
    model, _ = load_gguf(tmp_path / "m.gguf", quantized=True)
    kept = qtype in KEPT
    q = model.tensors["model.layers.1.self_attn.q_proj.weight"]
    k = model.tensors["model.layers.0.self_attn.k_proj.weight"]
    down = model.tensors["model.layers.0.mlp.down_proj.weight"]
    assert all(isinstance(t, QuantTensor) is kept for t in (q, k, down))
    expect = (lambda x: x) if kept else (lambda x: bf16_to_f32(f32_to_bf16(x)))
    assert np.array_equal(converter_permute(held(q), WIDE.n_heads), expect(stored["blk.1.attn_q.weight"]))
    assert np.array_equal(converter_permute(held(k), WIDE.n_kv_heads), expect(stored["blk.0.attn_k.weight"]))
    assert np.array_equal(held(down), expect(stored["blk.0.ffn_down.weight"]))
    # The embedding is bf16 whatever its type: a step reads one row of it.
    assert np.array_equal(model.tensors[EMBED], f32_to_bf16(stored["token_embd.weight"]))
    assert (len(model.notes) == 1 and "15 quantized tensors dequantized to bf16" in model.notes[0]
            and f"{qtype.name} ffn_down.weight (blk 0-1)" in model.notes[0]) is not kept


@pytest.mark.parametrize("qtype", [Q.Q6_K, Q.Q3_K], ids=lambda q: q.name)
def test_a_tied_model_gets_its_embedding_kept_quantized_as_its_lm_head(tmp_path, qtype):
    stored = write_k_model(tmp_path / "m.gguf", WIDE, qtype, np.random.default_rng(7), tied=True)
    checkpoint = open_gguf(tmp_path / "m.gguf")
    model = checkpoint.model()
    embed = model.tensors[EMBED]
    assert np.array_equal(embed, f32_to_bf16(stored["token_embd.weight"]))
    if qtype in KEPT:
        # Untied: the same blocks twice, bf16 for the embedding's one row a step, quantized for the head.
        assert checkpoint.config == model.config and not model.config.tied_embeddings
        head = model.tensors[LM_HEAD]
        assert isinstance(head, QuantTensor) and np.array_equal(held(head), stored["token_embd.weight"])
        assert model.weight_bytes == sum(t.nbytes for n, t in model.tensors.items() if n != EMBED) + 2 * WIDE.dim
    else:
        assert model.config.tied_embeddings and LM_HEAD not in model.tensors
        assert "quantized): Q3_K token_embd.weight; Q3_K attn_q" in model.notes[0]  # the head it serves as is bf16
    bf16, _ = load_gguf(tmp_path / "m.gguf", quantized=False)
    assert bf16.config.tied_embeddings and not bf16.quantized and bf16.notes == ()
    # The same forward but for the weights' rounding to bf16.
    a, b = ReferenceModel(model).forward(5, 0), ReferenceModel(bf16).forward(5, 0)
    assert np.abs(a - b).max() <= 0.02 * np.abs(b).max()


def test_load_model_reads_a_gguf_file_and_caps_the_context(tmp_path):
    source = random_model(TINY, seed=7)
    path = write_model(tmp_path / "m.gguf", source)
    model = load_model(path, max_seq=16)
    assert model.config == dataclasses.replace(source.config, max_seq=16)
    assert all(np.array_equal(model.tensors[k], v) for k, v in source.tensors.items())
    assert load_gguf(path, max_seq=1000)[0].config.max_seq == TINY.max_seq


def llama3_divisors(cfg: ModelConfig, rs: RopeScaling) -> np.ndarray:
    """The rope_freqs table llama.cpp's converter writes for Llama 3 scaling."""
    wl = 2 * math.pi / cfg.rope_theta ** (-np.arange(0, cfg.head_dim, 2) / cfg.head_dim)
    orig = rs.original_max_position_embeddings
    smooth = (orig / wl - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    mid = 1 / ((1 - smooth) / rs.factor + smooth)
    return np.where(wl < orig / rs.high_freq_factor, 1.0,
                    np.where(wl > orig / rs.low_freq_factor, rs.factor, mid)).astype(np.float32)


@pytest.mark.parametrize("head_dim", [16, 64])  # one pair in the blend band, several
def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tmp_path, head_dim):
    rs = RopeScaling(8.0, 1.0, 4.0, 8192)
    cfg = dataclasses.replace(TINY, dim=128, n_heads=2, n_kv_heads=1, head_dim=head_dim, rope_theta=500000.0,
                              rope_scaling=rs)
    source = random_model(cfg, seed=8)
    tensors = {**gguf_tensors(source), "rope_freqs.weight": llama3_divisors(cfg, rs)}
    model, _ = load_gguf(write_gguf(tmp_path / "m.gguf", tensors, {**llama_meta(cfg), **BYTE_VOCAB}))
    got = model.config
    assert got.rope_scaling is not None and got.rope_scaling.factor == 8.0
    assert np.allclose(rope_inv_freq(got), rope_inv_freq(cfg), rtol=1e-5, atol=0)
    assert dataclasses.replace(got, rope_scaling=rs) == cfg


def test_rope_freqs_that_are_not_llama3_scaling_are_refused(tmp_path):
    cfg = dataclasses.replace(TINY, head_dim=64, n_heads=1, n_kv_heads=1, rope_theta=500000.0)
    divisors = np.random.default_rng(9).uniform(1.0, 8.0, 32).astype(np.float32)
    tensors = {**gguf_tensors(random_model(cfg)), "rope_freqs.weight": divisors}
    path = write_gguf(tmp_path / "m.gguf", tensors, {**llama_meta(cfg), **BYTE_VOCAB})
    assert "does not hold a Llama 3 frequency scaling" in load_error(path)


# ---------------------------------------------------------------------------------------------
# qwen2: q/k/v biases, and q/k rows as Hugging Face orders them (NeoX RoPE rotates halves)


QWEN = dataclasses.replace(TINY, qkv_bias=True, rope_theta=1000000.0, rms_eps=1e-6, tied_embeddings=True)


def qwen2_file(path: Path, model, drop=(), types: dict | None = None) -> Path:
    """The model as llama.cpp's converter writes a Qwen2 model: qwen2.* keys, biases, no row permutation."""
    tensors = {}
    for hf, words in model.tensors.items():
        if hf.endswith(".bias"):  # model.layers.N.self_attn.q_proj.bias -> blk.N.attn_q.bias
            parts = hf.split(".")
            name = f"blk.{parts[2]}.attn_{parts[4][0]}.bias"
        else:
            name = gguf_name(hf)
        tensors[name] = bf16_to_f32(words)
    meta = {k.replace("llama.", "qwen2."): v for k, v in llama_meta(model.config).items()}
    meta = {**meta, **BYTE_VOCAB, "tokenizer.ggml.pre": "qwen2"}
    return write_gguf(path, {k: v for k, v in tensors.items() if k not in drop},
                      {k: v for k, v in meta.items() if k not in drop}, arch="qwen2", types=types)


@pytest.mark.parametrize("tied", [True, False])
def test_qwen2_file_loads_every_word_exactly_with_its_biases_and_decodes_like_the_source(tmp_path, tied):
    source = random_model(dataclasses.replace(QWEN, tied_embeddings=tied), seed=16)
    model, text = load_gguf(qwen2_file(tmp_path / "q.gguf", source))
    assert model.config == source.config
    assert set(model.tensors) == set(source.tensors)
    for name, words in source.tensors.items():
        assert np.array_equal(model.tensors[name], words), name
    got, want = ReferenceModel(model), ReferenceModel(source)
    for pos, token in enumerate([5, 40, 77, 3, 120]):
        assert np.array_equal(got.forward(token, pos), want.forward(token, pos)), pos
    assert ReferenceModel(model).greedy([5, 40], 12) == ReferenceModel(source).greedy([5, 40], 12)
    assert text.tokenizer.decode(text.tokenizer.encode("the cat").ids) == "the cat"


@pytest.mark.parametrize("quantized", [True, False], ids=["quantized", "bf16"])
def test_qwen2_quantized_q_and_k_rows_stay_where_the_file_has_them(tmp_path, quantized):
    source = random_model(QWEN, seed=17)
    types = {"blk.0.attn_q.weight": Q.Q8_0, "blk.1.attn_k.weight": Q.Q8_0}
    model, _ = load_gguf(qwen2_file(tmp_path / "q.gguf", source, types=types), quantized=quantized)
    for hf in ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"]:
        stored = dequantize(quantize(bf16_to_f32(source.tensors[hf]), Q.Q8_0), Q.Q8_0)
        got = model.tensors[hf]
        assert isinstance(got, QuantTensor) is quantized
        assert np.array_equal(held(got), stored if quantized else bf16_to_f32(f32_to_bf16(stored))), hf


@pytest.mark.parametrize("drop, expected", [
    ("blk.1.attn_v.bias", "missing tensor 'blk.1.attn_v.bias'"),
    ("qwen2.block_count", "missing metadata 'qwen2.block_count'"),
])
def test_qwen2_file_without_a_bias_or_a_key_is_refused_by_name(tmp_path, drop, expected):
    assert expected in load_error(qwen2_file(tmp_path / "q.gguf", random_model(QWEN, seed=18), drop=[drop]))


# ---------------------------------------------------------------------------------------------
# the tokenizer


def ids_of(*pieces: str) -> list[int]:
    return [TOKENS.index(p) for p in pieces]


def test_byte_level_vocabulary_encodes_by_merge_rank_and_decodes_back(tmp_path):
    _, text = load_gguf(write_model(tmp_path / "m.gguf", random_model(TINY)))
    tok = text.tokenizer
    assert tok.encode("the cat").ids == ids_of("t", "he", "\u0120cat")
    assert tok.encode(" the").ids == ids_of("\u0120the")
    assert tok.encode("<|im_start|>the<|im_end|>").ids == [1, *ids_of("t", "he"), 2]
    for s in ["the cat sat\n\ton the mat", "Grüße, 東京! 1234", "  two  spaces  "]:
        assert tok.decode(tok.encode(s).ids) == s
    assert (text.bos_id, text.eos_ids, text.add_bos, text.chat_template) == (1, (2,), False, TEMPLATE)


def zero_scales_q8_0(x: np.ndarray) -> np.ndarray:
    """Q8_0 blocks of `x` with every scale zero: each weight dequantizes to 0."""
    blocks = quantize(x, Q.Q8_0).copy()
    per_block = GGML_QUANT_SIZES[Q.Q8_0][1]
    view = blocks.reshape(blocks.shape[0], -1, per_block)
    view[..., :2] = 0  # the f16 scale leads each block
    return blocks


@pytest.mark.parametrize("quantized", [True, False], ids=["kept-quantized", "bf16"])
@pytest.mark.parametrize("name", ["token_embd.weight", "output.weight"])
def test_a_q8_0_embedding_or_output_whose_scales_are_all_zero_is_a_load_error(tmp_path, name, quantized):
    tensors = gguf_tensors(random_model(TINY, seed=4))
    types = {n: Q.Q8_0 for n, x in tensors.items() if x.ndim == 2}
    tensors[name] = zero_scales_q8_0(tensors[name])
    path = write_gguf(tmp_path / "m.gguf", tensors, {**llama_meta(TINY), **BYTE_VOCAB}, types=types)
    hf = {"token_embd.weight": EMBED, "output.weight": LM_HEAD}[name]
    assert load_error(path, lambda p: load_gguf(p, quantized=quantized)) == (
        f"{path}: tensor '{hf}' is all zeros: a model cannot work with it (every logit would be equal)")


def test_an_output_norm_of_zeros_is_a_load_error(tmp_path):
    tensors = gguf_tensors(random_model(TINY, seed=4))
    tensors["output_norm.weight"] = np.zeros_like(tensors["output_norm.weight"])
    path = write_gguf(tmp_path / "m.gguf", tensors, {**llama_meta(TINY), **BYTE_VOCAB})
    assert "tensor 'model.norm.weight' is all zeros" in load_error(path)


@pytest.mark.parametrize("name, at", [("token_embd.weight", (3, 7)), ("blk.1.ffn_down.weight", (5, 9)),
                                      ("blk.0.ffn_gate.weight", (0, 0))])
def test_a_bf16_weight_of_1e38_is_a_load_error_naming_the_tensor(tmp_path, name, at):
    tensors = gguf_tensors(random_model(TINY, seed=4))
    tensors[name][at] = 1e38
    types = {n: Q.BF16 for n, x in tensors.items() if x.ndim == 2}
    path = write_gguf(tmp_path / "m.gguf", tensors, {**llama_meta(TINY), **BYTE_VOCAB}, types=types)
    msg = load_error(path)
    assert f"tensor '{name}' holds a weight of 9.97e+37 at {list(at)}: no trained model has one beyond 1e+30" in msg


def test_a_bf16_file_loads_as_views_of_its_mapping_whatever_its_ffn(tmp_path):
    """BF16 data is bf16 words already: the loader keeps views of the mapped file, reads each
    once (the finiteness scan) and copies nothing, so loading scales with the bytes read. A file
    of zero weights and a wide FFN (the fuzzer's 0.4 GiB one took 40 s) is the case here."""
    cfg = dataclasses.replace(TINY, ffn_dim=32768)
    tensors = gguf_tensors(random_model(TINY, seed=4))
    for i in range(cfg.n_layers):
        tensors[f"blk.{i}.ffn_gate.weight"] = tensors[f"blk.{i}.ffn_up.weight"] = np.zeros((32768, 64), np.float32)
        tensors[f"blk.{i}.ffn_down.weight"] = np.zeros((64, 32768), np.float32)
    types = {n: Q.BF16 for n, x in tensors.items() if x.ndim == 2}
    path = write_gguf(tmp_path / "m.gguf", tensors, {**llama_meta(cfg), **BYTE_VOCAB}, types=types)
    tracemalloc.start()
    try:
        model, _ = load_gguf(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    ffn = model.tensors["model.layers.1.mlp.down_proj.weight"]
    assert ffn.shape == (64, 32768) and not ffn.flags.owndata and not ffn.flags.writeable
    size = path.stat().st_size
    assert size > 24e6 and peak < size / 8, f"peak {peak / 1e6:.1f} MB to load {size / 1e6:.1f} MB"


def test_a_chat_template_larger_than_any_real_one_is_a_load_error_naming_the_file(tmp_path):
    path = write_model(tmp_path / "m.gguf", random_model(TINY), {"tokenizer.chat_template": "{{ 'x' }}" * 120_000})
    assert load_error(path) == (f"{path}: key 'tokenizer.chat_template': 1,080,000 characters is more than a chat "
                                "template may have (131,072; real ones have a few thousand to tens of thousands)")


@pytest.mark.parametrize("pre, pieces", [
    ("smollm", ["1", "2", "3", "4"]),    # digits one by one: no merge reaches across them
    ("gpt-2", ["12", "34"]),             # GPT-2's split keeps the number whole
    ("default", ["12", "3", "4"]),       # llama.cpp's default cuts runs of digits in threes: 123|4
    ("llama-bpe", ["12", "3", "4"]),     # Llama 3's split cuts numbers into threes: 123|4
])
def test_pre_tokenizer_name_picks_the_split(tmp_path, pre, pieces):
    meta = {"tokenizer.ggml.pre": pre}
    _, text = load_gguf(write_model(tmp_path / "m.gguf", random_model(TINY), meta))
    assert text.tokenizer.encode("1234").ids == ids_of(*pieces)


def test_eot_joins_eos_and_llama3_vocabularies_start_with_bos_by_default(tmp_path):
    meta = {"tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.eot_token_id": 0}
    path = tmp_path / "m.gguf"
    w_meta = {k: v for k, v in {**BYTE_VOCAB, **meta}.items() if k != "tokenizer.ggml.add_bos_token"}
    write_gguf(path, gguf_tensors(random_model(TINY)), {**llama_meta(TINY), **w_meta})
    _, text = load_gguf(path)
    assert text.eos_ids == (2, 0) and text.add_bos and text.bos_id == 1


def test_a_gemma4_vocabulary_is_bpe_on_utf8_with_spaces_as_u2581_and_always_starts_with_bos(tmp_path):
    pieces = ["t", "h", "e", "\u2581", "he", "\u2581t", "\u2581the"]
    tokens = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + pieces
    meta = {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.pre": "qwen2",  # gemma4 reads as "gemma4"
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [3] * 3 + [6] * 256 + [1] * len(pieces),
            "tokenizer.ggml.merges": ["h e", "\u2581 t", "\u2581t he"], "tokenizer.ggml.add_bos_token": False}
    cfg = dataclasses.replace(TINY, vocab=len(tokens))
    path = write_gguf(tmp_path / "g.gguf", gguf_tensors(random_model(cfg)), {**llama_meta(cfg), **BYTE_VOCAB, **meta})
    _, text = load_gguf(path)
    tok = text.tokenizer
    assert [tokens[i] for i in tok.encode(" the\n\nthe").ids] == ["\u2581the", "<0x0A>", "<0x0A>", "t", "he"]
    assert [tokens[i] for i in tok.encode("\u00e9").ids] == ["<0xC3>", "<0xA9>"]
    assert tok.decode(tok.encode(" the \u00e9\nthe").ids) == " the \u00e9\nthe"
    assert text.add_bos and text.bos_id == 1  # as llama.cpp, whatever add_bos_token says


SPM_BYTES = [f"<0x{b:02X}>" for b in range(256)]
# Pieces and scores. "ll" outscores "he", and "el" outscores both: "hello" must become he|llo only
# when "el" is absent, so the scores, not the order of the list, decide.
SPM_PIECES = {"\u2581": -50.0, "h": -51.0, "e": -52.0, "l": -53.0, "o": -54.0, "w": -55.0, "r": -56.0,
              "d": -57.0, "ll": -1.0, "he": -2.0, "llo": -3.0, "\u2581he": -4.0, "hello": -5.0,
              "\u2581hello": -6.0, "or": -7.0, "\u2581w": -8.0, "\u2581wor": -9.0}


def spm_meta(pieces: dict[str, float]) -> dict:
    tokens = ["<unk>", "<s>", "</s>", *SPM_BYTES, *pieces]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * (3 + 256) + list(pieces.values()),
            "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(pieces),
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}


def spm_text(tmp_path, pieces):
    meta = spm_meta(pieces)
    cfg = dataclasses.replace(TINY, vocab=len(meta["tokenizer.ggml.tokens"]))
    _, text = load_gguf(write_gguf(tmp_path / "s.gguf", gguf_tensors(random_model(cfg)), {**llama_meta(cfg), **meta}))
    return meta["tokenizer.ggml.tokens"], text


def test_sentencepiece_vocabulary_merges_by_score_with_byte_fallback(tmp_path):
    tokens, text = spm_text(tmp_path, SPM_PIECES)
    tok = text.tokenizer
    # \u2581 h e l l o: ll (-1), then he (-2), then llo (-3), then \u2581he (-4), then \u2581hello (-6).
    assert [tokens[i] for i in tok.encode("hello").ids] == ["\u2581hello"]
    # \u2581 w o r l d: or (-7), then \u2581w (-8), then \u2581wor (-9); l and d stay.
    # A character no piece covers falls back to its UTF-8 bytes.
    ids = tok.encode("hello world\u00e9").ids
    assert [tokens[i] for i in ids] == ["\u2581hello", "\u2581wor", "l", "d", "<0xC3>", "<0xA9>"]
    assert tok.decode(ids) == "hello world\u00e9"
    assert text.add_bos and text.bos_id == 1 and text.eos_ids == (2,)


def test_sentencepiece_scores_not_list_order_decide_the_merges(tmp_path):
    tokens, text = spm_text(tmp_path, {**SPM_PIECES, "el": -0.5})
    # el (-0.5) now wins first: \u2581 h el l o, and no piece joins any of those pairs.
    assert [tokens[i] for i in text.tokenizer.encode("hello").ids] == ["\u2581", "h", "el", "l", "o"]


def spm_vocabulary(pieces: dict[str, float]) -> Vocabulary:
    """A SentencePiece Vocabulary as the checkpoint reader hands it over, without writing a file."""
    meta = spm_meta(pieces)
    return Vocabulary("s.gguf", "llama", meta["tokenizer.ggml.tokens"], np.array(meta["tokenizer.ggml.token_type"]),
                      np.array(meta["tokenizer.ggml.scores"], dtype=np.float32), [], "", 1, (2,), 0, None, True, None)


def every_split(pieces: dict[str, float]) -> list[tuple[str, str]]:
    """The merges by their definition: each cut of each piece into two pieces, ranked by the
    piece's score, then its id, then the left piece's id."""
    first = 3 + 256
    ids = {p: first + k for k, p in enumerate(pieces)}
    ranked = sorted((-pieces[p], ids[p], ids[p[:c]], p[:c], p[c:]) for p in pieces for c in range(1, len(p))
                    if p[:c] in ids and p[c:] in ids)
    return [(left, right) for *_, left, right in ranked]


def test_sentencepiece_merges_are_every_split_into_two_pieces_ranked_by_score():
    rng = random.Random("sentencepiece")
    pieces: dict[str, float] = {}
    while len(pieces) < 3000:  # few letters, so that pieces nest deeply; whole scores, so that some tie
        piece = "".join(rng.choice("ab\u2581c") for _ in range(rng.randint(1, 12)))
        pieces.setdefault(piece, float(rng.randint(-60, 0)))
    tok = gguf_text_spec(spm_vocabulary(pieces)).tokenizer
    merges = json.loads(tok.to_str())["model"]["merges"]
    want = every_split(pieces)
    assert len(want) > 3000 and [tuple(m) for m in merges] == want


def test_sentencepiece_pieces_nested_past_any_real_vocabulary_are_refused_quickly():
    pieces = {"q" * k: -float(k) for k in range(1, 2001)}  # 2 MB, each piece cut in two at every character
    tracemalloc.start()
    try:
        start = time.perf_counter()
        with pytest.raises(ModelFileError) as e:
            gguf_text_spec(spm_vocabulary(pieces))
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("s.gguf: ") and "merges" in msg
    assert seconds < 5 and peak < 256 * 2**20, (seconds, peak / 2**20)


def test_a_sentencepiece_piece_of_a_million_characters_builds_in_linear_time():
    pieces = {"\u2581": -4.0, "q": -3.0, "qq": -1.0, "q" * 1_000_000: -2.0}
    start = time.perf_counter()
    tokens, text = spm_vocabulary(pieces).tokens, gguf_text_spec(spm_vocabulary(pieces))
    assert time.perf_counter() - start < 5
    assert [tokens[i] for i in text.tokenizer.encode("qqqqq").ids] == ["\u2581", "qq", "qq", "q"]


# ---------------------------------------------------------------------------------------------
# bad files: written with the writer


def bad_model(tmp_path, meta=None, drop=(), extra=None, **kw) -> Path:
    source = random_model(TINY)
    tensors = {k: v for k, v in gguf_tensors(source).items() if k not in drop}
    tensors.update(extra or {})
    return write_gguf(tmp_path / "bad.gguf", tensors, {**llama_meta(TINY), **BYTE_VOCAB, **(meta or {})}, **kw)


def test_other_architectures_are_refused_by_name(tmp_path):
    path = write_gguf(tmp_path / "p.gguf", gguf_tensors(random_model(TINY)),
                      {k.replace("llama.", "gemma2."): v for k, v in {**llama_meta(TINY), **BYTE_VOCAB}.items()},
                      arch="gemma2")
    assert ("unsupported architecture 'gemma2' (supported: llama, qwen2, qwen3, smollm3, mistral3, phi3, gemma3, "
            "qwen3moe, qwen35, qwen35moe, gpt-oss, gemma4)"
            in load_error(path))


def test_missing_tensor_is_named(tmp_path):
    assert "missing tensor 'blk.1.ffn_up.weight'" in load_error(bad_model(tmp_path, drop=["blk.1.ffn_up.weight"]))


def test_tensor_of_the_wrong_shape_is_refused_with_both_shapes(tmp_path):
    path = bad_model(tmp_path, extra={"blk.0.attn_k.weight": np.zeros((16, 64), np.float32)})
    assert "tensor 'blk.0.attn_k.weight' has shape [16, 64], config expects [32, 64]" in load_error(path)


def test_tensor_the_config_does_not_use_is_refused(tmp_path):
    path = bad_model(tmp_path, extra={"blk.0.attn_q.bias": np.zeros(64, np.float32)})
    assert "unexpected tensor 'blk.0.attn_q.bias'" in load_error(path)


def test_tensor_of_a_type_that_cannot_be_dequantized_is_refused(tmp_path):
    path = bad_model(tmp_path, extra={"output_norm.weight": np.ones(64, np.int32)})
    assert "has type I32, which cannot be dequantized" in load_error(path)


@pytest.mark.parametrize("meta, expected", [
    ({"llama.rope.scaling.type": "dynamic", "llama.rope.scaling.factor": 2.0}, "unsupported rope scaling type 'dynamic'"),
    ({"llama.rope.scaling.type": "longrope", "llama.rope.scaling.factor": 2.0},
     "LongRoPE scaling needs tensor 'rope_factors_short.weight' of shape"),
    ({"llama.attention.temperature_scale": 0.1}, "llama.attention.temperature_scale is not supported"),
    ({"llama.expert_count": 8}, "missing metadata 'llama.expert_used_count'"),  # Mixtral's, incomplete
    ({"llama.expert_count": -1}, "metadata 'llama.expert_count' must be 0 (no experts) or more, got -1"),
    ({"llama.expert_count": -1, "llama.expert_used_count": 2}, "'llama.expert_count' must be 0 (no experts) or more"),
    ({"llama.block_count": "2"}, "'llama.block_count' must be an integer, got '2'"),
    ({"llama.vocab_size": 300}, "llama.vocab_size 300 differs from the 267 tokens"),
    ({"llama.rope.dimension_count": 7}, "7 rotated dims are not supported"),
    ({"llama.attention.head_count_kv": 3}, "multiple of n_kv_heads"),
    ({"llama.rope.freq_base": float("inf")}, "'llama.rope.freq_base' must be a finite number"),
    ({"tokenizer.ggml.model": "bert"}, "unsupported tokenizer model 'bert'"),
    ({"tokenizer.ggml.eos_token_id": 9999}, "'tokenizer.ggml.eos_token_id' is 9999, outside the vocabulary"),
    ({"tokenizer.ggml.merges": ["h e", "nospace"]}, "merge 'nospace' is not two tokens"),
    ({"tokenizer.ggml.merges": ["h e", " e"]}, "merge ' e' is not two tokens"),
    ({"tokenizer.ggml.pre": "kimi-k2"}, "unsupported pre-tokenizer 'kimi-k2' (tokenizer.ggml.pre)"),
    ({"tokenizer.ggml.token_type": [1, 1]}, "'tokenizer.ggml.token_type' must be a list of 267 integers"),
    ({"general.alignment": 48}, "general.alignment must be a power of two, got 48"),
], ids=lambda v: str(v)[:40])
def test_metadata_this_engine_cannot_honour_is_one_line_naming_it(tmp_path, meta, expected):
    assert expected in load_error(bad_model(tmp_path, meta))


def test_text_from_the_file_is_escaped_in_messages(tmp_path):
    path = write_gguf(tmp_path / "e.gguf", {}, {"llama.block_count": 1}, arch="evil\n\x1b[31mline")
    msg = load_error(path)
    assert "'evil\\n\\x1b[31mline'" in msg


def test_truncated_file_is_one_line_wherever_it_is_cut(tmp_path):
    whole = bad_model(tmp_path).read_bytes()
    for cut in [0, 3, 23, 40, 1000, len(whole) // 2, len(whole) - 1]:
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(whole[:cut])
        msg = load_error(p)
        assert str(p) in msg and ("truncated" in msg or "not a GGUF file" in msg), (cut, msg)


def test_link_to_a_gguf_file_loads_and_a_link_to_a_fifo_is_refused(tmp_path):
    real = write_model(tmp_path / "m.gguf", random_model(TINY, seed=2))
    (tmp_path / "link.gguf").symlink_to(real)
    assert load_gguf(tmp_path / "link.gguf")[0].config == TINY
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "pipe.gguf").symlink_to(tmp_path / "fifo")
    assert "not a regular file" in load_error(tmp_path / "pipe.gguf")
    assert "no such GGUF file" in load_error(tmp_path / "absent.gguf")


# ---------------------------------------------------------------------------------------------
# bad files: written byte by byte

U32, U64, F32V, STR, ARR = 4, 10, 6, 8, 9


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def raw_gguf(kvs: list[bytes], tensors: list[bytes] = (), data: bytes = b"", version: int = 3,
             n_kv: int | None = None, n_tensors: int | None = None) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + bytes(-len(body) % 32) + data


def tensor_entry(name: str, dims: list[int], qtype: int, offset: int) -> bytes:
    return s(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, qtype, offset)


ARCH = kv("general.architecture", STR, s("llama"))


@pytest.mark.parametrize("raw, expected", [
    (b"GGUX" + bytes(40), "no GGUF magic"),
    (raw_gguf([ARCH], version=1), "unsupported GGUF version 1"),
    (b"GGUF" + struct.pack(">IQQ", 3, 0, 1) + bytes(40), "big-endian"),
    (raw_gguf([ARCH], n_tensors=1 << 62), "header claims 4611686018427387904 tensors"),
    (raw_gguf([ARCH], n_kv=1 << 60), "metadata keys, more than its"),
    (raw_gguf([ARCH, kv("big", ARR, struct.pack("<IQ", 0, 1 << 60))]), "claims 1152921504606846976 items"),
    (raw_gguf([ARCH, kv("big", ARR, struct.pack("<IQ", 0, 1 << 20))]), "runs past the end of the file"),
    (raw_gguf([ARCH, kv("big", ARR, struct.pack("<IQ", STR, 1 << 22))]), "runs past the end of the file"),
    (raw_gguf([ARCH, kv("s", STR, struct.pack("<Q", 1 << 63))]), "runs past the end of the file"),
    (raw_gguf([kv("k" * 10, STR, s("x")), kv("k" * 10, STR, s("y"))]), "metadata key 'kkkkkkkkkk' appears twice"),
    (raw_gguf([ARCH, kv(b"\xff\xfe", STR, s("x"))]), "metadata key 1 is not UTF-8 text"),
    (raw_gguf([ARCH, kv("n", ARR, struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", U32, 0))]), "arrays of arrays"),
    (raw_gguf([ARCH, kv("t", 77, b"")]), "unknown value type 77"),
    (raw_gguf([ARCH, kv("b", 7, b"\x02")]), "neither 0 nor 1"),
    (raw_gguf([ARCH], [tensor_entry("w", [32], 99, 0)], bytes(128)), "tensor 'w' has unknown type 99"),
    (raw_gguf([ARCH], [tensor_entry("w", [1, 1, 1, 1, 1], 0, 0)], bytes(32)), "tensor 'w' has 5 dims"),
    (raw_gguf([ARCH], [tensor_entry("w", [8], 0, 4)], bytes(64)), "data offset 4 is not a multiple of the alignment 32"),
    (raw_gguf([ARCH], [tensor_entry("w", [1 << 40, 1 << 40], 0, 0)], bytes(64)), "runs past the end"),
    (raw_gguf([ARCH], [tensor_entry("w", [20], 8, 0)], bytes(64)), "row length 20 is not a multiple of the Q8_0"),
    (raw_gguf([ARCH], [tensor_entry("a", [16], 0, 0), tensor_entry("b", [8], 0, 32)], bytes(64)),
     "tensor 'b' overlaps the data of tensor 'a'"),
    (raw_gguf([ARCH], [tensor_entry("a", [8], 0, 0), tensor_entry("a", [8], 0, 32)], bytes(64)), "appears twice"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_hostile_header_is_one_line_without_reading_or_allocating_what_it_claims(tmp_path, raw, expected):
    path = tmp_path / "h.gguf"
    path.write_bytes(raw)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        msg = load_error(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert expected in msg
    assert time.perf_counter() - start < 5 and peak < 16 * 2**20, "bounded by the file, not by the header's claims"


# ---------------------------------------------------------------------------------------------
# bad files: tensor entries whose types or offsets do not match the data

# A valid file of several types; its table order is the writer's (embedding first, output last).
MIXED = {"blk.0.attn_q.weight": Q.BF16, "blk.0.attn_k.weight": Q.Q8_0, "blk.0.attn_v.weight": Q.F16,
         "blk.0.ffn_up.weight": Q.Q4_0, "blk.1.attn_norm.weight": Q.Q8_0, "output.weight": Q.BF16}


def entry_fields(path: Path) -> dict[str, int]:
    """Where each tensor entry's type word sits in the file (its u64 data offset follows), in table order."""
    return {t.name: t.field.offset + sum(int(p.nbytes) for p in t.field.parts[:4]) for t in GGUFReader(path).tensors}


def relabel(name: str, qtype: Q):
    def edit(raw: bytearray, fields: dict[str, int]) -> bytearray:
        struct.pack_into("<I", raw, fields[name], qtype)
        return raw
    return edit


def moved(first: str, by: int, grow: int = 0, only: bool = False):
    """Adds `by` to the data offset of `first` and (unless `only`) of every tensor after it in the
    table; the file grows by `grow` zero bytes."""
    def edit(raw: bytearray, fields: dict[str, int]) -> bytearray:
        names = list(fields)
        for name in [first] if only else names[names.index(first):]:
            (offset,) = struct.unpack_from("<Q", raw, fields[name] + 4)
            struct.pack_into("<Q", raw, fields[name] + 4, offset + by)
        return raw + bytes(grow)
    return edit


def swapped(a: str, b: str):
    def edit(raw: bytearray, fields: dict[str, int]) -> bytearray:
        (oa,), (ob,) = struct.unpack_from("<Q", raw, fields[a] + 4), struct.unpack_from("<Q", raw, fields[b] + 4)
        struct.pack_into("<Q", raw, fields[a] + 4, ob)
        struct.pack_into("<Q", raw, fields[b] + 4, oa)
        return raw
    return edit


def resized(by: int):
    return lambda raw, fields: raw + bytes(by) if by > 0 else raw[:by]


EXPECTED_AT = "expected"  # "... starts at data offset X, expected Y, where ... ends"


@pytest.mark.parametrize("edit, expected", [
    # relabelled types: the data the type implies no longer reaches the next tensor's offset
    (relabel("blk.0.attn_q.weight", Q.Q4_0), "starts at data offset 76800, expected 70912"),  # BF16 -> Q4_0
    (relabel("blk.0.attn_v.weight", Q.Q8_0), EXPECTED_AT),                 # F16 -> Q8_0
    (relabel("blk.0.attn_k.weight", Q.Q4_0), EXPECTED_AT),                 # Q8_0 -> Q4_0
    (relabel("blk.1.attn_norm.weight", Q.Q4_1), EXPECTED_AT),              # Q8_0 -> Q4_1, in its padding
    (relabel("token_embd.weight", Q.BF16), EXPECTED_AT),                   # F32 -> BF16, the first tensor
    (relabel("blk.0.attn_norm.weight", Q.F16), EXPECTED_AT),               # F32 -> F16
    (relabel("blk.0.ffn_down.weight", Q.Q8_0), EXPECTED_AT),               # F32 -> Q8_0
    (relabel("output.weight", Q.Q4_0), "the last 24544 bytes of the file belong to no tensor"),
    (relabel("blk.0.attn_v.weight", Q.F32), "overlaps the data of tensor 'blk.0.attn_v.weight'"),
    (relabel("output.weight", Q.F32), "runs past the end of the file"),
    # moved offsets
    (moved("blk.0.attn_k.weight", 32, grow=32), EXPECTED_AT),              # a hole, the file padded to fit
    (moved("token_embd.weight", 64, grow=64), "starts at data offset 64, expected 0"),
    (moved("output.weight", 32, grow=32), EXPECTED_AT),                    # the last tensor, moved into padding
    (moved("blk.1.ffn_gate.weight", -32, only=True), "overlaps the data of tensor 'blk.1.ffn_norm.weight'"),
    (moved("blk.0.attn_norm.weight", 32, only=True), EXPECTED_AT),        # into its neighbour
    (swapped("blk.0.ffn_gate.weight", "blk.1.ffn_gate.weight"), EXPECTED_AT),  # tiles, but out of table order
    (swapped("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"), EXPECTED_AT),  # same size: swapped norms
    # the end of the file
    (resized(64), "the last 64 bytes of the file belong to no tensor"),
    (resized(-1), "runs past the end of the file"),
], ids=["q-bf16-as-q4_0", "v-f16-as-q8_0", "k-q8_0-as-q4_0", "norm-q8_0-as-q4_1", "embd-f32-as-bf16",
        "norm-f32-as-f16", "down-f32-as-q8_0", "last-bf16-as-q4_0", "v-f16-as-f32", "last-bf16-as-f32",
        "hole-in-the-middle", "hole-at-the-start", "last-moved", "one-moved-back", "one-moved-on",
        "swapped-offsets", "swapped-norms", "data-appended", "last-byte-cut"])
def test_tensor_data_must_follow_the_entries_types_and_offsets(tmp_path, edit, expected):
    path = write_gguf(tmp_path / "m.gguf", gguf_tensors(random_model(TINY, seed=11)),
                      {**llama_meta(TINY), **BYTE_VOCAB}, types=MIXED)
    load_gguf(path)  # the file as written loads
    path.write_bytes(edit(bytearray(path.read_bytes()), entry_fields(path)))
    msg = load_error(path)
    assert str(path) in msg and expected in msg, msg


# ---------------------------------------------------------------------------------------------
# weights that are not finite: found at load, whatever the type

# Where a block's fp16 scale sits (bytes from the block's start), per type.
SCALE_AT = {Q.Q8_0: 0, Q.Q4_0: 0, Q.Q4_1: 2, Q.Q5_0: 0, Q.Q4_K: 0, Q.F16: 0, Q.BF16: 0, Q.F32: 0}
F16_NAN, F16_INF, BF16_NAN = 0x7E00, 0x7C00, 0x7FC0


@pytest.mark.parametrize("cfg, name, qtype, block, word, expected", [
    (TINY, "token_embd.weight", Q.F32, 100, 0x7FC00000, "holds a NaN weight at [1, 36]"),  # a row no prompt may touch
    (TINY, "token_embd.weight", Q.BF16, 5000, BF16_NAN, "holds a NaN weight at [78, 8]"),
    (TINY, "blk.1.ffn_norm.weight", Q.F16, 3, F16_INF, "holds a weight that is infinite in bf16 at [3]"),
    (TINY, "blk.0.attn_k.weight", Q.Q8_0, 5, F16_NAN, "holds a NaN weight at [2, 32]"),      # a NaN scale
    (TINY, "blk.1.ffn_down.weight", Q.Q4_0, 7, F16_INF, "blk.1.ffn_down.weight"),          # an infinite scale
    (TINY, "output.weight", Q.Q4_1, 0, F16_NAN, "holds a NaN weight at [0, 0]"),          # a NaN minimum
    (WIDE, "blk.0.ffn_up.weight", Q.Q4_K, 1, F16_NAN, "holds a NaN weight at [1, 0]"),    # a NaN super-block scale
], ids=["f32", "bf16", "f16", "q8_0-scale", "q4_0-scale", "q4_1-min", "q4_k-scale"])
def test_a_weight_that_is_nan_or_infinite_is_refused_at_load_naming_file_and_tensor(
        tmp_path, cfg, name, qtype, block, word, expected):
    tensors = gguf_tensors(random_model(cfg, seed=14))
    if qtype == Q.Q4_K:  # the gguf package does not quantize to it: random blocks of small scales
        rows = tensors[name].shape[0]
        tensors[name] = random_k_blocks(qtype, tensors[name].size // 256, np.random.default_rng(14)).reshape(rows, -1)
    path = write_gguf(tmp_path / "m.gguf", tensors, {**llama_meta(cfg), **BYTE_VOCAB}, types={name: qtype})
    load_gguf(path)  # the file as written loads
    t = next(t for t in GGUFReader(path).tensors if t.name == name)
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    at = t.data_offset + block * block_bytes + SCALE_AT[qtype]
    raw = bytearray(path.read_bytes())
    if qtype == Q.F32:
        struct.pack_into("<I", raw, at, word)
    else:
        struct.pack_into("<H", raw, at, word)
    path.write_bytes(raw)
    msg = load_error(path)
    assert f"{path}: tensor '{name}' " in msg and expected in msg, msg


# ---------------------------------------------------------------------------------------------
# the real file: SmolLM2-135M-Instruct, Q4_1


def smollm2_path() -> Path:
    """The demo model's file where it is there (never fetched by a test)."""
    path = demo_model_path()
    if path is None:
        pytest.skip(f"the demo model is not fetched: {FETCH_HINT}")
    return path


def test_smollm2_q4_1_loads_encodes_round_trip_and_continues_greedily():
    model, text = load_gguf(smollm2_path(), quantized=True)
    cfg = model.config
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.vocab) == (576, 30, 9, 3, 1536, 49152)
    assert cfg.head_dim == 64 and cfg.rope_theta == 100000.0
    # Tied in the file; token_embd (Q8_0) is the bf16 embedding and, kept quantized, the lm_head.
    assert not cfg.tied_embeddings and model.format_of(LM_HEAD) == 1 and model.notes == ()
    assert {model.format_of(n) for n in model.tensors if n.endswith("proj.weight")} == {3}  # Q4_1
    tok = text.tokenizer
    sentence = "The café's 3 cats didn't sleep until 10:45 p.m.\nThen they ate."
    assert tok.decode(tok.encode(sentence).ids) == sentence
    # "smollm" splits digits one by one; ChatML markers are single control tokens.
    assert len(tok.encode("2024").ids) == 4
    assert tok.encode("<|im_start|>").ids == [text.bos_id] and text.eos_ids == (tok.token_to_id("<|im_end|>"),)
    assert "<|im_start|>" in text.chat_template and not text.add_bos
    prompt = tok.encode("The capital of France is").ids
    out = ReferenceModel(model, max_seq=16).greedy(prompt, 2)
    assert tok.decode(out).strip().startswith("Paris"), tok.decode(out)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0], ids=lambda q: q.name)
def test_the_main_job_decodes_a_quantized_file_and_says_how_its_matrices_are_held(tmp_path, qtype):
    """`python -m arcpy.decode --model FILE.gguf` on a file of Q4_K or Q8_0 matrices: they stay
    in their format (on the GPU the decode's GEMVs read them so; here the NumPy backend), and the
    model's line says so."""
    path = tmp_path / "m.gguf"
    if qtype == Q.Q4_K:
        write_k_model(path, WIDE, qtype, np.random.default_rng(8))
    else:
        tensors = gguf_tensors(random_model(TINY, seed=8))
        types = {name: qtype for name, x in tensors.items() if x.ndim == 2}
        write_gguf(path, tensors, {**llama_meta(TINY), **BYTE_VOCAB}, types=types)
    out = subprocess.run([sys.executable, "-m", "arcpy.decode", "--model", str(path), "--prompt-ids", "5 40", "-n", "3",
                          "--backend", "numpy", "--weights", "quantized"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    model_line = [line for line in out.stderr.splitlines() if line.startswith("model ")]
    assert len(model_line) == 1 and f", matrices 15 {qtype.name}; prompt 2 tokens" in model_line[0], out.stderr
    assert "finished: token_budget; 3 tokens;" in out.stderr
