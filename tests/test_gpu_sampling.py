"""GPU tier: the draw (libarc's sampler) against the host sampler, its statistics, and sampled
sequences on the device loop (marker `gpu`).

Both paths follow one definition (arcpy.sampling): integer weights from an exp built of float32
multiplies and adds (the same bits on both), then integer selection and an integer draw whose
random word depends only on (seed, position). So the paths must agree on every draw; the equality
test still measures how close each disagreement's target lies to a cumulative boundary, so that a
failure says whether it is rounding or a wrong token.
"""

import math

import numpy as np
import pytest
from gpu_buffers import device, engine  # noqa: F401 (a fixture)

from arcpy import _lib
from arcpy.devices.context import sampling_struct
from arcpy.errors import InvalidArgumentError
from arcpy.loop.engine import DEVICE_LOOP, HOST
from arcpy.sampling import Sampler, Sampling, draw_words, kept_weights

pytestmark = pytest.mark.gpu
MAX_DRAWS = 100_000


class Draws:
    """libarc's arc_sample over logits uploaded once, at many positions, into pinned memory."""

    def __init__(self, ctx):
        self.ctx, self.ffi, self.lib = ctx, ctx.ffi, ctx.lib
        self.out, out_dev = ctx.pinned((MAX_DRAWS,), np.int32)
        self.out_dev = self.ffi.cast("int32_t *", out_dev)
        self.logits_dev, self.capacity = None, 0

    def upload(self, logits: np.ndarray) -> None:
        logits = np.ascontiguousarray(logits, np.float32)
        if logits.nbytes > self.capacity:
            if self.logits_dev is not None:
                self.ctx.device_free(self.logits_dev)
            self.logits_dev, self.capacity = self.ctx.device_alloc(logits.nbytes), logits.nbytes
        self.ctx.upload_async(self.logits_dev, logits)
        self.ctx.wait_idle()
        self.n = logits.size

    def draw(self, sampling: Sampling, positions) -> np.ndarray:
        s = sampling_struct(self.ffi, sampling)
        logits = self.ffi.cast("float *", self.logits_dev)
        for j, t in enumerate(positions):
            _lib.check(self.lib.arc_sample(self.ctx.ptr, logits, self.n, s, int(t), self.out_dev + j))
        self.ctx.wait_idle()
        return self.out[: len(positions)].copy()


@pytest.fixture(scope="module")
def draws(ctx):
    return Draws(ctx)


def logits_for(kind: str, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "gauss":
        x = rng.standard_normal(vocab).astype(np.float32) * np.float32(2.0)
    elif kind == "llm":  # a few strong candidates over a long, low tail
        x = rng.standard_normal(vocab).astype(np.float32) * np.float32(1.5)
        x[rng.choice(vocab, 20, replace=False)] += rng.uniform(6, 12, 20).astype(np.float32)
    else:  # "ties": values on a coarse grid, many equal, some -inf and -0.0
        x = np.round(rng.standard_normal(vocab) * 4) / 4
        x = x.astype(np.float32)
        x[rng.choice(vocab, vocab // 50, replace=False)] = -np.inf
        x[rng.choice(vocab, 10, replace=False)] = np.float32(-0.0)
    return x


def test_the_huge_top_k_of_a_request_is_off_not_an_overflow(draws):
    logits = logits_for("gauss", 3000, seed=4)
    draws.upload(logits)
    big, off = Sampling(temperature=1.0, top_k=2 ** 40, seed=3), Sampling(temperature=1.0, seed=3)
    assert draws.draw(big, range(50)).tolist() == draws.draw(off, range(50)).tolist()


SETTINGS = [
    Sampling(temperature=1.0, seed=11),
    Sampling(temperature=0.7, top_k=40, seed=12),
    Sampling(temperature=0.8, top_p=0.95, seed=13),
    Sampling(temperature=1.3, top_k=200, top_p=0.9, seed=14),
    Sampling(temperature=0.5, top_k=10 ** 6, top_p=0.5, seed=15),
    Sampling(temperature=2.0, top_k=3, top_p=0.999, seed=2 ** 64 - 1),
]


def boundary_distance(logits, sampling, position) -> float:
    """How close (as a fraction of the kept mass) the draw's target lies to the nearest cumulative
    boundary of the kept ids, by the host's weights."""
    ids, q = kept_weights(logits, sampling)
    total = sum(q)
    x = int(draw_words(sampling.seed, np.array([position]))[0])
    target = (total * x) >> 32
    cum = np.cumsum(np.array(q, dtype=object))
    return float(min(abs(int(c) - target) for c in cum)) / total


# Up to 65,536 ids the draw runs in one thread-block cluster on the H200 (1,000 ids in one block
# of it, 32,000 at 4 ids a thread, 49,152 at 8); 128,256 and 151,936 (Qwen2's vocabulary) take the
# grid-wide draw.
@pytest.mark.parametrize("kind,vocab", [("gauss", 1000), ("ties", 32000), ("gauss", 32000), ("gauss", 49152),
                                        ("llm", 128256), ("ties", 151936)])
def test_the_draw_equals_the_host_sampler_on_the_same_logits(draws, kind, vocab):
    logits = logits_for(kind, vocab, seed=vocab)
    draws.upload(logits)
    positions = np.arange(0, 3000, 7) + vocab  # positions far from 0, in steps
    compared, differ = 0, []
    for s in SETTINGS:
        got = draws.draw(s, positions)
        sampler = Sampler(s)
        for t, tok in zip(positions, got):
            want = sampler.sample(logits, int(t))
            compared += 1
            if tok != want:
                differ.append((s, int(t), int(tok), want, boundary_distance(logits, s, int(t))))
    print(f"{kind} vocab {vocab}: {compared} draws compared, {len(differ)} differ: {differ}")
    assert differ == []


def chi_square_bound(df: int, z: float = 3.719) -> float:
    """The chi-square quantile at the normal quantile z (3.719: significance 1e-4), by the
    Wilson-Hilferty approximation."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


@pytest.mark.parametrize("sampling", [Sampling(temperature=0.9, seed=21), Sampling(temperature=1.1, top_k=12, seed=22),
                                      Sampling(temperature=0.8, top_p=0.8, seed=23),
                                      Sampling(temperature=1.5, top_k=25, top_p=0.9, seed=24)],
                         ids=["temperature", "top-k", "top-p", "both"])
def test_draw_frequencies_follow_the_exact_distribution(draws, sampling):
    rng = np.random.default_rng(5)
    logits = np.concatenate([rng.normal(0, 1.5, 60), [2.5, 2.5, 2.5]]).astype(np.float32)  # with ties
    draws.upload(logits)
    got = draws.draw(sampling, np.arange(MAX_DRAWS))
    ids, q = kept_weights(logits, sampling)
    p = np.array(q, dtype=np.float64) / float(sum(q))
    counts = np.bincount(got, minlength=logits.size)
    outside = np.setdiff1d(np.nonzero(counts)[0], ids)
    assert outside.size == 0, f"ids outside the kept set were drawn: {outside}"
    expected = MAX_DRAWS * p
    big = expected >= 5  # pool the rare ids into one cell
    observed = np.append(counts[ids][big], counts[ids][~big].sum())
    expect = np.append(expected[big], expected[~big].sum())
    keep = expect > 0
    stat = float(((observed[keep] - expect[keep]) ** 2 / expect[keep]).sum())
    df = int(keep.sum()) - 1
    print(f"{sampling}: {len(ids)} kept, chi-square {stat:.1f} with {df} degrees of freedom "
          f"(bound {chi_square_bound(df):.1f})")
    assert df >= 1 and stat < chi_square_bound(df)


def test_the_draw_depends_only_on_seed_and_position(draws):
    logits = logits_for("gauss", 5000, seed=9)
    draws.upload(logits)
    s = Sampling(temperature=1.0, top_p=0.9, seed=77)
    a = draws.draw(s, [100, 5, 100, 7])
    b = draws.draw(s, [7, 100, 5])
    assert a[0] == a[2] == b[1] and a[1] == b[2] and a[3] == b[0]
    other = draws.draw(Sampling(temperature=1.0, top_p=0.9, seed=78), np.arange(200))
    mine = draws.draw(s, np.arange(200))
    assert (other != mine).any()


def test_non_finite_logits_draw_minus_one(draws):
    for bad in (np.nan, np.inf):
        logits = np.zeros(3000, np.float32)
        logits[1234] = bad
        draws.upload(logits)
        assert draws.draw(Sampling(temperature=1.0, seed=1), [3]).tolist() == [-1]
    draws.upload(np.full(100, -np.inf, np.float32))
    assert draws.draw(Sampling(temperature=1.0, seed=1), [3]).tolist() == [-1]


@pytest.mark.parametrize("field,value", [("temperature", 0.0), ("temperature", float("nan")),
                                         ("temperature", 1e-300), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1)])
def test_bad_parameters_are_refused_by_libarc(ctx, draws, field, value):
    draws.upload(np.zeros(10, np.float32))
    s = ctx.ffi.new("arc_sampling *")
    s.temperature, s.top_p, s.top_k, s.seed = 1.0, 1.0, 0, 1
    setattr(s, field, value)
    with pytest.raises(InvalidArgumentError, match=field):
        _lib.check(ctx.lib.arc_sample(ctx.ptr, ctx.ffi.cast("float *", draws.logits_dev), 10, s, 0, draws.out_dev))


# --- sampled sequences on the device loop -----------------------------------------------------

STEPS = 128
PROMPT = [1, 306, 4966, 304]
SEQ_SAMPLING = Sampling(temperature=0.8, top_p=0.95, seed=1234)


@pytest.fixture(scope="module")
def host_sampled(device):
    eng = engine(device, False)
    toks = list(eng.generate(PROMPT, STEPS, sampling=SEQ_SAMPLING))
    assert eng.stats.path == HOST and len(toks) == STEPS
    return toks


@pytest.mark.parametrize("burst", [1, 4, 16])
def test_a_sampled_sequence_on_the_loop_equals_the_host_path(device, host_sampled, burst):
    assert device.supports_sampling
    eng = engine(device, True, burst)
    got = list(eng.generate(PROMPT, STEPS, sampling=SEQ_SAMPLING))
    assert eng.stats.path == DEVICE_LOOP and eng.stats.fallback is None
    assert eng.stats.host_waits == 0
    assert got == host_sampled
    # and greedy afterwards is the argmax again: the sampled graph is not left selected
    greedy_loop = list(engine(device, True, burst).generate(PROMPT, 32))
    assert greedy_loop == list(engine(device, False).generate(PROMPT, 32))


def test_a_fallback_in_the_middle_of_a_sampled_sequence_keeps_its_tokens(device, host_sampled):
    eng = engine(device, True, 8)
    eng.start(PROMPT, STEPS, sampling=SEQ_SAMPLING)
    got = [eng.step() for _ in range(20)]
    device.inject_lost_step(3)  # a step of the next burst publishes nothing: idle but short
    while (t := eng.step()) is not None:
        got.append(t)
    assert eng.stats.fallback is not None and eng.stats.path == f"{DEVICE_LOOP}+{HOST}"
    assert got == host_sampled
