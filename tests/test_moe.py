"""Mixtures of experts on the CPU: the config and libarc's table and program for them, the NumPy
reference's MoE op against an independent computation, the routing's ties, the bytes a token
reads, and the Hugging Face and GGUF loaders (files written under transformers' and llama.cpp's
names), with their refusals."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as dequantize_blocks
from gguf.quants import quantize
from test_gguf import BYTE_VOCAB, converter_permute, load_error, random_k_blocks, write_gguf

from arcpy import codes
from arcpy.devices.reference import ReferenceModel
from arcpy.devices.reference_ops import _exact, _RowOps
from arcpy.errors import InvalidArgumentError
from arcpy.loading import load_gguf
from arcpy.model import (
    SHAPES,
    QuantTensor,
    bf16_to_f32,
    dequantize,
    expected_tensors,
    load_model,
    preset_formats,
    random_model,
    save_model,
)
from arcpy.model.moe import expected_distinct, expert_bytes, route, step_bytes
from arcpy.model.native import describe, layer_program

F32 = np.float32
QWEN = SHAPES["qwen3moe-tiny"]
MIXTRAL = SHAPES["mixtral-tiny"]
# Qwen2-MoE's shape: q/k/v biases, a shared expert gated by its own router, every 2nd layer MoE.
QWEN2 = dataclasses.replace(QWEN, qk_norm=False, qkv_bias=True, shared_expert_ffn_dim=256, moe_every=2,
                            mlp_only_layers=(), n_layers=4, norm_topk_prob=False)


# ---------------------------------------------------------------------------------------------
# the config, the table, the program


def test_the_presets_are_mixtures_of_at_least_8_experts_top_2_and_top_8():
    assert (QWEN.n_experts, QWEN.n_experts_used, MIXTRAL.n_experts, MIXTRAL.n_experts_used) == (16, 8, 8, 2)
    assert (QWEN.routing, MIXTRAL.routing) == ("softmax_topk", "topk_softmax")
    big = SHAPES["qwen3-30B-A3B-q4km"]
    assert (big.n_layers, big.dim, big.n_experts, big.n_experts_used, big.expert_ffn_dim) == (48, 2048, 128, 8, 768)
    assert SHAPES["mixtral-8x7B-q4km"].n_experts == 8


def test_moe_layers_run_the_moe_ops_and_dense_layers_the_glu():
    assert describe(layer_program(QWEN, 0)) == "ATTN_IN QK_NORM ATTEND ATTN_OUT MOE_IN MOE_OUT"
    assert describe(layer_program(QWEN, 1)) == "ATTN_IN QK_NORM ATTEND ATTN_OUT FFN_IN FFN_OUT"  # mlp_only_layers
    assert [codes.OP_MOE_IN in layer_program(QWEN2, i) for i in range(4)] == [False, True, False, True]


def test_the_table_gives_moe_layers_experts_and_dense_layers_the_glu():
    t = expected_tensors(QWEN2)
    e, f, d = QWEN2.n_experts, QWEN2.expert_ffn_dim, QWEN2.dim
    assert t["model.layers.1.mlp.gate.weight"] == (e, d)
    assert t["model.layers.1.mlp.experts.gate_proj.weight"] == (e * f, d)
    assert t["model.layers.1.mlp.experts.down_proj.weight"] == (e * d, f)
    assert t["model.layers.1.mlp.shared_expert_gate.weight"] == (1, d)
    assert t["model.layers.1.mlp.shared_expert.down_proj.weight"] == (d, 256)
    assert "model.layers.1.mlp.gate_proj.weight" not in t
    assert t["model.layers.0.mlp.gate_proj.weight"] == (QWEN2.ffn_dim, d)
    assert not any(name.startswith("model.layers.0.mlp.") and "expert" in name for name in t)


def test_mlp_only_layers_past_the_mask_and_bad_expert_fields_are_one_line_each():
    cases = [(dict(n_experts_used=17), "n_experts_used must be in 1..n_experts (16), got 17"),
             (dict(expert_ffn_dim=0), "expert_ffn_dim must be positive"),
             (dict(routing="sigmoid"), "routing must be one of softmax_topk, topk_softmax"),
             (dict(mlp_only_layers=(3,)), "mlp_only_layers must be ascending distinct layer indices below 3"),
             (dict(n_experts=0), "need n_experts > 0"),
             (dict(post_norms=True), "post_norms and mixture-of-experts layers do not combine")]
    for change, message in cases:
        with pytest.raises(InvalidArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
            dataclasses.replace(QWEN, **change)


def test_libarc_checks_the_expert_fields_it_reads():
    from arcpy import _lib
    from arcpy.model.native import native_config
    ffi, lib = _lib.load()
    c = native_config(ffi, QWEN)
    c.n_experts_used = 17
    rows, cols = ffi.new("int64_t *"), ffi.new("int64_t *")
    assert lib.arc_tensor_shape(c, lib.ARC_TENSOR_MOE_GATE, 0, rows, cols) == lib.ARC_INVALID_ARGUMENT
    assert "n_experts_used must be in [1, n_experts 16], got 17" in ffi.string(lib.arc_last_error()).decode()
    ops, count = ffi.new("int32_t[]", lib.ARC_MAX_LAYER_OPS), ffi.new("int32_t *")
    assert lib.arc_layer_program(c, 0, ops, count) == lib.ARC_INVALID_ARGUMENT


# ---------------------------------------------------------------------------------------------
# the routing


def test_ties_go_to_the_lower_expert():
    logits = np.array([[1.0, 3.0, 3.0, 2.0, 3.0], [0.0] * 5], dtype=F32)
    for routing in ("softmax_topk", "topk_softmax"):
        chosen, weights = route(logits, 2, routing, True)
        assert chosen.tolist() == [[1, 2], [0, 1]], routing
        assert np.allclose(weights, 0.5)
    chosen, _ = route(logits, 4, "softmax_topk", False)
    assert chosen.tolist() == [[1, 2, 4, 3], [0, 1, 2, 3]]


def test_the_two_orders_are_the_same_math():
    logits = np.random.default_rng(0).standard_normal((64, 16)).astype(F32) * 3
    a, wa = route(logits, 4, "softmax_topk", True)
    b, wb = route(logits, 4, "topk_softmax", False)
    assert np.array_equal(a, b)
    assert np.allclose(wa, wb, rtol=1e-6, atol=0)
    _, unnormed = route(logits, 4, "softmax_topk", False)
    assert not np.allclose(unnormed, wa)  # norm_topk_prob changes the weights


def test_forced_routing_with_tied_router_logits_picks_the_lowest_experts_in_the_model():
    """Router rows all equal: every logit ties, so every token takes experts 0..k-1 at 1/k each."""
    model = random_model(QWEN, seed=3)
    for i in range(QWEN.n_layers):
        name = f"model.layers.{i}.mlp.gate.weight"
        if name in model.tensors:
            model.tensors[name] = np.broadcast_to(model.tensors[name][:1], model.tensors[name].shape).copy()
    ref = ReferenceModel(model, max_seq=16)
    ref.prefill([5, 6, 7])
    for layer in (0, 2):
        assert ref.routing[layer].tolist() == [list(range(8))] * 3


# ---------------------------------------------------------------------------------------------
# the reference's MoE op against an independent computation


def _silu(g):
    return g / (1.0 + np.exp(-g))


def independent_moe(x, L, cfg):
    """One MoE FFN, a token at a time in float64, experts chosen by a sort of (-value, index)."""
    out = []
    for row in x.astype(np.float64):
        n = row / np.sqrt(np.mean(row * row) + cfg.rms_eps) * L.mlp_norm
        p = L.router.astype(np.float64) @ n
        if cfg.routing == "topk_softmax":
            chosen = sorted(range(cfg.n_experts), key=lambda e: (-p[e], e))[:cfg.n_experts_used]
            w = np.exp(p[chosen] - p[chosen].max())
            w /= w.sum()
        else:
            q = np.exp(p - p.max())
            q /= q.sum()
            chosen = sorted(range(cfg.n_experts), key=lambda e: (-q[e], e))[:cfg.n_experts_used]
            w = q[chosen] / (q[chosen].sum() if cfg.norm_topk_prob else 1.0)
        y = row.copy()
        for e, we in zip(chosen, w):
            h = _silu(L.e_gate[e] @ n) * (L.e_up[e] @ n)
            y += we * (L.e_down[e] @ h)
        if cfg.shared_expert_ffn_dim:
            gate = 1.0 / (1.0 + np.exp(-(L.s_router @ n)))
            y += gate * (L.s_down @ (_silu(L.s_gate @ n) * (L.s_up @ n)))
        out.append(y)
    return np.array(out)


@pytest.mark.parametrize("cfg", [QWEN, MIXTRAL, QWEN2, dataclasses.replace(QWEN, norm_topk_prob=False)],
                         ids=["qwen3moe", "mixtral", "qwen2moe-shared", "qwen3moe-unnormed"])
@pytest.mark.parametrize("rows", [1, 5])
def test_the_reference_moe_op_matches_an_independent_computation(cfg, rows):
    model = random_model(dataclasses.replace(cfg, max_seq=16), seed=1)
    ref = ReferenceModel(model)
    layer = next(i for i in range(cfg.n_layers) if cfg.is_moe_layer(i))
    L = ref.layers[layer]
    ops = _RowOps(ref, [0] * rows, 0, _exact)
    ops.x = np.random.default_rng(rows).standard_normal((rows, cfg.dim)).astype(F32)
    want = independent_moe(ops.x, L, cfg)
    ops.moe_in(layer, L)
    ops.moe_out(layer, L)
    assert ops.x.dtype == F32
    assert np.allclose(ops.x, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", ["qwen3moe-tiny", "mixtral-tiny"])
def test_the_prefill_form_equals_the_decode_form(shape):
    cfg = dataclasses.replace(SHAPES[shape], max_seq=32)
    model = random_model(cfg, seed=2)
    tokens = [3, 14, 15, 92, 65, 35]
    one, chunk = ReferenceModel(model), ReferenceModel(model)
    for pos, tok in enumerate(tokens):
        last = one.forward(tok, pos)
    whole = chunk.prefill(tokens, chunk=4)
    # Only summation order differs, and the bf16 rounding of k and v it can tip.
    assert float(np.abs(whole - last).max()) < 2e-3 * float(np.abs(last).max())
    for layer, chosen in one.routing.items():
        assert np.array_equal(chunk.routing[layer][-1], chosen[-1]), layer
    assert np.isfinite(chunk.prefill(tokens, bf16_products=True)).all()


# ---------------------------------------------------------------------------------------------
# bytes a token reads


def test_a_token_reads_only_its_k_experts():
    model = random_model(QWEN, seed=0)
    experts = expert_bytes(model)
    assert experts > 0
    assert model.weight_bytes == model.full_weight_bytes - experts + experts * 8 // 16
    assert model.weight_bytes == QWEN.weight_bytes  # bf16 throughout: the config's count
    assert step_bytes(model, rows=1) == (model.weight_bytes, model.weight_bytes)


def test_a_step_of_several_rows_reads_the_union_of_their_experts():
    model = random_model(MIXTRAL, seed=0)
    average, worst = step_bytes(model, rows=3, steps=200)
    per_expert = expert_bytes(model) / MIXTRAL.n_experts
    dense = model.full_weight_bytes - expert_bytes(model)
    assert worst == dense + round(per_expert * 6)  # 3 rows x top 2 of 8: 6 experts at most
    read = (average - dense) / per_expert
    assert 2 < read < 6
    assert abs(read - expected_distinct(8, 2, 3)) < 0.6  # random routers spread tokens near evenly


def test_the_bench_presets_hold_llama_cpps_q4_k_m_mix_for_experts():
    f = preset_formats("qwen3-30B-A3B-q4km")
    assert f["model.layers.0.mlp.experts.down_proj.weight"] == codes.FORMAT_Q6_K  # use_more_bits
    assert f["model.layers.10.mlp.experts.down_proj.weight"] == codes.FORMAT_Q4_K
    assert f["model.layers.10.mlp.experts.gate_proj.weight"] == codes.FORMAT_Q4_K
    assert "model.layers.0.mlp.gate.weight" not in f  # the router stays unquantized
    m = preset_formats("mixtral-8x7B-q4km")
    assert m["model.layers.3.self_attn.k_proj.weight"] == codes.FORMAT_Q8_0
    assert m["model.layers.3.self_attn.o_proj.weight"] == codes.FORMAT_Q5_K


# ---------------------------------------------------------------------------------------------
# Hugging Face files


@pytest.mark.parametrize("cfg,family", [(QWEN, "qwen3_moe"), (MIXTRAL, "mixtral"), (QWEN2, "qwen2_moe")])
def test_hf_files_round_trip_under_transformers_names(tmp_path, cfg, family):
    model = random_model(cfg, seed=4)
    save_model(model, tmp_path)
    doc = json.loads((tmp_path / "config.json").read_text())
    assert doc["model_type"] == family
    header = json.loads((tmp_path / "model.safetensors").read_bytes()[8:][:int.from_bytes(
        (tmp_path / "model.safetensors").read_bytes()[:8], "little")])
    layer = next(i for i in range(cfg.n_layers) if cfg.is_moe_layer(i))
    if family == "mixtral":
        assert f"model.layers.{layer}.block_sparse_moe.experts.7.w2.weight" in header
        assert f"model.layers.{layer}.block_sparse_moe.gate.weight" in header
    else:
        assert f"model.layers.{layer}.mlp.experts.{cfg.n_experts - 1}.down_proj.weight" in header
    assert not any(".mlp.experts.gate_proj" in name for name in header)
    back = load_model(tmp_path)
    assert back.config == cfg
    assert back.tensors.keys() == model.tensors.keys()
    for name, t in model.tensors.items():
        assert np.array_equal(back.tensors[name], t), name


def test_hf_refusals_are_one_line(tmp_path):
    model = random_model(QWEN, seed=4)
    save_model(model, tmp_path)
    doc = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**doc, "num_experts": 12}))
    msg = load_error(tmp_path, load_model)
    assert "unexpected tensor 'model.layers.0.mlp.experts.12." in msg
    (tmp_path / "config.json").write_text(json.dumps({**doc, "num_experts": 17, "num_experts_per_tok": 8}))
    assert "missing tensor 'model.layers.0.mlp.experts.16." in load_error(tmp_path, load_model)


# ---------------------------------------------------------------------------------------------
# GGUF files under llama.cpp's names


def _meta(cfg, arch):
    a = arch + "."
    meta = {a + "embedding_length": cfg.dim, a + "block_count": cfg.n_layers, a + "attention.head_count": cfg.n_heads,
            a + "attention.head_count_kv": cfg.n_kv_heads, a + "feed_forward_length": cfg.ffn_dim,
            a + "context_length": cfg.max_seq, a + "rope.freq_base": float(cfg.rope_theta),
            a + "rope.dimension_count": cfg.head_dim, a + "attention.key_length": cfg.head_dim,
            a + "attention.value_length": cfg.head_dim, a + "attention.layer_norm_rms_epsilon": float(cfg.rms_eps),
            a + "expert_count": cfg.n_experts, a + "expert_used_count": cfg.n_experts_used}
    if arch == "qwen3moe":
        meta[a + "expert_feed_forward_length"] = cfg.expert_ffn_dim
    return meta


_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm", "mlp.gate": "ffn_gate_inp",
          "mlp.experts.gate_proj": "ffn_gate_exps", "mlp.experts.up_proj": "ffn_up_exps",
          "mlp.experts.down_proj": "ffn_down_exps"}


def gguf_tensors(model, permute):
    """The model's tensors as float32 under llama.cpp's names: experts as 3-D (experts, rows, cols)."""
    cfg, out = model.config, {}
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    for name, words in model.tensors.items():
        x = bf16_to_f32(words)
        if name in top:
            out[top[name]] = x
            continue
        _, _, i, rest = name.split(".", 3)
        if permute and rest.startswith(("self_attn.q_proj", "self_attn.k_proj")):
            x = converter_permute(x, cfg.n_heads if "q_proj" in rest else cfg.n_kv_heads)
        if ".experts." in rest:
            x = x.reshape(cfg.n_experts, -1, x.shape[1])
        out[f"blk.{i}.{_NAMES[rest.removesuffix('.weight')]}.weight"] = x
    return out


def write(path, cfg, tensors, arch, types=None):
    return write_gguf(path, tensors, {**_meta(cfg, arch), **BYTE_VOCAB}, arch, types)


@pytest.mark.parametrize("cfg,arch", [(QWEN, "qwen3moe"), (MIXTRAL, "llama")])
def test_gguf_files_round_trip_under_llama_cpps_names(tmp_path, cfg, arch):
    cfg = dataclasses.replace(cfg, vocab=len(BYTE_VOCAB["tokenizer.ggml.tokens"]), mlp_only_layers=())
    model = random_model(cfg, seed=5)
    path = write(tmp_path / "m.gguf", cfg, gguf_tensors(model, permute=arch == "llama"), arch)
    back = load_gguf(path)[0]
    assert back.config == dataclasses.replace(cfg, max_seq=back.config.max_seq)
    for name, t in model.tensors.items():
        assert np.array_equal(back.tensors[name], t), name


def packed_experts_gguf(path, up_2=Q.Q5_K):
    """A qwen3moe file under llama.cpp's names whose experts are packed: layer 0's gate/up Q8_0 and
    down Q6_K, layer 2's gate Q4_K, up `up_2` and down Q4_K. -> (config, its tensors, the path)."""
    cfg = dataclasses.replace(QWEN, vocab=len(BYTE_VOCAB["tokenizer.ggml.tokens"]), mlp_only_layers=())
    tensors = gguf_tensors(random_model(cfg, seed=5), permute=False)
    rng = np.random.default_rng(0)
    e, f, d = cfg.n_experts, cfg.expert_ffn_dim, cfg.dim
    types = {"blk.0.ffn_gate_exps.weight": Q.Q8_0, "blk.0.ffn_up_exps.weight": Q.Q8_0,
             "blk.0.ffn_down_exps.weight": Q.Q6_K, "blk.2.ffn_gate_exps.weight": Q.Q4_K,
             "blk.2.ffn_up_exps.weight": up_2, "blk.2.ffn_down_exps.weight": Q.Q4_K}
    tensors["blk.0.ffn_down_exps.weight"] = random_k_blocks(Q.Q6_K, e * d * f // 256, rng).reshape(e, d, -1)
    tensors["blk.2.ffn_gate_exps.weight"] = random_k_blocks(Q.Q4_K, e * f * d // 256, rng).reshape(e, f, -1)
    tensors["blk.2.ffn_up_exps.weight"] = random_k_blocks(up_2, e * f * d // 256, rng).reshape(e, f, -1)
    tensors["blk.2.ffn_down_exps.weight"] = random_k_blocks(Q.Q4_K, e * d * f // 256, rng).reshape(e, d, -1)
    return cfg, tensors, write(path, cfg, tensors, "qwen3moe", types)


def test_gguf_experts_stay_in_their_packed_formats(tmp_path):
    cfg, tensors, path = packed_experts_gguf(tmp_path / "q.gguf")
    e, f, d = cfg.n_experts, cfg.expert_ffn_dim, cfg.dim
    back = load_gguf(path, quantized=True)[0]
    g0 = back.tensors["model.layers.0.mlp.experts.gate_proj.weight"]
    assert isinstance(g0, QuantTensor) and g0.format == codes.FORMAT_Q8_0 and g0.shape == (e * f, d)
    assert back.format_of("model.layers.0.mlp.experts.down_proj.weight") == codes.FORMAT_Q6_K
    assert back.format_of("model.layers.2.mlp.experts.down_proj.weight") == codes.FORMAT_Q4_K
    # gate Q4_K and up Q5_K: the fused [gate; up] reads one format, so both are made bf16 and noted
    assert back.format_of("model.layers.2.mlp.experts.gate_proj.weight") == codes.FORMAT_BF16
    assert "ffn_gate_exps.weight (blk 2)" in back.notes[0]
    want = np.asarray(tensors["blk.0.ffn_gate_exps.weight"]).reshape(e * f, d)
    assert np.allclose(dequantize(g0), want, atol=np.abs(want).max() / 100)
    ReferenceModel(back, max_seq=8).prefill([1, 2, 3])  # the reference runs the packed experts


def test_gguf_experts_in_mxfp4_stay_packed_with_the_files_values(tmp_path):
    """gpt-oss's expert type: a qwen3moe file whose every expert matrix is MXFP4 loads them packed,
    their weights the gguf package's dequantization of the file's blocks, and the reference runs them."""
    cfg = dataclasses.replace(QWEN, vocab=len(BYTE_VOCAB["tokenizer.ggml.tokens"]), mlp_only_layers=())
    tensors = gguf_tensors(random_model(cfg, seed=5), permute=False)
    types = {name: Q.MXFP4 for name in tensors if "_exps." in name}
    path = write(tmp_path / "x.gguf", cfg, tensors, "qwen3moe", types)
    back = load_gguf(path, quantized=True)[0]
    assert back.notes == ()
    for layer in range(cfg.n_layers):
        for part in ("gate", "up", "down"):
            t = back.tensors[f"model.layers.{layer}.mlp.experts.{part}_proj.weight"]
            assert isinstance(t, QuantTensor) and t.format == codes.FORMAT_MXFP4
            x = tensors[f"blk.{layer}.ffn_{part}_exps.weight"]
            stored = dequantize_blocks(quantize(x.reshape(-1, x.shape[-1]), Q.MXFP4), Q.MXFP4)
            assert np.array_equal(dequantize(t), stored)
    ReferenceModel(back, max_seq=8).prefill([1, 2, 3])


def test_gguf_refusals_are_one_line(tmp_path):
    cfg = dataclasses.replace(QWEN, vocab=len(BYTE_VOCAB["tokenizer.ggml.tokens"]), mlp_only_layers=())
    tensors = gguf_tensors(random_model(cfg, seed=5), permute=False)
    assert "mixture-of-experts qwen3 models are not supported" in load_error(
        write(tmp_path / "q.gguf", cfg, tensors, "qwen3"), load_gguf)
    del tensors["blk.2.ffn_up_exps.weight"]
    assert "missing tensor 'blk.2.ffn_up_exps.weight'" in load_error(
        write(tmp_path / "m.gguf", cfg, tensors, "qwen3moe"), load_gguf)


def test_expected_distinct_counts_a_union():
    assert expected_distinct(8, 2, 1) == pytest.approx(2)
    assert expected_distinct(128, 8, 4) == pytest.approx(128 * (1 - (120 / 128) ** 4))
    assert math.isclose(expected_distinct(8, 8, 3), 8)


def test_decode_runs_a_qwen3moe_gguf_on_the_numpy_backend(tmp_path):
    import subprocess
    import sys
    cfg = dataclasses.replace(QWEN, vocab=len(BYTE_VOCAB["tokenizer.ggml.tokens"]), mlp_only_layers=())
    path = write(tmp_path / "m.gguf", cfg, gguf_tensors(random_model(cfg, seed=5), permute=False), "qwen3moe")
    proc = subprocess.run([sys.executable, "-m", "arcpy.decode", "--model", str(path), "--backend", "numpy",
                           "--prompt-ids", "1 2 3", "-n", "6"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "6 tokens" in proc.stdout + proc.stderr
