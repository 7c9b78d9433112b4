"""The reference prefill (ReferenceModel.prefill) against the reference token-by-token forward.

A prompt run as one batch, or in chunks, must leave the KV cache and the last logits that
feeding it one token at a time leaves. Only float32 summation order differs, but where a value
sits on a bf16 rounding boundary the cache takes the neighbouring bf16 value, and every later
layer and position sees that step: the first layer's cache is identical but for such steps, deeper
layers drift by a few parts in ten thousand (measured: at most 2e-3 of the norm, logits within
3e-3 of their scale), far below what a wrong position, head or mask does. Shapes: the synthetic presets with
multi-head attention (stories15M, head_dim 48), grouped-query attention with q/k/v biases
(qwen-tiny) and grouped-query attention with Llama 3 rope scaling (gqa, head_dim 64).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from arcpy.devices.reference import ReferenceModel
from arcpy.devices.reference_ops import attention, causal_attention
from arcpy.errors import InvalidArgumentError
from arcpy.model import synthetic_model

SHAPES = ["stories15M", "qwen-tiny", "gqa"]
MAX_SEQ = 64
PROMPT_LEN = 23


@pytest.fixture(scope="module", params=SHAPES)
def model(request):
    return synthetic_model(request.param, seed=3, max_seq=256)


@pytest.fixture(scope="module")
def _ref(model):
    return ReferenceModel(model, max_seq=MAX_SEQ)


@pytest.fixture
def ref(_ref):
    """A ReferenceModel of the module's model with an empty cache (weights converted once)."""
    _ref.reset()
    return _ref


@pytest.fixture(scope="module")
def expected(model):
    """The prompt fed one token at a time: (its ReferenceModel, the last logits). Read only."""
    return token_by_token(model, prompt(model))


def prompt(model, n=PROMPT_LEN, seed=5):
    return [int(t) for t in np.random.default_rng(seed).integers(0, model.config.vocab, size=n)]


def token_by_token(model, tokens, start=0):
    ref = ReferenceModel(model, max_seq=MAX_SEQ)
    for i, tok in enumerate(tokens):
        logits = ref.forward(tok, start + i, logits=i == len(tokens) - 1)
    return ref, logits


def assert_caches_agree(got: ReferenceModel, want: ReferenceModel, upto: int) -> None:
    """Layer 0 identical but for rounding steps; every layer within 1e-2 of the norm; nothing
    written past the prompt."""
    for name in ("k_cache", "v_cache"):
        g, w = getattr(got, name)[:, :, :upto], getattr(want, name)[:, :, :upto]
        assert np.mean(g[0] == w[0]) > 0.99, f"{name}: layer 0 differs in {np.mean(g[0] != w[0]):.4f} of its values"
        for li in range(g.shape[0]):
            rel = float(np.linalg.norm(g[li] - w[li]) / np.linalg.norm(w[li]))
            assert rel < 1e-2, f"{name}, layer {li}: relative difference {rel:.3g}"
        assert not getattr(got, name)[:, :, upto:].any(), f"{name}: rows past the prompt were written"


def assert_logits_agree(got, want) -> None:
    scale = max(1.0, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(got.astype(np.float64) - want))) / scale
    assert err < 1e-2, f"max relative logit difference {err:.3g}"
    top2 = np.sort(want)[-2:]
    if top2[1] - top2[0] > 2 * err * scale:
        assert int(np.argmax(got)) == int(np.argmax(want))


def test_prefill_of_a_whole_prompt_equals_feeding_it_token_by_token(model, expected, ref):
    tokens = prompt(model)
    want_ref, want = expected
    got = ref.prefill(tokens)
    assert got.shape == (model.config.vocab,) and got.dtype == np.float32
    assert_logits_agree(got, want)
    assert_caches_agree(ref, want_ref, len(tokens))


@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_prefill_in_chunks_attends_to_the_cache_of_earlier_chunks(model, expected, ref, chunk):
    tokens = prompt(model)
    want_ref, want = expected
    assert_logits_agree(ref.prefill(tokens, chunk=chunk), want)
    assert_caches_agree(ref, want_ref, len(tokens))


def test_prefill_from_a_later_position_continues_the_cache(model, expected, ref):
    tokens = prompt(model)
    split = 9
    want_ref, want = expected
    ref.prefill(tokens[:split])
    assert_logits_agree(ref.prefill(tokens[split:], start=split), want)
    assert_caches_agree(ref, want_ref, len(tokens))


def test_decoding_after_a_prefill_matches_decoding_after_token_by_token(model, ref):
    tokens = prompt(model)
    want_ref, _ = token_by_token(model, tokens)  # a fresh one: the decode below writes its cache
    ref.prefill(tokens, chunk=8)
    nxt = (tokens[-1] * 7 + 1) % model.config.vocab
    assert_logits_agree(ref.forward(nxt, len(tokens)), want_ref.forward(nxt, len(tokens)))


def test_causal_attention_of_one_query_is_the_decode_attention():
    rng = np.random.default_rng(1)
    n_heads, n_kv, hd, pos = 8, 2, 16, 11
    q = rng.standard_normal((n_heads, hd), dtype=np.float32)
    k = rng.standard_normal((n_kv, 20, hd), dtype=np.float32)
    v = rng.standard_normal((n_kv, 20, hd), dtype=np.float32)
    got = causal_attention(q[None], k, v, pos, n_kv)[0]
    np.testing.assert_allclose(got, attention(q, k, v, pos, n_kv), rtol=1e-5, atol=1e-6)


def test_causal_attention_never_reads_a_later_position():
    rng = np.random.default_rng(2)
    n_heads, n_kv, hd, start, t = 4, 4, 8, 3, 6
    q = rng.standard_normal((t, n_heads, hd), dtype=np.float32)
    k = rng.standard_normal((n_kv, start + t, hd), dtype=np.float32)
    v = rng.standard_normal((n_kv, start + t, hd), dtype=np.float32)
    before = causal_attention(q, k, v, start, n_kv)
    k[:, start + 2:] += 5.0  # rows only the queries from position start + 2 on may see
    v[:, start + 2:] -= 5.0
    after = causal_attention(q, k, v, start, n_kv)
    np.testing.assert_array_equal(after[:2], before[:2])
    assert not np.allclose(after[2:], before[2:])
    # and each query is the one-token attention at its own position
    for i in range(t):
        np.testing.assert_allclose(after[i], attention(q[i], k, v, start + i, n_kv), rtol=1e-5, atol=1e-6)
    assert math.isfinite(float(after.sum()))


@pytest.mark.parametrize("args,match", [
    (([],), "at least one token"),
    (([1, 10**9],), "out of range"),
    (([1, -1],), "out of range"),
    (([1, True],), "out of range"),
    (([1, 2], MAX_SEQ - 1), "exceed max_seq"),
    (([1, 2], -1), "exceed max_seq"),
    (([1, 2], 0, 0), "chunk must be a positive integer"),
    (([1, 2], 0, 1.5), "chunk must be a positive integer"),
])
def test_bad_prefill_arguments_raise_one_clear_error_and_write_nothing(args, match):
    model = synthetic_model("qwen-tiny", seed=3, max_seq=256)
    ref = ReferenceModel(model, max_seq=MAX_SEQ)
    with pytest.raises(InvalidArgumentError, match=match):
        ref.prefill(*args)
    assert not ref.k_cache.any() and not ref.v_cache.any()


def test_prefill_with_bf16_products_drifts_by_rounding_only(model, expected, ref):
    """libarc's prefill numerics: bf16 inputs to every product. Chunked and whole agree to float32
    noise; against the float32 forward the drift is that of bf16 rounding (measured on these
    shapes: 1e-2 to 5e-2 of the logit scale), not zero and nowhere near a wrong result."""
    tokens = prompt(model)
    want_ref, want = expected
    whole = ref.prefill(tokens, bf16_products=True)
    k_whole = ref.k_cache.copy()
    ref.reset()
    chunked = ref.prefill(tokens, chunk=8, bf16_products=True)
    assert_logits_agree(chunked, whole)
    scale = max(1.0, float(np.max(np.abs(want))))
    drift = float(np.max(np.abs(whole.astype(np.float64) - want))) / scale
    assert 1e-4 < drift < 0.1, f"bf16 products moved the logits by {drift:.3g} of their scale"
    k0 = want_ref.k_cache[0, :, :len(tokens)]
    rel0 = float(np.linalg.norm(k_whole[0, :, :len(tokens)] - k0) / np.linalg.norm(k0))
    assert 0 < rel0 < 1e-2, f"layer 0 cache moved by {rel0:.3g}"
