"""The NumPy reference's gated DeltaNet layer (arcpy/model/hybrid.py states what it computes) and
its recurrent state, one token after another in float32; and the same rule in chunks of rows."""

from __future__ import annotations

import numpy as np

from arcpy.errors import InvalidArgumentError
from arcpy.model.hybrid import conv_dim

F32 = np.float32
_L2_EPS = 1e-6  # the q and k heads' L2 norm's epsilon (transformers' and FLA's l2norm)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return F32(1.0) / (F32(1.0) + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), x itself above 20 (torch's threshold)."""
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(F32)


def _l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + F32(_L2_EPS))


class DeltaNetState:
    """One DeltaNet layer's state for a sequence: the convolution's last kernel - 1 inputs
    (channels, kernel - 1), every value head's S (n_v, k_head_dim, v_head_dim), float32, and the
    position it takes next."""

    def __init__(self, cfg):
        self.conv = np.zeros((conv_dim(cfg), cfg.linear_conv_kernel - 1), F32)
        self.s = np.zeros((cfg.linear_n_v_heads, cfg.linear_k_head_dim, cfg.linear_v_head_dim), F32)
        self.position = 0

    def reset(self) -> None:
        self.conv.fill(0.0)
        self.s.fill(0.0)
        self.position = 0


class DeltaNet:
    """A DeltaNet layer's weights as float32: `t(name)` gives each, by its name after linear_attn."""

    def __init__(self, c, t):
        self.cfg = c
        self.w_qkv, self.w_z = t("in_proj_qkv.weight"), t("in_proj_z.weight")
        self.w_b, self.w_a = t("in_proj_b.weight"), t("in_proj_a.weight")
        self.conv = t("conv1d.weight")[:, 0, :]  # (channels, kernel): the last tap takes the newest input
        self.a = -np.exp(t("A_log"))  # -exp(A_log), per value head
        self.dt_bias = t("dt_bias")
        self.norm = t("norm.weight")  # the gated norm's factors as stored (no 1 + w)
        self.w_out = t("out_proj.weight")

    def project(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """ARC_OP_DN_IN and the per-head gates: the normed inputs h (T, dim) -> the convolution's
        inputs qkv (T, channels), z (T, v_dim), beta and g (T, n_v)."""
        qkv, z = h @ self.w_qkv.T, h @ self.w_z.T
        beta = _sigmoid(h @ self.w_b.T)
        g = self.a * _softplus(h @ self.w_a.T + self.dt_bias)
        return qkv, z, beta, g

    def step_rows(self, projected, state: DeltaNetState, positions: np.ndarray) -> np.ndarray:
        """ARC_OP_DN_STEP: project()'s rows at `positions`, one after another through `state` -> the
        gated norm's output (T, v_dim), what out_proj takes. Position 0 starts the state afresh;
        any other must be the one the state takes next (the state holds no earlier positions to
        go back to)."""
        c = self.cfg
        qkv, z, beta, g = projected
        out = np.empty((len(qkv), c.linear_n_v_heads, c.linear_v_head_dim), F32)
        for row, pos in enumerate(int(p) for p in positions):
            if pos == 0:
                state.reset()
            if pos != state.position:
                raise InvalidArgumentError(f"the DeltaNet state has taken positions 0..{state.position - 1}: "
                                           f"position {pos} does not follow them (restart from position 0)")
            out[row] = self._step(qkv[row], beta[row], g[row], state)
            state.position += 1
        n = out * (F32(1.0) / np.sqrt(np.mean(out * out, axis=-1, keepdims=True) + F32(c.rms_eps))) * self.norm
        gated = n * (z.reshape(out.shape) * _sigmoid(z.reshape(out.shape)))
        return gated.reshape(len(qkv), -1)

    def _step(self, qkv: np.ndarray, beta: np.ndarray, g: np.ndarray, state: DeltaNetState) -> np.ndarray:
        """One token: its projections qkv (channels,), beta and g (n_v,) -> its output (n_v, v_head_dim)."""
        c = self.cfg
        window = np.concatenate([state.conv, qkv[:, None]], axis=1)  # (channels, kernel)
        state.conv[...] = window[:, 1:]
        x = (window * self.conv).sum(axis=1)
        x = x * _sigmoid(x)
        kd, group = c.linear_n_k_heads * c.linear_k_head_dim, c.linear_n_v_heads // c.linear_n_k_heads
        q = _l2norm(x[:kd].reshape(c.linear_n_k_heads, -1)) * F32(c.linear_k_head_dim ** -0.5)
        k = _l2norm(x[kd:2 * kd].reshape(c.linear_n_k_heads, -1))
        v = x[2 * kd:].reshape(c.linear_n_v_heads, -1)
        q, k = np.repeat(q, group, axis=0), np.repeat(k, group, axis=0)  # value head h reads key head h // group
        s = state.s
        s *= np.exp(g)[:, None, None]
        delta = (v - np.einsum("hkv,hk->hv", s, k)) * beta[:, None]
        s += k[:, :, None] * delta[:, None, :]
        return np.einsum("hkv,hk->hv", s, q)


def chunked_delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray, g: np.ndarray,
                       s: np.ndarray, chunk: int = 64) -> np.ndarray:
    """The gated delta rule over T rows at once, `chunk` rows at a time, as a prefill on tensor cores
    would compute it: q, k (T, H, dk) (a value head's key head already repeated, q scaled), v
    (T, H, dv), beta and g (T, H), the state s (H, dk, dv), updated in place -> the outputs
    (T, H, dv). The same values as DeltaNet._step's rows one after another, in another order of
    sums: within a chunk, with G the running sum of g from its start, the rows' deltas
    d_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t) solve the unit lower-triangular system
    (I + A) D = beta (V - exp(G) K S), A[t, i] = beta_t exp(G_t - G_i) k_t . k_i for i < t; then
    O = exp(G) Q S + (exp(G_t - G_i) q_t . k_i for i <= t) D, and S becomes
    exp(G_last) S + sum_i exp(G_last - G_i) k_i d_i^T. Chunks start at multiples of `chunk` from
    the first row. This is the description a chunked prefill kernel is to follow (tested against the
    rows one after another: tests/test_deltanet_chunked.py); the layer's own prefill here still
    takes its rows one after another."""
    T = len(q)
    out = np.empty(v.shape, dtype=v.dtype)
    for c0 in range(0, T, chunk):
        qc, kc, vc = (x[c0:c0 + chunk].transpose(1, 0, 2) for x in (q, k, v))  # (H, C, d)
        bc, G = beta[c0:c0 + chunk].T, np.cumsum(g[c0:c0 + chunk].T, axis=1)  # (H, C)
        C = qc.shape[1]
        lower = np.tril(np.ones((C, C), dtype=bool), -1)
        decay = np.exp(np.where(lower | np.eye(C, dtype=bool), G[:, :, None] - G[:, None, :], -np.inf))
        a = np.where(lower, bc[:, :, None] * decay * (kc @ kc.transpose(0, 2, 1)), 0)
        rhs = bc[:, :, None] * (vc - np.exp(G)[:, :, None] * (kc @ s))
        d = np.empty_like(rhs)
        for t in range(C):  # forward substitution: (I + A) is unit lower triangular
            d[:, t] = rhs[:, t] - np.einsum("hi,hiv->hv", a[:, t, :t], d[:, :t])
        o = np.exp(G)[:, :, None] * (qc @ s) + (decay * (qc @ kc.transpose(0, 2, 1))) @ d
        out[c0:c0 + C] = o.transpose(1, 0, 2)
        last = G[:, -1]
        s *= np.exp(last)[:, None, None]
        s += (kc * np.exp(last[:, None] - G)[:, :, None]).transpose(0, 2, 1) @ d
    return out
