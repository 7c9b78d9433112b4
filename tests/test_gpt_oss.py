"""gpt-oss on the CPU: its checkpoints (Hugging Face's, bf16 or MXFP4, and llama.cpp's GGUF) read
into the config and tensors arcpy/model/gpt_oss.py describes, and the NumPy reference against
transformers' float32 logits on a tiny random checkpoint (tests/data/gpt_oss, made by
scripts/gpt_oss_fixtures.py with transformers 5.25.0); the CUDA backend refuses it in one line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from reference_goldens import assert_greedy_goldens, read_golden, reference_logits, relative_error

from arcpy.codes import OP_ATTEND
from arcpy.devices.numpy_device import NumpyDevice
from arcpy.devices.reference import ReferenceModel
from arcpy.devices.reference_ops import causal_attention, clamped_swiglu
from arcpy.errors import InvalidArgumentError
from arcpy.model import (
    SHAPES,
    bf16_to_f32,
    load_model,
    random_model,
    save_model,
    synthetic_model,
)
from arcpy.model.families.gpt_oss import GPT_OSS
from arcpy.model.gguf import _gguf_name
from arcpy.model.gpt_oss import cuda_refusal
from arcpy.model.mxfp4 import E2M1, decode
from arcpy.model.native import describe, layer_program

sys.path.insert(0, str(Path(__file__).parent))
from test_gguf import BYTE_VOCAB, load_error, write_gguf  # noqa: E402

DATA = Path(__file__).parent / "data" / "gpt_oss" / "gpt_oss"
# The logits' largest error over the greedy steps, relative to their scale, against float32
# transformers, with arcpy's bf16 KV cache: measured 0.25% (the cache's rounding, carried through
# four layers; the fixture's routing leads by 0.0073 or more, which it does not overturn). With a
# float32 cache the reference computes what transformers computes up to float32 sums, over every
# position: measured 6.0e-7.
TOLERANCE = 0.01
EXACT = 1e-4





def test_the_fixture_reads_into_gpt_oss_config():
    c = load_model(DATA).config
    assert c.attn_sinks and c.o_bias and c.expert_bias and c.qkv_bias
    assert (c.swiglu_limit, c.swiglu_alpha) == (1.5, 1.702)  # the fixture's lowered limit; gpt-oss's is 7
    assert (c.n_experts, c.n_experts_used, c.expert_ffn_dim, c.routing) == (8, 4, 32, "topk_softmax")
    assert [c.window(i) for i in range(4)] == [8, 0, 8, 0]
    rs = c.rope_scaling
    assert (rs.factor, rs.original_max_position_embeddings, rs.truncate) == (32.0, 64, False)
    assert math.isclose(rs.attention_factor, 0.1 * math.log(32) + 1)
    assert all(describe(layer_program(c, i)) == "ATTN_IN ATTEND ATTN_OUT MOE_IN MOE_OUT"
               for i in range(4))


def test_reference_logits_and_greedy_ids_match_transformers():
    assert_greedy_goldens(DATA, TOLERANCE)


def test_with_a_float32_cache_the_reference_computes_what_transformers_computes(monkeypatch):
    import arcpy.devices.kv_formats as kv_formats
    monkeypatch.setitem(kv_formats.ROUND, "bf16", lambda a: a)  # the KV cache in float32
    g = read_golden(DATA)
    err = relative_error(reference_logits(load_model(DATA), g["tokens"]), g["logits"])
    print(f"max relative logit error {err:.3g} with a float32 cache")
    assert err <= EXACT


def _without_sinks(ref):
    for layer in ref.layers:
        layer.sinks = None


def _without(name: str):
    def patch(ref):
        for layer in ref.layers:
            layer.biases[name] = np.zeros_like(layer.biases[name])
    return patch


def _no_o_bias(ref):
    for layer in ref.layers:
        layer.bo = np.zeros_like(layer.bo)


@pytest.mark.parametrize("what, change, patch", [
    ("sinks", {}, _without_sinks),
    ("the window", dict(sliding_window=0, window_pattern=0), None),
    ("YaRN's ramp untruncated", "truncate", None),
    ("the GLU's limit", dict(swiglu_limit=7.0), None),
    ("the GLU's alpha", dict(swiglu_alpha=1.0), None),
    ("o_proj's bias", {}, _no_o_bias),
    ("the router's bias", {}, _without("router")),
    ("the experts' gate bias", {}, _without("gate")),
    ("the experts' down bias", {}, _without("down")),
])
def test_the_goldens_see_every_feature(what, change, patch, monkeypatch):
    """Each of gpt-oss's features left out moves the logits far past EXACT: the goldens test it."""
    import arcpy.devices.kv_formats as kv_formats
    from arcpy.model.tensors import Model
    monkeypatch.setitem(kv_formats.ROUND, "bf16", lambda a: a)  # the KV cache in float32
    model = load_model(DATA)
    if change == "truncate":
        change = dict(rope_scaling=dataclasses.replace(model.config.rope_scaling, truncate=True))
    model = Model(dataclasses.replace(model.config, **change), model.tensors, "changed", "changed")
    ref = ReferenceModel(model)
    if patch:
        patch(ref)
    g = read_golden(DATA)
    got = np.stack([ref.forward(int(t), i) for i, t in enumerate(g["tokens"])])
    assert relative_error(got, g["logits"]) > 0.05, what


def test_the_prefill_in_chunks_gives_the_steps_logits():
    tokens = [int(t) for t in read_golden(DATA)["tokens"]]
    model = load_model(DATA)
    steps = reference_logits(model, tokens)
    rows = ReferenceModel(model).prefill(tokens, chunk=5, every_row=True)  # chunks shorter than the window
    # Summation order, and the bf16 cache entries it tips to the next word: measured 1.4e-4.
    assert relative_error(rows, steps) <= 1e-3
    device = NumpyDevice(ReferenceModel(model))
    device.enqueue_prefill(tokens, 0)
    assert relative_error(device.host_logits(), steps[-1]) <= 1e-3
    bf16 = ReferenceModel(model).prefill(tokens, chunk=7, bf16_products=True, every_row=True)
    assert relative_error(bf16, steps) <= TOLERANCE  # libarc's prefill numerics, products in bf16


def test_sinks_join_the_softmax_denominator_alone():
    """The attention with sinks, decode row and prefill rows, against its formula written out:
    p_j = exp(s_j) / (sum_i exp(s_i) + exp(sink)) over the positions the query sees."""
    rng = np.random.default_rng(0)
    n_heads, n_kv, hd, seen, window = 4, 2, 8, 11, 4
    k = rng.standard_normal((n_kv, seen, hd), dtype=np.float32)
    v = rng.standard_normal((n_kv, seen, hd), dtype=np.float32)
    q = rng.standard_normal((3, n_heads, hd), dtype=np.float32)
    sinks = np.array([3.0, -1.0, 0.5, 20.0], np.float32)
    start = seen - 3
    got = causal_attention(q, k, v, start, n_kv, scale=0.5, window=window, sinks=sinks)
    for t in range(3):
        pos = start + t
        for h in range(n_heads):
            kv = h // (n_heads // n_kv)
            idx = np.arange(max(0, pos - window + 1), pos + 1)
            s = (k[kv, idx] @ q[t, h]).astype(np.float64) * 0.5
            p = np.exp(s) / (np.exp(s).sum() + np.exp(np.float64(sinks[h])))
            np.testing.assert_allclose(got[t, h], p @ v[kv, idx], rtol=1e-5, atol=1e-6)
    assert np.abs(got[:, 3]).max() < 1e-5  # a sink far above the scores takes the whole softmax
    one = causal_attention(q[2:], k, v, seen - 1, n_kv, scale=0.5, window=window, sinks=sinks)  # the decode's row
    np.testing.assert_allclose(one[0], got[2], rtol=1e-6, atol=1e-7)
    none = causal_attention(q, k, v, start, n_kv, scale=0.5, window=window,
                            sinks=np.full(n_heads, -np.inf, np.float32))
    np.testing.assert_allclose(none, causal_attention(q, k, v, start, n_kv, scale=0.5, window=window), rtol=1e-6)


def test_the_clamped_glu():
    gate = np.array([-30.0, -1.0, 0.0, 2.0, 7.0, 9.0], np.float32)
    up = np.array([-9.0, -7.5, 0.5, 3.0, 7.0, 8.0], np.float32)
    got = clamped_swiglu(gate, up, 7.0, 1.702)
    g, u = np.minimum(gate, 7.0).astype(np.float64), np.clip(up, -7.0, 7.0).astype(np.float64)
    np.testing.assert_allclose(got, g / (1 + np.exp(-1.702 * g)) * (u + 1), rtol=1e-6, atol=1e-12)
    assert got[-1] == got[-2]  # gate 9 and up 8 clamp to the 7 and 7 of the one before


# ---------------------------------------------------------------------------------------------
# MXFP4: the published checkpoints' experts


def mxfp4_encode(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """values (..., n) float32 -> (blocks (..., n/32, 16) uint8, scales (..., n/32) uint8): each 32's
    scale the least power of two that brings their largest magnitude to 6 or under, each value the
    nearest e2m1 code (exact for values on MXFP4's grid)."""
    x = values.reshape(*values.shape[:-1], -1, 32).astype(np.float64)
    amax = np.abs(x).max(axis=-1)
    exp = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-300) / 6.0)), -127).clip(-127, 127)
    q = x / np.exp2(exp)[..., None]
    codes = np.abs(np.abs(q)[..., None] - E2M1[:8].astype(np.float64)).argmin(axis=-1)
    codes = np.where(np.signbit(q), codes + 8, codes).astype(np.uint8)  # -0 too
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8), (exp + 127).astype(np.uint8)


def test_the_decoder_gives_back_what_the_encoder_packs():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 16, (3, 5, 64))
    exps = rng.integers(-20, 20, (3, 5, 2))
    values = (E2M1[codes] * np.exp2(np.repeat(exps, 32, axis=-1))).astype(np.float32)
    blocks, scales = mxfp4_encode(values)
    assert blocks.shape == (3, 5, 2, 16) and scales.shape == (3, 5, 2)
    np.testing.assert_array_equal(decode(blocks, scales, "t"), values)
    assert decode(np.array([[0x21] + [0] * 15], np.uint8), np.array([128], np.uint8), "t")[:2].tolist() == [1.0, 2.0]


def test_the_decoder_agrees_with_transformers_dequantization():
    torch = pytest.importorskip("torch")
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    rng = np.random.default_rng(2)
    blocks = rng.integers(0, 256, (2, 6, 3, 16), dtype=np.uint8)
    scales = rng.integers(100, 150, (2, 6, 3), dtype=np.uint8)
    theirs = mxfp4.convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                              dtype=torch.float32)  # (2, 96, 6): transposed, as the bf16 files
    np.testing.assert_array_equal(decode(blocks, scales, "t"), theirs.transpose(1, 2).numpy())


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file of uint16 arrays (bf16 words) and uint8 arrays (U8), as written."""
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        t = np.ascontiguousarray(t)
        header[name] = {"dtype": "BF16" if t.dtype == np.uint16 else "U8", "shape": list(t.shape),
                        "data_offsets": [at, at + t.nbytes]}
        blobs.append(t.tobytes())
        at += t.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))


def mxfp4_checkpoint(out: Path, drop: str | None = None, **extra) -> Path:
    """The fixture with its experts' matrices stored as the published checkpoints store them:
    <name>_blocks and _scales, rows as the model's (gate and up interleaved; down's dim rows)."""
    model = load_model(DATA)
    words = GPT_OSS.hf_written(model.tensors, model.config)
    files = {}
    for name, t in words.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = mxfp4_encode(bf16_to_f32(t).transpose(0, 2, 1))
            files[name + "_blocks"], files[name + "_scales"] = blocks, scales
        else:
            files[name] = t
    files.update(extra)
    if drop:
        del files[drop]
    out.mkdir()
    doc = json.loads((DATA / "config.json").read_text())
    doc["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (out / "config.json").write_text(json.dumps(doc))
    write_safetensors(out / "model.safetensors", files)
    return out


def test_an_mxfp4_checkpoint_reads_as_the_bf16_one(tmp_path):
    """The fixture's experts lie on MXFP4's grid, so stored in MXFP4 they read back to the very
    words of the bf16 files: the same model, the same logits as transformers'."""
    plain = load_model(DATA)
    model = load_model(mxfp4_checkpoint(tmp_path / "m"))
    assert model.config == plain.config
    for name, t in plain.tensors.items():
        np.testing.assert_array_equal(model.tensors[name], t, err_msg=name)


def test_transformers_reads_the_mxfp4_checkpoint_as_the_goldens_model(tmp_path):
    """The layout the encoder above writes is the published checkpoints': transformers, loading it
    dequantized on the CPU, computes the goldens' logits (exactly, with 5.25.0)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.GptOssForCausalLM.from_pretrained(
        mxfp4_checkpoint(tmp_path / "m"), quantization_config=transformers.Mxfp4Config(dequantize=True),
        dtype=torch.float32)
    model.config._attn_implementation = "eager"
    g = read_golden(DATA)
    with torch.no_grad():
        logits = model(torch.tensor([g["tokens"].tolist()]), use_cache=False).logits[0].numpy()
    assert relative_error(logits, g["logits"]) <= EXACT


def test_mxfp4_refusals_are_one_line(tmp_path):
    e = "model.layers.1.mlp.experts."
    assert "'model.layers.1.mlp.experts.down_proj_scales' is missing beside" in load_error(
        mxfp4_checkpoint(tmp_path / "a", drop=e + "down_proj_scales"), load_model)
    nan = np.full((8, 64, 1), 255, np.uint8)  # down_proj_scales: (experts, dim, width / 32)
    assert "scale is NaN (e8m0 255)" in load_error(mxfp4_checkpoint(tmp_path / "b", **{e + "down_proj_scales": nan}),
                                                   load_model)
    model = load_model(DATA)
    bf16 = GPT_OSS.hf_written(model.tensors, model.config)[e + "down_proj"]
    assert "tensor 'model.layers.1.mlp.experts.down_proj' is stored both in bf16 and in MXFP4" in load_error(
        mxfp4_checkpoint(tmp_path / "c", **{e + "down_proj": bf16}), load_model)
    short = np.zeros((8, 64, 1, 16), np.uint8)
    assert "tensor 'model.layers.1.mlp.experts.gate_up_proj_blocks' has shape [8, 64, 1, 16], config expects " \
           "[8, 64, 2, 16]" in load_error(mxfp4_checkpoint(tmp_path / "d", **{e + "gate_up_proj_blocks": short}),
                                         load_model)
    words = np.zeros((8, 64, 2, 16), np.uint16)
    assert "tensor 'model.layers.1.mlp.experts.gate_up_proj_blocks' has unsupported dtype 'BF16' (U8)" in load_error(
        mxfp4_checkpoint(tmp_path / "e", **{e + "gate_up_proj_blocks": words}), load_model)
    d = mxfp4_checkpoint(tmp_path / "f")
    doc = json.loads((d / "config.json").read_text())
    doc["quantization_config"] = {"quant_method": "bitsandbytes"}
    (d / "config.json").write_text(json.dumps(doc))
    assert load_error(d, load_model).endswith("quantization_config 'bitsandbytes' is not supported (mxfp4 only)")


# ---------------------------------------------------------------------------------------------
# config.json, save_model, the presets, the CUDA backend


@pytest.mark.parametrize("change, message", [
    (dict(attention_bias=False), "attention_bias=false is not supported (gpt-oss's attention has biases)"),
    (dict(layer_types=["sliding_attention", "full_attention", "full_attention", "sliding_attention"]),
     "layer_types must make every n-th layer full attention"),
    (dict(layer_types=["sliding_attention"] * 3), "must name full_attention or sliding_attention for each of the 4"),
    (dict(swiglu_limit=-1.0), "swiglu_limit must be a finite number >= 0, got -1.0"),
    (dict(num_experts_per_tok=9), "n_experts_used must be in 1..n_experts (8), got 9"),
])
def test_config_json_errors_are_one_line(tmp_path, change, message):
    d = tmp_path / "m"
    shutil.copytree(DATA, d)
    doc = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**doc, **change}))
    assert message in load_error(d, load_model)


def test_without_layer_types_every_other_layer_is_windowed(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(DATA, d)
    doc = json.loads((d / "config.json").read_text())
    del doc["layer_types"]
    (d / "config.json").write_text(json.dumps(doc))
    assert load_model(d).config == load_model(DATA).config


def test_save_model_writes_the_files_transformers_writes(tmp_path):
    """The router as mlp.router, the experts fused (gate and up interleaved, each matrix
    transposed): the fixture's own file, word for word, and what load_model reads back."""
    from arcpy.model.safetensors import read_bf16_words, read_header
    model = load_model(DATA)
    save_model(model, tmp_path / "out")
    back = load_model(tmp_path / "out")
    assert back.config == model.config
    assert all(np.array_equal(back.tensors[n], t) for n, t in model.tensors.items())
    ours, theirs = (read_header(p / "model.safetensors") for p in (tmp_path / "out", DATA))
    assert set(ours) == set(theirs)
    for name in theirs:
        np.testing.assert_array_equal(read_bf16_words(name, ours[name], {}), read_bf16_words(name, theirs[name], {}),
                                      err_msg=name)


def test_gpt_oss_20bs_published_config_reads_as_the_preset():
    """config.json as openai/gpt-oss-20b publishes it (the rope settings under rope_scaling, the
    experts' MXFP4 named by quantization_config, keys transformers does not read) is the preset
    with its full context."""
    from arcpy.model import config_from_hf
    doc = {"architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
           "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
           "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
           "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
           "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
           "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
           "output_router_logits": False, "pad_token_id": 199999,
           "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                              "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
           "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                                   "original_max_position_embeddings": 4096, "rope_type": "yarn",
                                                   "truncate": False},
           "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
           "tie_word_embeddings": False, "use_cache": True, "vocab_size": 201088}
    assert config_from_hf(doc, "config.json") == dataclasses.replace(SHAPES["gpt-oss-20b"], max_seq=131072)


def test_the_tiny_preset_runs_on_the_reference():
    model = synthetic_model("gpt-oss-tiny", max_seq=64)
    out = ReferenceModel(model).greedy([1, 2, 3, 4], 6)
    assert len(out) == 6 and all(0 <= t < model.config.vocab for t in out)
    assert layer_program(model.config, 0)[1] == OP_ATTEND  # the sinks are the table's, read by ATTEND
    assert [model.config.window(i) for i in range(4)] == [16, 0, 16, 0]


def test_the_20b_preset_has_gpt_oss_20bs_dims():
    c = SHAPES["gpt-oss-20b"]
    assert (c.n_layers, c.dim, c.n_heads, c.head_dim, c.n_kv_heads, c.vocab) == (24, 2880, 64, 64, 8, 201088)
    assert (c.n_experts, c.n_experts_used, c.expert_ffn_dim, c.window(0), c.window(1)) == (32, 4, 2880, 128, 0)
    assert 20.8e9 < c.n_params < 21.0e9  # 20.9B weights (OpenAI's model card)
    assert 3.55e9 < c.weight_bytes / 2 < 3.65e9  # 3.6B a token: 4 experts of 32, the lm_head, not the embedding


def test_cuda_refuses_a_clamped_glu_of_other_constants_before_allocating_anything(monkeypatch):
    import arcpy.devices.cuda as cuda
    from arcpy.model import Model

    def no_context(*a, **k):
        raise AssertionError("a context was made")
    monkeypatch.setattr(cuda, "Context", no_context)
    base = synthetic_model("gpt-oss-tiny", max_seq=16)
    assert cuda_refusal(base.config) is None  # gpt-oss's own constants are libarc's
    model = Model(dataclasses.replace(base.config, swiglu_alpha=1.5), base.tensors, base.name, base.source)
    with pytest.raises(InvalidArgumentError) as e:
        cuda.open_cuda_device(model)
    assert str(e.value) == cuda_refusal(model.config) and "\n" not in str(e.value)
    assert "alpha 1.5" in str(e.value) and "use --backend numpy" in str(e.value)


@pytest.mark.parametrize("change, message", [
    (dict(n_experts=0, n_experts_used=0, expert_ffn_dim=0), "expert_bias and swiglu_limit need n_experts > 0"),
    (dict(swiglu_alpha=0.0), "needs swiglu_alpha > 0"),
    (dict(swiglu_limit=math.inf), "swiglu_limit must be a finite number >= 0"),
    (dict(attn_sinks=1), "attn_sinks, o_bias and expert_bias must be bool"),
])
def test_config_checks(change, message):
    with pytest.raises(InvalidArgumentError, match=message):
        dataclasses.replace(SHAPES["gpt-oss-tiny"], **change)


# ---------------------------------------------------------------------------------------------
# GGUF: the files llama.cpp's converter writes for gpt-oss


V = len(BYTE_VOCAB["tokenizer.ggml.tokens"])


def converter_tensors(model) -> dict[str, np.ndarray]:
    """The model's tensors as llama.cpp's converter writes them (float32): its names, the experts
    as 3-D tensors (experts, rows, cols) and their biases (experts, width)."""
    cfg, out = model.config, {}
    for name, words in model.tensors.items():
        x = bf16_to_f32(words)
        if ".mlp.experts." in name:
            x = x.reshape(cfg.n_experts, -1, *x.shape[1:])
        out[_gguf_name(name, GPT_OSS)] = x
    return out


def gpt_oss_meta(cfg) -> dict:
    a = "gpt-oss."
    rs = cfg.rope_scaling
    return {a + "embedding_length": cfg.dim, a + "block_count": cfg.n_layers, a + "attention.head_count": cfg.n_heads,
            a + "attention.head_count_kv": cfg.n_kv_heads, a + "feed_forward_length": cfg.expert_ffn_dim,
            a + "context_length": cfg.max_seq, a + "rope.freq_base": float(cfg.rope_theta),
            a + "attention.key_length": cfg.head_dim, a + "attention.value_length": cfg.head_dim,
            a + "attention.layer_norm_rms_epsilon": float(cfg.rms_eps), a + "expert_count": cfg.n_experts,
            a + "expert_used_count": cfg.n_experts_used, a + "expert_feed_forward_length": cfg.expert_ffn_dim,
            a + "attention.sliding_window": cfg.sliding_window, a + "rope.scaling.type": "yarn",
            a + "rope.scaling.factor": float(rs.factor),
            a + "rope.scaling.original_context_length": rs.original_max_position_embeddings, **BYTE_VOCAB}


@pytest.mark.parametrize("experts", ["F32", "F16", "Q8_0", "MXFP4"])
def test_a_gguf_written_as_llama_cpp_writes_it_reads_back(experts, tmp_path):
    """Every tensor as written; the experts' matrices, of any type the loader decodes (llama.cpp's
    gpt-oss files hold MXFP4), as the gguf package dequantizes them, and the model computes with
    them what it computes with those values in bf16 (Q8_0's, kept quantized, within its rounding)."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    from arcpy.devices.reference_layer import weights_f32
    from arcpy.model import f32_to_bf16
    from arcpy.model.tensors import Model
    cfg = dataclasses.replace(SHAPES["gpt-oss-tiny"], vocab=V, max_seq=128)
    model = random_model(cfg, seed=7)
    tensors = converter_tensors(model)
    types = {name: Q[experts] for name in tensors if "_exps.weight" in name}
    loaded = load_model(write_gguf(tmp_path / "m.gguf", tensors, gpt_oss_meta(cfg), "gpt-oss", types))
    assert loaded.config == cfg
    assert set(loaded.tensors) == set(model.tensors)
    held = dict(model.tensors)
    for name, words in model.tensors.items():
        if not name.endswith(("experts.gate_proj.weight", "experts.up_proj.weight", "experts.down_proj.weight")):
            np.testing.assert_array_equal(loaded.tensors[name], words, err_msg=name)
            continue
        x = tensors[_gguf_name(name, GPT_OSS)]
        want = x if experts in ("F32", "F16") else dequantize(quantize(x, Q[experts]), Q[experts])
        want = want.astype(np.float16).astype(np.float32) if experts == "F16" else want
        np.testing.assert_array_equal(weights_f32(loaded.tensors[name]), want.reshape(-1, x.shape[-1]), err_msg=name)
        held[name] = f32_to_bf16(want.reshape(-1, x.shape[-1]))
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    same = Model(cfg, held, "held", "held")
    assert relative_error(reference_logits(loaded, tokens), reference_logits(same, tokens)) <= (1e-2 if experts == "Q8_0" else 0.0)


@pytest.mark.parametrize("experts", ["F32", "MXFP4"])
def test_a_gguf_with_the_experts_gate_and_up_fused_reads_as_one_with_them_apart(experts, tmp_path):
    """ffn_gate_up_exps (and its bias): each expert's gate rows, then its up rows; MXFP4 rows kept
    packed come out as the same blocks."""
    from gguf import GGMLQuantizationType as Q
    from test_gguf import fused_gate_up
    cfg = dataclasses.replace(SHAPES["gpt-oss-tiny"], vocab=V, max_seq=128)
    tensors = converter_tensors(random_model(cfg, seed=7))
    fused = dict(tensors)
    for i in range(cfg.n_layers):
        for kind in ("weight", "bias"):
            gate, up = fused.pop(f"blk.{i}.ffn_gate_exps.{kind}"), fused.pop(f"blk.{i}.ffn_up_exps.{kind}")
            fused[f"blk.{i}.ffn_gate_up_exps.{kind}"] = fused_gate_up(gate, up)
    loaded = [load_model(write_gguf(tmp_path / f"{how}.gguf", t, gpt_oss_meta(cfg), "gpt-oss",
                                    {name: Q[experts] for name in t if "_exps.weight" in name}))
              for how, t in (("apart", tensors), ("fused", fused))]
    assert loaded[0].config == loaded[1].config and set(loaded[0].tensors) == set(loaded[1].tensors)
    for name, want in loaded[0].tensors.items():
        got = loaded[1].tensors[name]
        np.testing.assert_array_equal(getattr(got, "data", got), getattr(want, "data", want), err_msg=name)


def test_gguf_refusals_are_one_line(tmp_path):
    cfg = dataclasses.replace(SHAPES["gpt-oss-tiny"], vocab=V, max_seq=128)
    tensors = converter_tensors(random_model(cfg, seed=7))
    del tensors["blk.1.attn_sinks.weight"]
    assert "missing tensor 'blk.1.attn_sinks.weight'" in load_error(
        write_gguf(tmp_path / "a.gguf", tensors, gpt_oss_meta(cfg), "gpt-oss"), load_model)
    tensors = converter_tensors(random_model(cfg, seed=7))
    tensors["blk.0.ffn_down_exps.bias"] = tensors["blk.0.ffn_down_exps.bias"][:, :-1]
    assert "tensor 'blk.0.ffn_down_exps.bias' has shape" in load_error(
        write_gguf(tmp_path / "b.gguf", tensors, gpt_oss_meta(cfg), "gpt-oss"), load_model)


def test_a_step_of_rows_reads_the_experts_its_biased_router_picks():
    from arcpy.model import f32_to_bf16
    from arcpy.model.moe import step_bytes
    model = synthetic_model("gpt-oss-tiny", max_seq=16)
    one, _ = step_bytes(model, rows=1)
    assert one == model.weight_bytes  # a token reads its 4 experts' matrices and biases
    average, worst = step_bytes(model, rows=4, steps=8)
    assert one < average <= worst == model.full_weight_bytes  # 4 rows of 4 may read all 8 experts
    for i in range(model.config.n_layers):  # a bias that routes every row to experts 0..3
        model.tensors[f"model.layers.{i}.mlp.gate.bias"] = f32_to_bf16(np.array([100.0] * 4 + [0.0] * 4, np.float32))
    assert step_bytes(model, rows=4, steps=8)[0] == one
