"""Host-side sampling: greedy, and seeded temperature / top-k / top-p.

`Sampling.is_greedy()` is the one predicate both the sampler and the device-loop gate use: the
sampler takes the argmax exactly when it is true, so the gate cannot admit a configuration the
sampler would treat stochastically, or refuse one it would treat greedily.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InvalidArgumentError


# Below MIN_TEMPERATURE sampling is greedy in all but name, and far below it logits / t overflow
# (1e-320 is a valid float); above MAX_TEMPERATURE every distribution is uniform to float32 precision.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-6, 1e6


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0   # 0: greedy
    top_k: int = 0             # 0: off; 1: greedy
    top_p: float = 1.0         # 1.0: off
    seed: int | None = None

    def __post_init__(self):
        t = self.temperature
        if not (np.isfinite(t) and (t == 0.0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE)):
            raise InvalidArgumentError(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, "
                                       f"{MAX_TEMPERATURE:g}], got {t!r}")
        if self.seed is not None and not (isinstance(self.seed, int) and self.seed >= 0):
            raise InvalidArgumentError(f"seed must be an integer >= 0, got {self.seed!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise InvalidArgumentError(f"top_k must be an integer >= 0, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidArgumentError(f"top_p must be in (0, 1], got {self.top_p}")

    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class Sampler:
    def __init__(self, sampling: Sampling):
        self.sampling = sampling
        self.rng = np.random.default_rng(sampling.seed)

    @property
    def greedy(self) -> bool:
        return self.sampling.is_greedy()

    def sample(self, logits: np.ndarray) -> int:
        s = self.sampling
        if s.is_greedy():
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / s.temperature
        order = np.argsort(-z, kind="stable")
        if s.top_k > 0:
            order = order[: s.top_k]
        p = np.exp(z[order] - z[order[0]])
        p /= p.sum()
        if s.top_p < 1.0:
            # Keep the smallest prefix whose mass reaches top_p (at least one token).
            keep = int(np.searchsorted(np.cumsum(p), s.top_p)) + 1
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        return int(order[self.rng.choice(len(order), p=p)])
