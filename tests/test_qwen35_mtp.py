"""Qwen3.5's multi-token prediction layer (arcpy/model/mtp.py, arcpy/devices/reference_mtp.py) on
the CPU: read from Hugging Face files and from GGUF alike, and one draft step of the reference
against a plain NumPy formulation of it written out here."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_families import V  # noqa: E402
from test_qwen35 import write_qwen35_gguf  # noqa: E402

from arcpy.devices.reference import ReferenceModel  # noqa: E402
from arcpy.devices.reference_mtp import MtpReference, final_hidden, layer_model  # noqa: E402
from arcpy.errors import InvalidArgumentError  # noqa: E402
from arcpy.model import (EMBED, LM_HEAD, SHAPES, Model, bf16_to_f32, f32_to_bf16, load_model, mtp,  # noqa: E402
                         random_model, save_model, save_safetensors)
from arcpy.model.checkpoint import _saved_tensors  # noqa: E402
from arcpy.model.families import family_for  # noqa: E402

SHAPES_ = ["qwen3.5-tiny", "qwen3.5moe-tiny"]


def with_mtp(shape: str, seed: int = 7) -> Model:
    """A random model of `shape` (the GGUF writer's byte vocabulary) with a random MTP layer: its norms 0.3 * N(0, 1)
    (factors 1 + w), fc scaled to keep the activations O(1)."""
    cfg = dataclasses.replace(SHAPES[shape], vocab=V, max_seq=64)
    model = random_model(cfg, seed=seed)
    layer = random_model(mtp.mtp_config(cfg), seed=seed + 1)
    rng = np.random.default_rng(seed)
    words = lambda x: f32_to_bf16(np.asarray(x, np.float32))  # noqa: E731
    own = {mtp.FC: words(rng.standard_normal((cfg.dim, 2 * cfg.dim)) / np.sqrt(2 * cfg.dim)),
           **{n: words(0.3 * rng.standard_normal(cfg.dim)) for n in mtp.NORMS}}
    own.update({mtp.LAYER + n[len("model.layers.0."):]: t for n, t in layer.tensors.items()
                if n.startswith("model.layers.0.")})
    return Model(cfg, model.tensors, name=shape, source="random", mtp=own)


def save_with_mtp(model: Model, directory: Path) -> Path:
    """model's files as a Qwen3.5 checkpoint with its MTP layer writes them: mtp.* beside the model's."""
    save_model(model, directory)
    family = family_for(model.config)
    layer = layer_model(model)
    files = {n.replace("model.layers.0.", mtp.LAYER, 1): t
             for n, t in _saved_tensors(layer.tensors, layer.config, family).items() if n.startswith("model.layers.0.")}
    files.update({n: model.mtp[n] for n in (mtp.FC, *mtp.NORMS) if n in model.mtp})
    save_safetensors(directory / "model.safetensors", {**_saved_tensors(model.tensors, model.config, family), **files},
                     "BF16")
    return directory


@pytest.mark.parametrize("shape", SHAPES_)
def test_hf_and_gguf_files_give_the_mtp_layer_read(shape, tmp_path):
    model = with_mtp(shape)
    hf = load_model(save_with_mtp(model, tmp_path / "hf"))
    gguf = load_model(write_qwen35_gguf(tmp_path / "m.gguf", model, mtp=True))
    assert set(hf.mtp) == set(gguf.mtp) == set(mtp.mtp_shapes(model.config)) and not hf.notes and not gguf.notes
    for name, words in model.mtp.items():
        np.testing.assert_array_equal(hf.mtp[name], words, err_msg=name)
        want = bf16_to_f32(words)
        if name in mtp.NORMS or name.endswith("norm.weight"):  # the GGUF's norms are whole: 1 + w, rounded once to bf16
            want = bf16_to_f32(f32_to_bf16(want + np.float32(1)))
        np.testing.assert_array_equal(bf16_to_f32(gguf.mtp[name]), want, err_msg=name)
    assert hf.stored_bytes == model.stored_bytes  # the table's bytes, not the MTP layer's


def test_a_model_without_an_mtp_layer_reports_none(tmp_path):
    plain = load_model(Path(__file__).parent / "data" / "qwen35" / "qwen3_5")
    assert plain.mtp == {}
    with pytest.raises(InvalidArgumentError, match="no multi-token prediction layer"):
        MtpReference(plain)
    model = with_mtp("qwen3.5-tiny")
    broken = dict(model.mtp)
    del broken[mtp.NORM_HIDDEN]  # an incomplete layer: the model loads without it, and says why
    model.mtp = broken
    read = load_model(save_with_mtp(model, tmp_path / "hf"))
    assert read.mtp == {} and "pre_fc_norm_hidden" in read.notes[0]


def plain_mtp_step(model: Model, hidden, token: int, pos: int, cache: list):
    """One MTP step written out: float32 weights, loops over heads, rotate-half RoPE on the first
    rotary_dim of each head; `cache` collects (k, v) per position (this test runs positions in
    order). Dense MLP only."""
    c, w, n = model.config, lambda n: bf16_to_f32(model.mtp[n]), lambda n: bf16_to_f32(model.mtp[n]) + 1
    norm = lambda x, f: x / np.sqrt(np.mean(x * x) + c.rms_eps) * f  # noqa: E731
    L = lambda s: w(mtp.LAYER + s)  # noqa: E731
    e = bf16_to_f32(model.tensors[EMBED])[token]
    u = w(mtp.FC) @ np.concatenate([norm(e, n(mtp.NORM_EMBEDDING)), norm(hidden, n(mtp.NORM_HIDDEN))])
    x = norm(u, L("input_layernorm.weight") + 1)
    qg = (L("self_attn.q_proj.weight") @ x).reshape(c.n_heads, 2, c.head_dim)  # per head: query, then gate
    q, gate = qg[:, 0], qg[:, 1].reshape(-1)
    k = (L("self_attn.k_proj.weight") @ x).reshape(c.n_kv_heads, c.head_dim)
    v = (L("self_attn.v_proj.weight") @ x).reshape(c.n_kv_heads, c.head_dim)
    q = np.stack([norm(h, L("self_attn.q_norm.weight") + 1) for h in q])
    k = np.stack([norm(h, L("self_attn.k_norm.weight") + 1) for h in k])
    r = c.rotary_dim
    angle = pos * c.rope_theta ** (-np.arange(0, r, 2) / r)

    def rope(h):
        a, b = h[: r // 2], h[r // 2: r]
        return np.concatenate([a * np.cos(angle) - b * np.sin(angle), b * np.cos(angle) + a * np.sin(angle), h[r:]])
    cache.append((np.stack([rope(h) for h in k]), v))
    out = []
    for head in range(c.n_heads):
        kv = head // (c.n_heads // c.n_kv_heads)
        qh = rope(q[head])
        scores = np.array([qh @ ks[kv] for ks, _ in cache]) / np.sqrt(c.head_dim)
        p = np.exp(scores - scores.max())
        out.append(sum(pi * vs[kv] for pi, (_, vs) in zip(p / p.sum(), cache)))
    att = np.concatenate(out) / (1 + np.exp(-gate))
    y = u + L("self_attn.o_proj.weight") @ att
    f = norm(y, L("post_attention_layernorm.weight") + 1)
    g_, up = L("mlp.gate_proj.weight") @ f, L("mlp.up_proj.weight") @ f
    y = y + L("mlp.down_proj.weight") @ (g_ / (1 + np.exp(-g_)) * up)
    g = norm(y, n(mtp.NORM))
    return bf16_to_f32(model.tensors[LM_HEAD]) @ g, g


def main_hiddens(model: Model, tokens: list[int]):
    ref = ReferenceModel(model)
    return [final_hidden(ref, t, p) for p, t in enumerate(tokens)]


def test_a_draft_step_is_the_plain_formulation():
    model = with_mtp("qwen3.5-tiny")
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    states = main_hiddens(model, tokens)
    ref, cache = MtpReference(model), []
    for p in range(len(tokens) - 1):  # each position's hidden state with the token after it
        got, g = ref.step(states[p][0], tokens[p + 1], p)
        want, g_want = plain_mtp_step(model, states[p][0].astype(np.float64), tokens[p + 1], p, cache)
        scale = np.abs(want).max()
        assert np.abs(got - want).max() / scale < 2e-2, p  # the reference's bf16 KV cache
        assert np.abs(g - g_want).max() / np.abs(g_want).max() < 2e-2, p


@pytest.mark.parametrize("shape", SHAPES_)
def test_the_draft_chains_k_steps(shape):
    model = with_mtp(shape)
    tokens = [3, 1, 4, 1, 5, 9]
    states = main_hiddens(model, tokens)
    ref = MtpReference(model)
    for p in range(len(tokens) - 1):
        ref.step(states[p][0], tokens[p + 1], p)
    last = len(tokens) - 1
    nxt = int(np.argmax(states[last][1]))
    drafted, hiddens = ref.draft(states[last][0], nxt, last, 3)
    assert len(drafted) == 3 and len(hiddens) == 3
    # The chain by hand: each step the last's hidden state and token, one position on, the same cache.
    again = MtpReference(model)
    for p in range(len(tokens) - 1):
        again.step(states[p][0], tokens[p + 1], p)
    h, tok = states[last][0], nxt
    for i in range(3):
        logits, h = again.step(h, tok, last + i)
        tok = int(np.argmax(logits))
        assert tok == drafted[i] and np.array_equal(h, hiddens[i])
