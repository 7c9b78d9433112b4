"""Gemma 4 (text) on the CPU: its checkpoints read into the config and tensors arcpy/model/gemma4.py
describes, and the NumPy reference against transformers' float32 logits on tiny random checkpoints
(tests/data/gemma4, made by scripts/gemma4_fixtures.py with transformers 5.25.0): dense (global
layers of their own head width with k = v, proportional RoPE, capped logits), MoE (the experts beside
the dense FFN) and per-layer embeddings with K/V shared by the last layers; each with a window
shorter than the sequence. The CUDA backend refuses Gemma 4 in one line.
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
from arcpy.model import gemma4
from arcpy.codes import OP_EXPERTS_BESIDE
from arcpy.model.gemma4 import cuda_refusal, kv_source
from arcpy.model.native import describe, layer_program
from arcpy.model.safetensors import save_safetensors

DATA = Path(__file__).parent / "data" / "gemma4"
FIXTURES = ("dense", "moe", "ple")
# The logits' largest error over the greedy steps, relative to their scale, against float32
# transformers, with arcpy's bf16 KV cache: measured 0.071% (dense), 0.079% (MoE), 0.21% (per-layer
# embeddings, whose shared layers read the rounded cache twice). With a float32 cache the reference
# computes what transformers computes up to float32 sums, over every position: measured 2.9e-7,
# 2.6e-7 and 4.6e-7.
TOLERANCE = 0.01
EXACT = 1e-5





def test_the_fixtures_read_into_the_gemma4_config():
    dense, moe, ple = (load_model(DATA / n).config for n in FIXTURES)
    for c in (dense, moe, ple):
        assert c.gemma4_layer and c.post_norms and c.qk_norm and not c.norm_plus_one
        assert (c.head_dim, c.global_head_dim, c.global_rope_dim) == (16, 32, 8)  # a quarter of 32 turns
        assert (c.sliding_window, c.window_pattern, c.rope_local_theta, c.rope_theta) == (6, 2, 1e4, 1e6)
        assert (c.attn_scale, c.embed_scale, c.final_softcap, c.activation) == (1.0, 8.0, 30.0, "gelu_tanh")
        assert c.tied_embeddings
    assert dense.k_eq_v and dense.global_n_kv_heads == 1 and dense.n_experts == 0
    assert not moe.k_eq_v and moe.global_n_kv_heads == 0  # transformers' per_layer_config form
    assert (moe.n_experts, moe.n_experts_used, moe.expert_ffn_dim, moe.ffn_dim) == (8, 2, 32, 48)
    assert (ple.ple_dim, ple.ple_vocab, ple.kv_shared_layers, ple.double_wide_mlp) == (16, 256, 2, True)
    assert [kv_source(ple, i) for i in range(6)] == [0, 1, 2, 3, 2, 3]
    assert describe(layer_program(moe, 1)) == "ATTN_IN QK_NORM ATTEND ATTN_OUT_NORM FFN_IN EXPERTS_BESIDE LAYER_SCALAR"
    assert describe(layer_program(ple, 4)).endswith("FFN_OUT_NORM PER_LAYER_INPUT LAYER_SCALAR")


def test_the_tensors_of_each_layer_kind():
    dense, ple = load_model(DATA / "dense"), load_model(DATA / "ple")
    t = dense.tensors
    assert t["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 16, 64)
    assert t["model.layers.1.self_attn.k_proj.weight"].shape == (1 * 32, 64)  # one kv head of 32
    assert "model.layers.1.self_attn.v_proj.weight" not in t  # k = v
    assert t["model.layers.1.self_attn.q_proj.weight"].shape == (4 * 32, 64)
    assert "model.layers.4.self_attn.k_proj.weight" not in ple.tensors  # in the files, not read
    assert ple.tensors["model.layers.4.mlp.gate_proj.weight"].shape == (96, 64)  # twice as wide
    assert ple.tensors["model.embed_tokens_per_layer.weight"].shape == (256, 6 * 16)


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
def test_the_prefill_gives_the_steps_logits(name):
    tokens = [int(t) for t in read_golden(DATA / name)["tokens"]]
    model = load_model(DATA / name)
    steps = reference_logits(model, tokens)
    ones = ReferenceModel(model).prefill(tokens, chunk=1, every_row=True)
    np.testing.assert_array_equal(ones, steps)  # a row at a time is the decode's step, bit for bit
    rows = ReferenceModel(model).prefill(tokens, chunk=5, every_row=True)
    assert relative_error(rows, steps) <= 1e-4  # summation order (and a bf16 cache entry it tips)
    rounded = ReferenceModel(model).prefill(tokens, bf16_products=True, every_row=True)
    assert relative_error(rounded, steps) <= 0.05  # libarc's prefill's bf16 products: rounding only
    device = NumpyDevice(ReferenceModel(model))
    device.enqueue_prefill(tokens, 0)
    assert relative_error(device.host_logits(), steps[-1]) <= 1e-4


def test_a_prefix_reused_from_the_store_continues_as_a_cold_prefill():
    """The store copies every layer's padded cache rows: global layers' wider heads too."""
    tokens = [int(t) for t in read_golden(DATA / "ple")["tokens"]]
    model = load_model(DATA / "ple")
    cold = NumpyDevice(ReferenceModel(model))
    cold.enqueue_prefill(tokens, 0)
    warm = NumpyDevice(ReferenceModel(model))
    warm.enqueue_prefill(tokens[:12], 0)
    warm.reserve_prefix_store(12 * warm.prefix_row_bytes)
    warm.save_prefix(0, 12)
    warm.ref.reset()
    warm.load_prefix(0, 12, 12)
    warm.enqueue_prefill(tokens[12:], 12)
    assert relative_error(warm.host_logits(), cold.host_logits()) <= 1e-4


def test_a_published_checkpoint_leaves_its_towers_unread(tmp_path):
    """Gemma4ForConditionalGeneration's files hold the vision and audio towers and their embedders
    beside the language model; a shared layer's files hold k_proj, v_proj and k_norm (the ple
    fixture's do). None of them is read."""
    src, out = DATA / "ple", tmp_path / "mm"
    shutil.copytree(src, out)
    plain = load_model(src)
    from arcpy.model.safetensors import read_header
    header = read_header(src / "model.safetensors", 10_000)
    assert "model.language_model.layers.4.self_attn.k_proj.weight" in header
    words = {("model.language_model." + n[len("model."):] if n.startswith("model.") else n): t
             for n, t in plain.tensors.items()}
    extra = np.zeros((4, 4), np.uint16)
    words.update({"model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight": extra,
                  "model.audio_tower.layers.0.lconv1d.linear_start.linear.weight": extra,
                  "model.embed_vision.embedding_projection.weight": extra, "model.embed_audio.embedding_projection.weight": extra})
    save_safetensors(out / "model.safetensors", words, "BF16")
    model = load_model(out)
    assert model.config == plain.config
    assert all(np.array_equal(model.tensors[n], t) for n, t in plain.tensors.items())


def test_per_layer_config_and_global_keys_say_the_same(tmp_path):
    """transformers' save_pretrained writes the full-attention layers' dims as per_layer_config; the
    published files as global_head_dim and num_global_key_value_heads."""
    doc = json.loads((DATA / "dense" / "config.json").read_text())
    text = doc["text_config"]
    full = [str(i) for i, k in enumerate(text["layer_types"]) if k == "full_attention"]
    saved = {**text, "architectures": ["Gemma4ForCausalLM"], "tie_word_embeddings": True,
             "per_layer_config": {i: {"head_dim": 32, "num_key_value_heads": 1} for i in full}}
    del saved["global_head_dim"], saved["num_global_key_value_heads"]
    from arcpy.model import config_from_hf
    assert config_from_hf(saved, "c") == config_from_hf(doc, "c")
    saved["per_layer_config"]["0"] = {"head_dim": 32}
    with pytest.raises(ModelFileError, match="per_layer_config must give every full-attention layer"):
        config_from_hf(saved, "c")


@pytest.mark.parametrize("name", FIXTURES)
def test_save_model_writes_what_load_model_reads(name, tmp_path):
    """As transformers' Gemma4ForCausalLM holds it: the fixture's own tensor names (the experts
    packed), but for the published files' prefix and the k and v their shared layers hold."""
    from arcpy.model.safetensors import read_header
    model = load_model(DATA / name)
    save_model(model, tmp_path / "out")
    back = load_model(tmp_path / "out")
    assert back.config == model.config
    assert set(back.tensors) == set(model.tensors)
    assert all(np.array_equal(back.tensors[n], t) for n, t in model.tensors.items())
    files = {n.replace("model.language_model.", "model.") for n in read_header(DATA / name / "model.safetensors", 10_000)}
    files = {n for n in files if not (n.startswith(("model.layers.4.self_attn.k", "model.layers.4.self_attn.v",
                                                    "model.layers.5.self_attn.k", "model.layers.5.self_attn.v"))
                                      and name == "ple")}
    assert set(read_header(tmp_path / "out" / "model.safetensors", 10_000)) == files


def test_the_tiny_preset_runs_on_the_reference():
    model = synthetic_model("gemma4-tiny", max_seq=64)
    c = model.config
    assert c.n_experts and c.ple_dim and c.kv_shared_layers and c.k_eq_v  # every feature at once
    out = ReferenceModel(model).greedy([1, 2, 3, 4], 6)
    assert len(out) == 6 and all(0 <= t < c.vocab for t in out)
    assert OP_EXPERTS_BESIDE in layer_program(c, 0)
    taller = dataclasses.replace(c, ple_vocab=2 * c.ple_vocab)  # a token reads one row of the per-layer table
    assert taller.n_params == c.n_params + c.ple_vocab * c.n_layers * c.ple_dim and taller.weight_bytes == c.weight_bytes


def test_the_real_dims_presets():
    """Google's figures: 30.7B parameters (31B); 25.2B, of which 3.8B a token (26B-A4B)."""
    dense, moe = SHAPES["gemma4-31B"], SHAPES["gemma4-26B-A4B"]
    assert 30.65e9 < dense.n_params < 30.75e9 and dense.weight_bytes == 2 * dense.n_params
    assert 25.15e9 < moe.n_params < 25.25e9
    assert 3.75e9 < moe.weight_bytes / 2 < 3.85e9
    assert [dense.window(i) for i in range(6)] == [1024] * 5 + [0] and dense.window(59) == 0


def test_the_26B_bench_preset_takes_llama_cpps_fallbacks_where_rows_are_not_whole_super_blocks():
    """Q4_K_M on Gemma-4-26B-A4B: the down matrices' rows (2,112 and 704 weights) are no whole
    number of 256-weight blocks, so Q4_K falls back to Q5_0 and Q6_K to Q8_0 there, as llama.cpp's
    quantizer does; every other matrix keeps the mix's Q4_K or Q6_K (rows of 2,816 and 4,096)."""
    from arcpy.codes import FORMAT_Q4_K, FORMAT_Q5_0, FORMAT_Q6_K, FORMAT_Q8_0
    from arcpy.model.presets import preset_formats
    formats = preset_formats("gemma4-26B-A4B-q4km")
    down = {f for name, f in formats.items() if name.endswith("down_proj.weight")}
    rest = {f for name, f in formats.items() if not name.endswith("down_proj.weight")}
    assert down == {FORMAT_Q5_0, FORMAT_Q8_0} and rest == {FORMAT_Q4_K, FORMAT_Q6_K}
    assert sum(name.endswith("experts.down_proj.weight") for name in formats) == 30


def test_the_cuda_cache_keeps_no_rows_for_a_layer_that_shares_kv():
    """A shared layer attends its source's rows (libarc's kv_planes_layer): the cache's runs of heads
    are the other layers' alone, each in its own kind's width."""
    from arcpy.devices.cuda_model import kv_heads
    cfg = SHAPES["gemma4-ple-tiny"]
    assert [kv_source(cfg, i) for i in range(6)] == [0, 1, 2, 3, 2, 3]
    assert kv_heads(cfg) == [32, 32, 64, 32, 32, 64]  # layers 0..3: two sliding of 2 heads, two global of 1
    assert kv_heads(dataclasses.replace(cfg, kv_shared_layers=0, double_wide_mlp=False)) == [32, 32, 64] * 3


def test_cuda_refuses_every_gemma4_until_its_gpu_tests_pass_before_allocating_anything(monkeypatch):
    """The CUDA backend holds every Gemma 4 form (libarc's table, program and kernels) and refuses
    them in one line until their GPU tests have passed (CUDA_LAYER_CHECKED)."""
    import arcpy.devices.cuda as cuda
    from arcpy.devices.cuda_model import check_supported

    def no_context(*a, **k):
        raise AssertionError("a context was made")
    monkeypatch.setattr(cuda, "Context", no_context)
    model = synthetic_model("gemma4-tiny", max_seq=16)
    with pytest.raises(InvalidArgumentError) as e:
        cuda.open_cuda_device(model)
    message = str(e.value)
    assert message == cuda_refusal(model.config) and "\n" not in message and "--backend numpy" in message
    # libarc's layers: refused until their kernels have passed their GPU tests, then run.
    dense = ("gemma4-tiny", "gemma4-dense-tiny", "gemma4-wide-test", "gemma4-moe-tiny", "gemma4-ple-tiny", "gemma4-31B",
             "gemma4-26B-A4B")
    for name in dense:
        message = cuda_refusal(SHAPES[name])
        assert ("await their GPU tests" in message and "\n" not in message) if not gemma4.CUDA_LAYER_CHECKED \
            else message == ""
    monkeypatch.setattr(gemma4, "CUDA_LAYER_CHECKED", True)
    for name in dense:
        assert cuda_refusal(SHAPES[name]) == ""
        check_supported(SHAPES[name])  # nothing raised
    from arcpy.model import random_model
    from arcpy.parallel.shard import ShardPlan
    dense = dataclasses.replace(model.config, n_experts=0, n_experts_used=0, expert_ffn_dim=0)
    with pytest.raises(InvalidArgumentError, match="Gemma 4's layers do not split"):
        ShardPlan.of(random_model(dense), 2)


@pytest.mark.parametrize("change, message", [
    (dict(kv_shared_layers=6), "kv_shared_layers must be below n_layers"),
    (dict(global_rope_dim=7), "global_rope_dim must be even"),
    (dict(global_n_kv_heads=3), "multiple of global_n_kv_heads"),
    (dict(ple_vocab=0), "ple_dim and ple_vocab"),
    (dict(shared_expert_ffn_dim=16), "without a shared expert"),
    (dict(norm_plus_one=True), "takes neither norm_plus_one"),
    (dict(sliding_window=0, window_pattern=0, kv_shared_layers=2), None),  # every layer global: a source exists
    (dict(window_pattern=4, kv_shared_layers=4), "none of layers 0..1 is one"),
    (dict(gemma4_layer=False, n_experts=0, n_experts_used=0, expert_ffn_dim=0), "need gemma4_layer"),
])
def test_config_checks(change, message):
    cfg = SHAPES["gemma4-tiny"]
    if message is None:
        dataclasses.replace(cfg, **change)
        return
    with pytest.raises(InvalidArgumentError, match=message) as e:
        dataclasses.replace(cfg, **change)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.update(use_bidirectional_attention="all"), "use_bidirectional_attention='all' is not supported"),
    (lambda t: t["rope_parameters"]["full_attention"].update(rope_type="yarn"), "default or the proportional"),
    (lambda t: t.update(rope_parameters={"rope_theta": 1e6}), "must give full_attention's and sliding_attention's"),
    (lambda t: t.update(layer_types=["full_attention", "sliding_attention"] * 2), "every n-th layer full attention"),
    (lambda t: t["rope_parameters"]["full_attention"].update(partial_rotary_factor=0.01), "turns no pair"),
    (lambda t: t.update(attention_k_eq_v="yes"), "key 'attention_k_eq_v' must be true or false"),
])
def test_config_json_errors_are_one_line(edit, message, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(DATA / "dense", d)
    doc = json.loads((d / "config.json").read_text())
    edit(doc["text_config"])
    (d / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match=message) as e:
        load_model(d)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------
# GGUF: the files llama.cpp's converter writes for gemma4


def write_gemma4_gguf(path, model, q8_experts: bool = False) -> Path:
    """The model as llama.cpp's converter writes it (float32 values): the layer kinds, kv heads and
    FFN widths by layer, the full-attention layers' head width as key_length, their proportional
    RoPE as rope_freqs; each expert's gate and up rows in one 3-D tensor; the k and v of the
    layers that share K/V written all the same, as the published files hold them. q8_experts: the
    experts' tensors quantized to Q8_0."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from gguf import GGUFWriter
    from test_families import gguf_meta
    from test_gguf import fused_gate_up, put
    from arcpy.model import bf16_to_f32
    from arcpy.model.families import family_for
    from arcpy.model.gemma4 import ffn_width, global_dims, layer_dims
    from arcpy.model.gguf import _gguf_name
    cfg, family, a = model.config, family_for(model.config), "gemma4."
    gh, _ = global_dims(cfg)
    n = cfg.n_layers
    meta = {**gguf_meta("gemma4", cfg), a + "attention.key_length": gh, a + "attention.value_length": gh,
            a + "attention.key_length_swa": cfg.head_dim, a + "attention.value_length_swa": cfg.head_dim,
            a + "attention.head_count_kv": [layer_dims(cfg, i)[1] for i in range(n)],
            a + "feed_forward_length": [ffn_width(cfg, i) for i in range(n)],
            a + "attention.sliding_window_pattern": [cfg.window(i) > 0 for i in range(n)],
            a + "attention.shared_kv_layers": cfg.kv_shared_layers, a + "rope.dimension_count": gh,
            a + "rope.dimension_count_swa": cfg.head_dim, a + "final_logit_softcapping": float(cfg.final_softcap),
            a + "embedding_length_per_layer_input": cfg.ple_dim}
    tensors = {}
    for name, words in model.tensors.items():
        x = bf16_to_f32(words)
        if name.endswith("mlp.experts.up_proj.weight"):
            continue
        if name.endswith("mlp.experts.gate_proj.weight"):  # Gemma 4's files fuse the experts' gate and up
            up = bf16_to_f32(model.tensors[name.replace("gate_proj", "up_proj")])
            x = fused_gate_up(*(t.reshape(cfg.n_experts, cfg.expert_ffn_dim, cfg.dim) for t in (x, up)))
        elif name.endswith("mlp.experts.down_proj.weight"):
            x = x.reshape(cfg.n_experts, cfg.dim, cfg.expert_ffn_dim)
        tensors[_gguf_name(name, family)] = np.ascontiguousarray(x, np.float32)
    turning = (cfg.global_rope_dim or gh) // 2
    tensors["rope_freqs.weight"] = np.array([1.0] * turning + [1e30] * (gh // 2 - turning), np.float32)
    for i in range(n - cfg.kv_shared_layers, n):
        hd, kv = layer_dims(cfg, i)
        tensors[f"blk.{i}.attn_k.weight"] = np.ones((kv * hd, cfg.dim), np.float32)
    if cfg.n_experts:
        meta.update({a + "expert_count": cfg.n_experts, a + "expert_used_count": cfg.n_experts_used,
                     a + "expert_feed_forward_length": cfg.expert_ffn_dim})
    w = GGUFWriter(path, "gemma4")
    for key, value in meta.items():
        put(w, key, value)
    for name, x in tensors.items():
        if q8_experts and "_exps.weight" in name:
            from gguf import GGMLQuantizationType
            from gguf.quants import quantize
            w.add_tensor(name, quantize(x, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


@pytest.mark.parametrize("dense", [False, True])
def test_a_gguf_written_as_llama_cpp_writes_it_reads_back(dense, tmp_path):
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_families import V
    from arcpy.model import random_model
    cfg = dataclasses.replace(SHAPES["gemma4-tiny"], vocab=V, ple_vocab=V, max_seq=128)
    if dense:  # k and v of their own on the full-attention layers; no experts, no per-layer inputs
        cfg = dataclasses.replace(cfg, k_eq_v=False, global_n_kv_heads=0, n_experts=0, n_experts_used=0,
                                  expert_ffn_dim=0, norm_topk_prob=False, ple_dim=0, ple_vocab=0, kv_shared_layers=0,
                                  double_wide_mlp=False)
    model = random_model(cfg, seed=7)
    loaded = load_model(write_gemma4_gguf(tmp_path / "m.gguf", model))
    assert loaded.config == cfg
    assert set(loaded.tensors) == set(model.tensors)
    for name, words in model.tensors.items():
        np.testing.assert_array_equal(loaded.tensors[name], words, err_msg=name)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    np.testing.assert_array_equal(reference_logits(loaded, tokens), reference_logits(model, tokens))


def test_quantized_experts_split_into_gate_and_up_rows_kept_quantized(tmp_path):
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_families import V
    from arcpy.model import bf16_to_f32, dequantize, random_model
    from arcpy.model.quant import QuantTensor
    cfg = dataclasses.replace(SHAPES["gemma4-tiny"], vocab=V, ple_vocab=V, max_seq=128)
    model = random_model(cfg, seed=7)
    loaded = load_model(write_gemma4_gguf(tmp_path / "q.gguf", model, q8_experts=True))
    for part in ("gate", "up", "down"):
        name = f"model.layers.2.mlp.experts.{part}_proj.weight"
        got, want = loaded.tensors[name], bf16_to_f32(model.tensors[name])
        assert isinstance(got, QuantTensor) and got.shape == want.shape
        assert np.abs(dequantize(got) - want).max() <= np.abs(want).max() / 100  # Q8_0's rounding alone


def test_a_gguf_whose_rope_freqs_are_not_proportional_rope_is_one_line(tmp_path):
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_families import V
    from arcpy.model import random_model
    cfg = dataclasses.replace(SHAPES["gemma4-tiny"], vocab=V, ple_vocab=V, max_seq=128)
    path = write_gemma4_gguf(tmp_path / "m.gguf", random_model(cfg, seed=7))
    data = bytearray(path.read_bytes())
    at = data.find(np.array([1.0, 1e30, 1e30], np.float32).tobytes()) + 4  # rope_freqs: the first pair not turning
    data[at:at + 4] = np.array([2.0], np.float32).tobytes()  # turning, at half the speed: not proportional RoPE
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="rope_freqs.weight' must be 1 for the pairs that turn") as e:
        load_model(bad)
    assert "\n" not in str(e.value)


def test_the_engine_on_the_numpy_backend_answers_as_transformers():
    """The whole path: open_engine's prefill (a chunk of 64), then the steps; a second request
    with the same prompt reuses nothing the first left behind."""
    from arcpy import open_engine
    g = read_golden(DATA / "ple")
    tokens, n = [int(t) for t in g["tokens"]], int(g["n_prompt"])
    with open_engine(load_model(DATA / "ple"), "numpy") as engine:
        for _ in range(2):
            assert list(engine.generate(tokens[:n], max_new_tokens=len(tokens) - n)) == tokens[n:]


def test_tensor_parallel_on_the_cpu_refuses_gemma4():
    from arcpy.backends import open_device
    with pytest.raises(InvalidArgumentError, match="Gemma 4's layers do not split") as e:
        open_device(load_model(DATA / "dense"), "numpy", devices=[0, 1])
    assert "\n" not in str(e.value)
