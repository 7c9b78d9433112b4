"""The gated delta rule in chunks (arcpy/devices/deltanet.py: chunked_delta_rule), the form a
prefill on tensor cores computes, against the rows one after another."""

import numpy as np
import pytest

from arcpy.devices.deltanet import chunked_delta_rule


def rows(T, H=3, dk=16, dv=8, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731 - the layer's L2-normed q and k
    q = unit(rng.standard_normal((T, H, dk))) * dk ** -0.5
    k = unit(rng.standard_normal((T, H, dk)))
    v = rng.standard_normal((T, H, dv))
    beta = 1 / (1 + np.exp(-rng.standard_normal((T, H))))
    g = -np.exp(rng.uniform(-1, 1, H)) * np.log1p(np.exp(rng.standard_normal((T, H))))  # -exp(A) softplus(a)
    s = rng.standard_normal((H, dk, dv)) * 0.3
    return tuple(x.astype(dtype) for x in (q, k, v, beta, g, s))


def one_by_one(q, k, v, beta, g, s):
    """The recurrence as DeltaNet._step computes it, a row at a time."""
    out = np.empty(v.shape, v.dtype)
    for t in range(len(q)):
        s *= np.exp(g[t])[:, None, None]
        delta = (v[t] - np.einsum("hkv,hk->hv", s, k[t])) * beta[t][:, None]
        s += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", s, q[t])
    return out


@pytest.mark.parametrize("T,chunk", [(1, 64), (7, 4), (64, 64), (150, 64), (33, 8)])
def test_chunks_compute_what_the_rows_one_after_another_compute(T, chunk):
    q, k, v, beta, g, s = rows(T, seed=T)
    s_rows, s_chunks = s.copy(), s.copy()
    want = one_by_one(q, k, v, beta, g, s_rows)
    got = chunked_delta_rule(q, k, v, beta, g, s_chunks, chunk)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(s_chunks, s_rows, rtol=1e-10, atol=1e-12)


def test_in_float32_the_chunks_stay_within_the_rows_rounding():
    q, k, v, beta, g, s = rows(300, seed=5, dtype=np.float32)
    s_rows, s_chunks, s_exact = s.copy(), s.copy(), s.astype(np.float64)
    want = one_by_one(*(x.astype(np.float64) for x in (q, k, v, beta, g)), s_exact)
    runs = ((chunked_delta_rule(q, k, v, beta, g, s_chunks), s_chunks), (one_by_one(q, k, v, beta, g, s_rows), s_rows))
    for got, state in runs:
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        assert np.abs(state - s_exact).max() <= 1e-5 * np.abs(s_exact).max()
