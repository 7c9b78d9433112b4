"""Sampling: greedy, and seeded temperature / top-k / top-p, defined so that the device loop and the
host path draw the same token from the same logits.

`Sampling.is_greedy()` is the one predicate both the sampler and the device-loop gate use: the
sampler takes the argmax exactly when it is true.

The draw, in this order (every integer step exact; both paths follow it bit for bit):

Inputs: float32 logits `l` over exactly the valid ids 0..V-1; temperature T > 0; top_k k (0 or
k >= V: off); top_p p in (0, 1] (1: off); seed (uint64); t, the absolute position the drawn token
will occupy.

1. `l = l + float32(0)` (-0.0 becomes +0.0). Candidate order: larger logit first, equal logits by
   lower id (the order of the uint32 key `bits ^ (0xFFFFFFFF if the sign bit is set else
   0x80000000)`, descending, then id ascending).
2. `m = max(l)` (finite: non-finite logits are refused before sampling).
3. `inv_t = float32(1.0 / T)` (divided in float64, rounded to float32).
4. `w = exp32((l - m) * inv_t)`, each operation in float32, with exp32 below; integer weights
   `q = uint64(rint(w * float32(2**40)))` (rint rounds half to even). The top token has q = 2**40.
5. top-k: if 0 < k < V, keep the first k ids in candidate order; else keep all.
6. top-p: `p32 = max(1, min(2**32, round(p * 2**32)))`. If p32 < 2**32: S = the sum of q over the
   kept ids, `need = ceil(S * p32 / 2**32)`, and keep the shortest prefix of the kept ids, in
   candidate order, whose q-sum is >= need.
7. `x` = word 0 of Philox4x32-10 with counter (t mod 2**32, t >> 32, 0, 0) and key
   (seed mod 2**32, seed >> 32). S' = the sum of q over the kept ids; `target = (S' * x) >> 32`.
   Walking the kept ids in ascending id order, the token is the first whose running sum of q
   (inclusive) exceeds target.

exp32(x), for x <= 0, is built from float32 multiplies and adds alone, each rounded on its own (no
fused multiply-add), so that NumPy and CUDA compute the same bits: 0 below -29 (where any weight
rounds to q = 0); else n = rint(x * LOG2E), r = (x - n * LN2_HI) - n * LN2_LO, e**r by its Taylor
polynomial of degree 6 in Horner's order, times 2**n (exact). The constants are float32 and
written out in EXP32_CONSTANTS; it is within 3 ulp of e**x.

The draw for position t depends on (seed, t) alone: not on the path, the burst, or the history.
"""

from __future__ import annotations

import dataclasses
import numbers
import secrets
from dataclasses import dataclass

import numpy as np

from arcpy.codes import MAX_TOP_LOGPROBS
from arcpy.errors import InvalidArgumentError

# Below MIN_TEMPERATURE sampling is greedy in all but name, and far below it logits / t overflow
# (1e-320 is a valid float); above MAX_TEMPERATURE every distribution is uniform to float32 precision.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-6, 1e6

WEIGHT_BITS = 40  # q of the top token: 2**40
MAX_VOCAB = 1 << 20  # every sum of weights is then at most 2**60: exact in uint64
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57      # multipliers of counter words 0 and 2
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85      # key increments between rounds

_LO32 = np.uint64(0xFFFFFFFF)
_SCALE = np.float32(2.0 ** WEIGHT_BITS)
_BLOCK = 1024    # weights summed in blocks: 1024 * 2**40 < 2**53, exact in float64
_PARTIAL = 4096  # top-p without top-k sorts the largest logits only, unless they fall short


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0   # 0: greedy
    top_k: int = 0             # 0: off; 1: greedy
    top_p: float = 1.0         # 1.0: off
    seed: int | None = None    # None: drawn once per sequence (Sampler.params holds it)

    def __post_init__(self):
        t = self.temperature
        if not (_is_real(t) and np.isfinite(t) and (t == 0.0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE)):
            raise InvalidArgumentError(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, "
                                       f"{MAX_TEMPERATURE:g}], got {t!r}")
        if self.seed is not None and not (isinstance(self.seed, numbers.Integral) and not isinstance(self.seed, bool)
                                          and 0 <= self.seed < 2**64):
            raise InvalidArgumentError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        if not (isinstance(self.top_k, numbers.Integral) and not isinstance(self.top_k, bool) and self.top_k >= 0):
            raise InvalidArgumentError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not (_is_real(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise InvalidArgumentError(f"top_p must be in (0, 1], got {self.top_p!r}")

    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


# --- the generator ---------------------------------------------------------------------------


def _words(value, bits: int, what: str) -> np.ndarray:
    a = np.asarray(value)
    if a.dtype.kind not in "ui" or (a.size and (a.min() < 0 or int(a.max()) >= 1 << bits)):
        raise InvalidArgumentError(f"{what} must be integers in [0, 2**{bits}), got {value!r}")
    return a.astype(np.uint64)


def philox4x32_10(counter, key) -> np.ndarray:
    """Philox4x32-10 (Random123) of four 32-bit counter words and two key words, each a scalar
    or an array (broadcast together): uint32 of shape (4, *broadcast shape). The 32x32-bit
    products are formed in uint64, so they are exact."""
    if len(counter) != 4 or len(key) != 2:
        raise InvalidArgumentError("philox4x32_10 takes four counter words and two key words")
    c0, c1, c2, c3 = (_words(w, 32, "counter words") for w in counter)
    k0, k1 = (_words(w, 32, "key words") for w in key)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(PHILOX_W0)) & _LO32, (k1 + np.uint64(PHILOX_W1)) & _LO32
        p0, p1 = np.uint64(PHILOX_M0) * c0, np.uint64(PHILOX_M1) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _LO32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _LO32
    return np.stack(np.broadcast_arrays(c0, c1, c2, c3)).astype(np.uint32)


def draw_words(seed: int, positions) -> np.ndarray:
    """The uniform 32-bit word that draws the token at each position (a scalar or an array)."""
    s = int(_words(seed, 64, "the seed"))
    t = _words(positions, 64, "positions")
    return philox4x32_10((t & _LO32, t >> np.uint64(32), 0, 0), (s & 0xFFFFFFFF, s >> 32))[0]


# --- the sampler -----------------------------------------------------------------------------


def top_p_fraction(top_p: float) -> int:
    """p as a fraction of 2**32, at least 1; 2**32 means off."""
    return max(1, min(2**32, round(float(top_p) * 2**32)))


# exp32's float32 constants, by their bits: LOG2E, LN2_HI, LN2_LO, then the polynomial's
# coefficients from the highest degree (1/720, 1/120, 1/24, 1/6, 1/2, 1, 1).
EXP32_CONSTANTS = np.array([0x3FB8AA3B, 0x3F317200, 0x35BFBE8E, 0x3AB60B61, 0x3C088889, 0x3D2AAAAB,
                            0x3E2AAAAB, 0x3F000000, 0x3F800000, 0x3F800000], np.uint32).view(np.float32)
EXP32_FLOOR = np.float32(-29.0)


def exp32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """e**x for float32 x <= 0, bit for bit as libarc's draw computes it (see the module's
    docstring); written into `out` when given."""
    log2e, ln2_hi, ln2_lo, *poly = EXP32_CONSTANTS
    x = np.asarray(x, dtype=np.float32)
    under = x < EXP32_FLOOR
    xc = np.maximum(x, EXP32_FLOOR)
    n = np.rint(xc * log2e)
    r = (xc - n * ln2_hi) - n * ln2_lo
    p = np.full_like(r, poly[0])
    for c in poly[1:]:
        p *= r
        p += c
    w = np.ldexp(p, n.astype(np.int32), out=out)
    w[under] = 0
    return w


def _weights(values: np.ndarray, top: np.float32, inv_t: np.float32, out: np.ndarray | None = None) -> np.ndarray:
    """q of each logit, held in float32: every q is an integer <= 2**40, which float32 holds
    exactly. q depends on the logit's value alone, so it may be computed again on a sorted copy
    of the logits and agree with the weights computed in id order."""
    w = np.subtract(values, top, out=out)  # each step is the float32 operation of the definition
    w *= inv_t
    exp32(w, out=w)
    w *= _SCALE
    return np.rint(w, out=w)


def _block_sums(w: np.ndarray) -> np.ndarray:
    """Running sums (uint64) of the weights over blocks of _BLOCK; the last is the total. A
    block's sum stays below 2**53, so float64 adds it up exactly."""
    sums = np.add.reduceat(w, np.arange(0, w.size, _BLOCK), dtype=np.float64)
    return np.cumsum(sums.astype(np.uint64))


def _first_above(w: np.ndarray, bound: int, blocks: np.ndarray | None = None) -> int:
    """The first index whose running sum of the weights (inclusive) exceeds `bound`, which is
    below their total."""
    blocks = _block_sums(w) if blocks is None else blocks
    b = int(np.searchsorted(blocks, np.uint64(bound), side="right"))
    before = int(blocks[b - 1]) if b else 0
    running = np.cumsum(w[b * _BLOCK:(b + 1) * _BLOCK].astype(np.uint64))
    return b * _BLOCK + int(np.searchsorted(running, np.uint64(bound - before), side="right"))


def _ceil_fraction(total: int, p32: int) -> int:
    return (total * p32 + 2**32 - 1) >> 32


class Sampler:
    """Draws tokens by the definition above. The seed is resolved once: `params` is the Sampling
    with it filled in, the parameters a device sampler is given. One sampler serves one sequence
    (it keeps scratch arrays the size of the vocabulary: fresh ones cost page faults every token)."""

    def __init__(self, sampling: Sampling):
        seed = secrets.randbits(64) if sampling.seed is None else int(sampling.seed)
        self.params = dataclasses.replace(sampling, seed=seed)
        t = float(sampling.temperature)  # 1 / T in float64 (a float32 T too), then rounded
        self._inv_t = np.float32(1.0 / t) if t else np.float32(0)
        self._p32 = top_p_fraction(sampling.top_p)
        self._scratch: tuple[np.ndarray, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.params.is_greedy()

    def sample(self, logits, position: int) -> int:
        """The token drawn from `logits` (exactly the valid ids) for absolute position `position`."""
        if self.greedy:
            return int(np.argmax(logits))
        x = int(draw_words(self.params.seed, position))
        q = self._kept_weights(logits)
        blocks = _block_sums(q)
        return _first_above(q, (int(blocks[-1]) * x) >> 32, blocks)

    def _kept_weights(self, logits) -> np.ndarray:
        """q of every id, zero outside the ids top-k and top-p keep (float32, a scratch array)."""
        given = np.asarray(logits, dtype=np.float32)
        if given.ndim != 1 or not 0 < given.size <= MAX_VOCAB:
            raise InvalidArgumentError(f"logits must be a vector of 1..{MAX_VOCAB} values, got shape {given.shape}")
        if not self._scratch or self._scratch[0].size != given.size:
            n = given.size
            self._scratch = (np.empty(n, np.float32), np.empty(n, np.float32), np.empty(n, bool),
                             np.empty(n, np.float32), np.empty(n, np.float32))
        l, q, mask = self._scratch[:3]
        np.add(given, np.float32(0), out=l)
        top = l.max()
        if not np.isfinite(top):
            raise InvalidArgumentError(f"sampling needs finite logits; the largest is {top}")
        _weights(l, top, self._inv_t, out=q)
        kept = self._kept(l, q, top)
        if kept is not None:
            edge, ties = kept
            first_ties = np.flatnonzero(np.equal(l, edge, out=mask))[:ties]
            np.greater(l, edge, out=mask)
            mask[first_ties] = True
            np.multiply(q, mask, out=q)
        return q

    def _kept(self, l: np.ndarray, q: np.ndarray, top: np.float32) -> tuple[np.float32, int] | None:
        """The ids top-k and top-p keep, as (L, r): every id whose logit exceeds L, and the first
        r ids (by id) whose logit equals L. None: every id."""
        V, k, p32 = l.size, self.params.top_k, self._p32
        if not 0 < k < V:
            if p32 == 2**32:
                return None
            need = _ceil_fraction(int(_block_sums(q)[-1]), p32)
            desc, w = self._largest_reaching(l, need, top)
        else:
            largest = self._partitioned(l, V - k)  # the k largest logits, as a multiset
            if p32 == 2**32:
                edge = largest.min()
                return edge, int(np.count_nonzero(largest == edge))
            desc, w = self._descending(largest, top)
            need = _ceil_fraction(int(_block_sums(w)[-1]), p32)
        j = _first_above(w, need - 1)
        edge = desc[j]
        return edge, int(np.count_nonzero(desc[:j + 1] == edge))

    def _partitioned(self, l: np.ndarray, kth: int) -> np.ndarray:
        """The logits from the kth smallest up, in a scratch copy of `l` partitioned there."""
        work = self._scratch[3]
        np.copyto(work, l)
        if kth:
            work.partition(kth)
        return work[kth:]

    def _descending(self, values: np.ndarray, top: np.float32) -> tuple[np.ndarray, np.ndarray]:
        """`values` (scratch, reordered in place) in candidate order, and their weights."""
        np.negative(values, out=values)  # sorted ascending, then negated back: contiguous, and
        values.sort()                    # no -0.0 is left to flip
        np.negative(values, out=values)
        return values, _weights(values, top, self._inv_t, out=self._scratch[4][:values.size])

    def _largest_reaching(self, l: np.ndarray, need: int, top: np.float32) -> tuple[np.ndarray, np.ndarray]:
        """The start of the candidate order, far enough that the weights reach `need`: the
        _PARTIAL largest logits usually do, and cost a partition instead of a full sort."""
        if l.size > _PARTIAL:
            desc, w = self._descending(self._partitioned(l, l.size - _PARTIAL), top)
            if int(_block_sums(w)[-1]) >= need:
                return desc, w
        return self._descending(self._partitioned(l, 0), top)


def kept_weights(logits, sampling: Sampling) -> tuple[np.ndarray, list[int]]:
    """The ids a draw from `logits` can choose (kept by top-k and top-p, with q > 0), ascending,
    and their weights q as Python ints (their sums are exact): the distribution a draw follows."""
    if sampling.is_greedy():
        return np.array([int(np.argmax(logits))]), [2**WEIGHT_BITS]
    q = Sampler(sampling)._kept_weights(logits)
    ids = np.flatnonzero(q)
    return ids, [int(v) for v in q[ids]]


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the model's distribution (log_softmax of the raw logits
    over the vocabulary: before temperature, top-k and top-p, as OpenAI defines it), and the `top`
    most likely (id, log-probability) pairs, most likely first (ties to the lower id)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(logits, token: int, top_n: int) -> TokenLogprob:
    """What the device loop computes in float32 (libarc/logprobs.cu), here in float64: `logits`
    are the valid ids' float32 logits."""
    x = np.asarray(logits, dtype=np.float64)
    top = float(x.max())
    log_z = top + float(np.log(np.exp(x - top).sum()))
    order = np.lexsort((np.arange(x.size), -x))[:top_n] if top_n else ()
    return TokenLogprob(float(x[token]) - log_z, tuple((int(i), float(x[i]) - log_z) for i in order))


def logprob_entries(logprob, top_ids, top_values, top_n: int) -> list[TokenLogprob]:
    """TokenLogprob entries from the lists a device writes them in: logprob[k], and entry k's ids
    and values from index k * width of top_ids and top_values (width MAX_TOP_LOGPROBS, arc.h), the
    first top_n of each; an id of -1 (past a vocabulary smaller than top_n) is no alternative."""
    width = MAX_TOP_LOGPROBS
    return [TokenLogprob(lp, tuple((i, v) for i, v in zip(top_ids[k * width:k * width + top_n],
                                                         top_values[k * width:k * width + top_n]) if i >= 0))
            for k, lp in enumerate(logprob)]
