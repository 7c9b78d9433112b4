"""The NumPy reference forward against a deliberately naive oracle, its per-op contracts, and the
embedded synthetic models.

The oracle below computes in float64 with explicit loops over rows, heads and positions, and
follows the numerics contract only where it changes results beyond rounding noise: the KV cache
holds bf16 values. Everything else (summation order, float32 activations) differs on purpose.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import warnings

import numpy as np
import pytest

from arcpy.devices.reference import ReferenceModel
from arcpy.devices.reference_ops import (
    argmax,
    attention,
    embedding,
    gemv,
    rmsnorm,
    rope,
    swiglu,
)
from arcpy.errors import InvalidArgumentError
from arcpy.model import (
    EMBED,
    SHAPES,
    Model,
    ModelConfig,
    RopeScaling,
    bf16_to_f32,
    random_model,
    rope_inv_freq,
    synthetic_model,
)

BASE = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=48, vocab=50, max_seq=16)
VARIANTS = {
    "tied": dataclasses.replace(BASE, tied_embeddings=True),
    "untied-qkv-bias": dataclasses.replace(BASE, qkv_bias=True),
    # thresholds 64/1 and 64/4 put the 4 frequencies of head_dim 8 in all three Llama 3 bands
    "llama3-rope": dataclasses.replace(BASE, rope_scaling=RopeScaling(4.0, 1.0, 4.0, 64), rope_theta=10000.0),
    "mha-tied-bias": dataclasses.replace(BASE, n_kv_heads=4, tied_embeddings=True, qkv_bias=True),
}
TOKENS = [3, 17, 42, 5, 17, 49, 0, 8]


# ---------------------------------------------------------------------------------------------
# the naive oracle


def naive_bf16_value(v: float) -> float:
    """float -> float32 -> nearest bf16 (ties to even), by comparing the two neighbours."""
    f = struct.unpack("<f", struct.pack("<f", v))[0]
    bits = struct.unpack("<I", struct.pack("<f", f))[0]
    down = struct.unpack("<f", struct.pack("<I", bits & 0xFFFF0000))[0]
    up = struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF0000) + 0x10000))[0]
    dd, du = abs(f - down), abs(up - f)
    return down if dd < du or (dd == du and (bits >> 16) % 2 == 0) else up


class NaiveModel:
    """A float64 forward written as plain loops. Flags turn contract rules off, to show they matter."""

    def __init__(self, model: Model, round_kv=True, interleaved_rope=False, gqa_modulo=False):
        self.cfg = model.config
        self.w = {n: bf16_to_f32(t).astype(np.float64) for n, t in model.tensors.items()}
        self.lm_head = self.w[EMBED] if self.cfg.tied_embeddings else self.w["lm_head.weight"]
        self.inv_freq = [float(f) for f in rope_inv_freq(self.cfg)]
        self.round_kv, self.interleaved, self.gqa_modulo = round_kv, interleaved_rope, gqa_modulo
        self.k = [[[] for _ in range(self.cfg.n_kv_heads)] for _ in range(self.cfg.n_layers)]
        self.v = [[[] for _ in range(self.cfg.n_kv_heads)] for _ in range(self.cfg.n_layers)]

    @staticmethod
    def matvec(W, x, b=None):
        out = [sum(W[r, c] * x[c] for c in range(W.shape[1])) for r in range(W.shape[0])]
        return [o + b[r] for r, o in enumerate(out)] if b is not None else out

    def norm(self, x, w):
        ms = sum(v * v for v in x) / len(x)
        return [v / math.sqrt(ms + self.cfg.rms_eps) * w[i] for i, v in enumerate(x)]

    def rotate(self, head, pos):
        hd, out = len(head), list(head)
        for i in range(hd // 2):
            a_idx, b_idx = (2 * i, 2 * i + 1) if self.interleaved else (i, i + hd // 2)
            ang = pos * self.inv_freq[i]
            a, b = head[a_idx], head[b_idx]
            out[a_idx] = a * math.cos(ang) - b * math.sin(ang)
            out[b_idx] = b * math.cos(ang) + a * math.sin(ang)
        return out

    def forward(self, token: int, pos: int) -> np.ndarray:
        cfg, w, hd = self.cfg, self.w, self.cfg.head_dim
        x = list(w[EMBED][token])
        for layer in range(cfg.n_layers):
            p = f"model.layers.{layer}."
            bias = (lambda n, p=p: w.get(p + f"self_attn.{n}_proj.bias"))
            h = self.norm(x, w[p + "input_layernorm.weight"])
            q = self.matvec(w[p + "self_attn.q_proj.weight"], h, bias("q"))
            k = self.matvec(w[p + "self_attn.k_proj.weight"], h, bias("k"))
            v = self.matvec(w[p + "self_attn.v_proj.weight"], h, bias("v"))
            for kh in range(cfg.n_kv_heads):
                kr = self.rotate(k[kh * hd:(kh + 1) * hd], pos)
                vr = v[kh * hd:(kh + 1) * hd]
                if self.round_kv:
                    kr, vr = [naive_bf16_value(e) for e in kr], [naive_bf16_value(e) for e in vr]
                cache_k, cache_v = self.k[layer][kh], self.v[layer][kh]
                del cache_k[pos:], cache_v[pos:]
                cache_k.append(kr)
                cache_v.append(vr)
            att = []
            group = cfg.n_heads // cfg.n_kv_heads
            for qh in range(cfg.n_heads):
                kh = qh % cfg.n_kv_heads if self.gqa_modulo else qh // group
                qr = self.rotate(q[qh * hd:(qh + 1) * hd], pos)
                scores = [sum(qr[d] * self.k[layer][kh][t][d] for d in range(hd)) / math.sqrt(hd)
                          for t in range(pos + 1)]
                m = max(scores)
                e = [math.exp(s - m) for s in scores]
                probs = [ei / sum(e) for ei in e]
                att += [sum(probs[t] * self.v[layer][kh][t][d] for t in range(pos + 1)) for d in range(hd)]
            o = self.matvec(w[p + "self_attn.o_proj.weight"], att)
            x = [a + b for a, b in zip(x, o)]
            h = self.norm(x, w[p + "post_attention_layernorm.weight"])
            g = self.matvec(w[p + "mlp.gate_proj.weight"], h)
            u = self.matvec(w[p + "mlp.up_proj.weight"], h)
            act = [gi / (1 + math.exp(-gi)) * ui for gi, ui in zip(g, u)]
            d = self.matvec(w[p + "mlp.down_proj.weight"], act)
            x = [a + b for a, b in zip(x, d)]
        return np.array(self.matvec(self.lm_head, self.norm(x, w["model.norm.weight"])))


def close(ref_logits, naive_logits) -> bool:
    scale = float(np.abs(naive_logits).max())
    return bool(np.allclose(ref_logits, naive_logits, rtol=1e-4, atol=1e-4 * scale))


def run_both(cfg, seed=11, **naive_flags):
    model = random_model(cfg, seed=seed)
    ref, naive = ReferenceModel(model), NaiveModel(model, **naive_flags)
    return [(ref.forward(t, pos), naive.forward(t, pos)) for pos, t in enumerate(TOKENS)]


# ---------------------------------------------------------------------------------------------
# whole forward against the oracle


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_reference_forward_matches_naive_oracle_at_every_position(variant):
    for pos, (ref_logits, naive_logits) in enumerate(run_both(VARIANTS[variant])):
        assert ref_logits.dtype == np.float32 and ref_logits.shape == (BASE.vocab,)
        assert close(ref_logits, naive_logits), f"{variant}: logits differ at position {pos}"


@pytest.mark.parametrize("flag", ["round_kv", "interleaved_rope", "gqa_modulo"])
def test_oracle_tolerance_is_tight_enough_to_catch_a_convention_change(flag):
    # The same comparison must fail when the oracle breaks one rule of the contract, otherwise the
    # test above could not notice the reference breaking it.
    flags = {"round_kv": False} if flag == "round_kv" else {flag: True}
    pairs = run_both(VARIANTS["untied-qkv-bias"], **flags)
    assert not all(close(r, n) for r, n in pairs)


def test_rewriting_a_position_replaces_its_cache_entry():
    model = random_model(VARIANTS["tied"], seed=5)
    ref = ReferenceModel(model)
    for pos, t in enumerate([1, 2, 3]):
        ref.forward(t, pos)
    again = ref.forward(9, 1)  # a new token at position 1 only sees 0..1
    fresh = ReferenceModel(model)
    fresh.forward(1, 0)
    np.testing.assert_array_equal(again, fresh.forward(9, 1))


def test_forward_writes_the_cache_only_at_its_position():
    ref = ReferenceModel(random_model(BASE, seed=2))
    ref.forward(4, 3)
    written = np.abs(ref.k_cache).sum(axis=(0, 1, 3)) > 0
    assert written.tolist() == [p == 3 for p in range(BASE.max_seq)]
    assert np.array_equal(ref.k_cache, bf16_to_f32(np.asarray(
        (ref.k_cache.view(np.uint32) >> 16).astype(np.uint16)))), "cache holds bf16 values only"


def test_reset_makes_the_next_sequence_independent_of_the_last():
    ref = ReferenceModel(random_model(BASE, seed=2))
    first = [ref.forward(t, p) for p, t in enumerate([7, 8])]
    ref.forward(30, 2)
    ref.reset()
    assert not ref.k_cache.any() and not ref.v_cache.any()
    again = [ref.forward(t, p) for p, t in enumerate([7, 8])]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("token,pos", [(-1, 0), (50, 0), (0, -1), (0, 16), (True, 0), (1.0, 0), (0, 2.0)])
def test_out_of_range_token_or_position_raises_and_changes_nothing(token, pos):
    ref = ReferenceModel(random_model(BASE, seed=2))
    ref.forward(1, 0)
    before = ref.k_cache.copy(), ref.v_cache.copy()
    with pytest.raises(InvalidArgumentError):
        ref.forward(token, pos)
    assert np.array_equal(ref.k_cache, before[0]) and np.array_equal(ref.v_cache, before[1])


def test_cache_can_be_shorter_than_the_config_context():
    ref = ReferenceModel(random_model(BASE, seed=2), max_seq=4)
    assert ref.k_cache.shape == (2, 2, 4, 8)
    ref.forward(1, 3)
    with pytest.raises(InvalidArgumentError, match="position 4"):
        ref.forward(1, 4)
    with pytest.raises(InvalidArgumentError):
        ReferenceModel(random_model(BASE, seed=2), max_seq=17)


def test_greedy_feeds_each_pick_back_at_the_next_position():
    model = random_model(VARIANTS["tied"], seed=8)
    got = ReferenceModel(model).greedy([3, 4], 5)
    ref, toks = ReferenceModel(model), []
    logits = ref.forward(3, 0)
    logits = ref.forward(4, 1)
    for pos in range(2, 7):
        toks.append(int(np.argmax(logits)))
        logits = ref.forward(toks[-1], pos)
    assert got == toks
    with pytest.raises(InvalidArgumentError):
        ReferenceModel(model).greedy([1] * 10, 8)  # needs positions up to 16


# ---------------------------------------------------------------------------------------------
# per-op contracts


def test_rmsnorm_scales_to_unit_rms_then_by_weight():
    x = np.array([3.0, -4.0, 0.0, 5.0], np.float32)
    w = np.array([1.0, 2.0, 3.0, 0.5], np.float32)
    expected = x / np.sqrt((9 + 16 + 25) / 4 + 1e-5) * w
    np.testing.assert_allclose(rmsnorm(x, w, 1e-5), expected, rtol=1e-6)
    assert rmsnorm(x, w, 1e-5).dtype == np.float32


def test_gemv_adds_bias_after_the_product():
    W = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = np.array([1.0, 0.0, -1.0], np.float32)
    assert gemv(W, x).tolist() == [-2.0, -2.0]
    assert gemv(W, x, np.array([0.5, 1.0], np.float32)).tolist() == [-1.5, -1.0]


def test_rope_pairs_element_i_with_i_plus_half_head_dim():
    inv_freq = np.array([1.0, 0.5], np.float32)
    x = np.array([[1.0, 0.0, 0.0, 0.0]], np.float32)  # only element 0 set: its partner is element 2
    out = rope(x, 1, inv_freq)
    np.testing.assert_allclose(out, [[math.cos(1.0), 0.0, math.sin(1.0), 0.0]], atol=1e-7)
    np.testing.assert_array_equal(rope(np.ones((3, 4), np.float32), 0, inv_freq), np.ones((3, 4)))


def test_attention_maps_consecutive_query_heads_to_one_kv_head():
    n_heads, n_kv, hd = 4, 2, 2
    k = np.zeros((n_kv, 3, hd), np.float32)
    v = np.stack([np.full((3, hd), 10.0 * (kh + 1), np.float32) for kh in range(n_kv)])
    out = attention(np.ones((n_heads, hd), np.float32), k, v, 0, n_kv)
    assert out[:, 0].tolist() == [10.0, 10.0, 20.0, 20.0]  # heads 0,1 -> kv 0; heads 2,3 -> kv 1


def test_attention_softmax_covers_positions_zero_to_pos_inclusive():
    k = np.zeros((1, 4, 2), np.float32)  # equal scores: a plain mean of the visible values
    v = np.array([[[1, 1], [3, 3], [5, 5], [1000, 1000]]], np.float32)
    assert attention(np.ones((1, 2), np.float32), k, v, 2, 1)[0].tolist() == [3.0, 3.0]
    # scores scaled by 1/sqrt(head_dim): q.k = 2 for position 1 -> weights e^(2/sqrt2) : 1
    k[0, 1] = [1, 1]
    out = attention(np.ones((1, 2), np.float32), k, v, 1, 1)[0, 0]
    wgt = math.exp(2 / math.sqrt(2))
    assert out == pytest.approx((1 + 3 * wgt) / (1 + wgt), rel=1e-6)


def test_swiglu_is_silu_of_gate_times_up_and_saturates_cleanly():
    g = np.array([0.0, 1.0, -2.0, -1000.0, 100.0], np.float32)
    u = np.array([5.0, 2.0, 1.0, 3.0, 0.5], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow warning or a NaN would leak to the caller
        out = swiglu(g, u)
    expected = [0.0, 2 / (1 + math.exp(-1)), -2 / (1 + math.exp(2)), 0.0, 50.0]
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-30)


def test_embedding_returns_a_copy_of_the_row():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    row = embedding(table, 2)
    row[:] = -1
    assert table[2].tolist() == [6.0, 7.0, 8.0]


def test_argmax_breaks_ties_to_the_lowest_index():
    assert argmax(np.array([1.0, 7.0, 3.0, 7.0, 7.0], np.float32)) == 1
    assert argmax(np.array([-np.inf, -5.0, -5.0], np.float32)) == 1
    assert isinstance(argmax(np.zeros(3, np.float32)), int)


# ---------------------------------------------------------------------------------------------
# synthetic models


def test_same_seed_gives_identical_weights_and_other_seeds_differ():
    a, b, c = synthetic_model("qwen-tiny", seed=0), synthetic_model("qwen-tiny", seed=0), synthetic_model("qwen-tiny", seed=1)
    assert all(np.array_equal(a.tensors[n], b.tensors[n]) for n in a.tensors)
    assert all(not np.array_equal(a.tensors[n], c.tensors[n]) for n in a.tensors)


def test_preset_shapes_match_their_published_configs():
    s15, s110, gqa, qwen = (SHAPES[k] for k in ("stories15M", "stories110M", "gqa", "qwen-tiny"))
    assert (s15.dim, s15.n_layers, s15.n_heads, s15.n_kv_heads, s15.ffn_dim, s15.vocab, s15.max_seq) == \
        (288, 6, 6, 6, 768, 32000, 1024)
    assert s15.tied_embeddings and s15.rope_theta == 10000.0 and s15.rms_eps == 1e-5
    assert (s110.dim, s110.n_layers, s110.n_heads, s110.ffn_dim, s110.max_seq) == (768, 12, 12, 2048, 1024)
    assert s110.tied_embeddings and 100e6 < s110.n_params < 120e6
    assert (gqa.dim, gqa.n_heads, gqa.n_kv_heads, gqa.head_dim, gqa.ffn_dim, gqa.n_layers) == (2048, 32, 8, 64, 5632, 2)
    assert gqa.rope_theta == 500000.0 and gqa.rope_scaling == RopeScaling(32.0, 1.0, 4.0, 8192)
    assert not gqa.tied_embeddings and gqa.max_seq == 4096
    assert qwen.qkv_bias


def test_synthetic_model_builds_the_preset_with_a_context_override():
    m = synthetic_model("stories15M", max_seq=4096)
    assert m.config == dataclasses.replace(SHAPES["stories15M"], max_seq=4096)
    assert m.name == "stories15M" and m.tensor(EMBED).shape == (32000, 288)
    values = bf16_to_f32(m.tensor(EMBED))
    assert 0.3 < float(values.std()) < 1.0 and np.isfinite(values).all()
    with pytest.raises(InvalidArgumentError, match="unknown synthetic shape"):
        synthetic_model("stories7B")


def test_greedy_decoding_of_stories15m_does_not_collapse_to_one_token():
    tokens = ReferenceModel(synthetic_model("stories15M", seed=0), max_seq=64).greedy([1], 32)
    assert len(tokens) == 32
    assert len(set(tokens)) >= 16, tokens


def test_forward_without_logits_fills_the_same_cache():
    model = synthetic_model("qwen-tiny", seed=2)
    a, b = ReferenceModel(model), ReferenceModel(model)
    for pos, tok in enumerate([3, 1, 4, 1]):
        a.forward(tok, pos)
        assert b.forward(tok, pos, logits=False) is None
    assert np.array_equal(a.k_cache, b.k_cache) and np.array_equal(a.v_cache, b.v_cache)
    assert np.array_equal(a.forward(5, 4), b.forward(5, 4))
