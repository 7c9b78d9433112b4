"""The sampling definition (arcpy/sampling.py's docstring): the fast sampler against a literal,
slow reading of it, the Philox known answers, and the draw's independence from everything but
(seed, position)."""

import numpy as np
import pytest

from arcpy.errors import InvalidArgumentError
from arcpy.sampling import EXP32_CONSTANTS, Sampler, Sampling, draw_words, exp32, philox4x32_10

M32 = 0xFFFFFFFF


# --- a literal reading of the definition, in Python integers ----------------------------------


def philox_literal(ctr, key):
    c, k = list(ctr), list(key)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & M32, (k[1] + 0xBB67AE85) & M32]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & M32, (p0 >> 32) ^ c[3] ^ k[1], p0 & M32]
    return c


def order_key(value):
    bits = int(np.float32(value).view(np.uint32))
    return bits ^ (0xFFFFFFFF if bits >> 31 else 0x80000000)


def literal_sample(logits, temperature, top_k, top_p, seed, t):
    l = np.asarray(logits, dtype=np.float32) + np.float32(0)
    V = l.size
    order = sorted(range(V), key=lambda i: (-order_key(l[i]), i))
    m = l.max()
    inv_t = np.float32(1.0 / temperature)
    w = exp32((l - m) * inv_t)
    q = [int(v) for v in np.rint(w * np.float32(2**40)).astype(np.uint64)]
    kept = order[:top_k] if 0 < top_k < V else order
    p32 = max(1, min(2**32, round(top_p * 2**32)))
    if p32 < 2**32:
        need = (sum(q[i] for i in kept) * p32 + 2**32 - 1) >> 32
        prefix, acc = [], 0
        for i in kept:
            prefix.append(i)
            acc += q[i]
            if acc >= need:
                break
        kept = prefix
    x = philox_literal((t & M32, t >> 32, 0, 0), (seed & M32, seed >> 32))[0]
    target = (sum(q[i] for i in kept) * x) >> 32
    acc = 0
    for i in sorted(kept):
        acc += q[i]
        if acc > target:
            return i
    raise AssertionError("the walk ran past the kept ids")


# --- Philox -------------------------------------------------------------------------------------


@pytest.mark.parametrize("ctr, key, want", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32,) * 4, (M32,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
], ids=["zeros", "all-ones", "pi-digits"])
def test_philox_known_answers(ctr, key, want):
    assert [int(v) for v in philox4x32_10(ctr, key)] == list(want)
    assert philox_literal(ctr, key) == list(want)


def test_philox_over_arrays_equals_one_position_at_a_time():
    rng = np.random.default_rng(1)
    ctr = [rng.integers(0, 2**32, 50, dtype=np.uint64) for _ in range(4)]
    key = [int(v) for v in rng.integers(0, 2**32, 2, dtype=np.uint64)]
    out = philox4x32_10(ctr, key)
    assert out.shape == (4, 50) and out.dtype == np.uint32
    for j in range(50):
        assert [int(v) for v in out[:, j]] == philox_literal([int(c[j]) for c in ctr], key)


def test_draw_words_splits_seed_and_position_into_key_and_counter():
    seed, positions = 0x0123456789ABCDEF, np.array([0, 7, 2**32 + 5, 2**64 - 1], dtype=np.uint64)
    got = draw_words(seed, positions)
    for t, x in zip(positions, got):
        t = int(t)
        assert int(x) == philox_literal((t & M32, t >> 32, 0, 0), (seed & M32, seed >> 32))[0]
    assert int(draw_words(seed, 7)) == int(got[1])


@pytest.mark.parametrize("seed, positions", [(-1, 0), (2**64, 0), (1, -1), (1, 2**64), (1, 1.5)])
def test_draw_words_refuses_values_outside_64_bits(seed, positions):
    with pytest.raises(InvalidArgumentError):
        draw_words(seed, positions)


# --- the sampler against the literal reading ----------------------------------------------------


def random_logits(rng, V):
    kind = rng.integers(0, 6)
    if kind == 0:
        l = rng.normal(0, 3, V)
    elif kind == 1:  # few distinct values: ties everywhere, at every cut
        l = rng.integers(-3, 4, V) * 0.5
    elif kind == 2:  # -inf entries and signed zeros
        l = rng.normal(0, 1, V)
        l[rng.random(V) < 0.3] = -np.inf
        l[rng.random(V) < 0.2] = 0.0
        l[rng.random(V) < 0.2] = -0.0
    elif kind == 3:  # one dominant logit
        l = rng.normal(0, 1, V)
        l[rng.integers(V)] = 40.0
    elif kind == 4:  # every logit equal
        l = np.full(V, rng.normal())
    else:  # a huge range
        l = rng.normal(0, 1e4, V)
    return l.astype(np.float32)


def random_sampling(rng, V):
    temperature = float(rng.choice([1e-6, 1e-3, 0.3, 0.7, 1.0, 2.5, 1e3, 1e6]))
    top_k = int(rng.choice([0, 0, 2, 3, 7, V - 1, V, V + 5]))
    top_p = float(rng.choice([1.0, 1.0, 0.999, 0.95, 0.5, 0.1, 1e-9, 0.3333]))
    return Sampling(temperature, top_k, top_p, int(rng.integers(0, 2**63)) * 2 + int(rng.integers(2)))


def test_the_sampler_draws_what_the_literal_definition_draws():
    rng = np.random.default_rng(20261130)
    for case in range(600):
        V = int(rng.choice([2, 3, 17, 100, 257, 1000]))
        s = random_sampling(rng, V)
        if s.is_greedy():
            continue
        l = random_logits(rng, V)
        sampler = Sampler(s)
        for t in (int(rng.integers(0, 2**64, dtype=np.uint64)), case):
            want = literal_sample(l, s.temperature, s.top_k, s.top_p, s.seed, t)
            assert sampler.sample(l, t) == want, (case, s, t)


def test_the_fast_paths_of_a_large_vocabulary_draw_what_the_literal_definition_draws():
    # Past 4096 candidates top-p tries a partial sort first; flat logits make it fall back.
    rng = np.random.default_rng(7)
    for case, (temperature, top_k, top_p) in enumerate([(0.8, 0, 0.9), (50.0, 0, 0.97), (1e6, 0, 0.5),
                                                        (1.0, 0, 1.0), (0.7, 40, 0.9), (1.0, 6000, 0.99)]):
        l = rng.normal(0, 2, 9000).astype(np.float32)
        l[rng.integers(0, 9000, 3000)] = 1.5  # ties across the cuts
        s = Sampling(temperature, top_k, top_p, seed=case)
        want = literal_sample(l, temperature, top_k, top_p, case, 1000 + case)
        assert Sampler(s).sample(l, 1000 + case) == want


def test_numpy_scalar_parameters_draw_as_their_python_values():
    # 1 / T is divided in float64 even for a float32 T, and p * 2**32 is exact.
    l = np.random.default_rng(3).normal(0, 2, 300).astype(np.float32)
    s = Sampling(np.float32(0.7), np.int64(50), np.float32(0.9), np.uint64(2**64 - 1))
    for t in range(20):
        assert Sampler(s).sample(l, t) == literal_sample(l, float(np.float32(0.7)), 50, float(np.float32(0.9)),
                                                         2**64 - 1, t)


def test_sampling_follows_the_distribution():
    # T = 1, no cuts: the frequencies of the draws over many positions follow softmax(l).
    l = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    sampler = Sampler(Sampling(1.0, seed=3))
    counts = np.bincount([sampler.sample(l, t) for t in range(20_000)], minlength=4) / 20_000
    assert np.abs(counts - [0.5, 0.3, 0.15, 0.05]).max() < 0.015


def test_top_k_and_top_p_keep_only_the_leading_candidates():
    l = np.array([0.0, 3.0, 1.0, 3.0, 2.0], dtype=np.float32)
    topk = Sampler(Sampling(5.0, top_k=2, seed=1))
    assert {topk.sample(l, t) for t in range(300)} == {1, 3}   # the tie at 3.0 is kept whole
    one = Sampler(Sampling(5.0, top_k=3, seed=1))
    assert {one.sample(l, t) for t in range(300)} == {1, 3, 4}
    nucleus = Sampler(Sampling(1.0, top_p=1e-9, seed=1))
    assert {nucleus.sample(l, t) for t in range(100)} == {1}    # the tie goes to the lower id


def test_the_draw_depends_on_seed_and_position_only():
    rng = np.random.default_rng(5)
    l = rng.normal(0, 1, 500).astype(np.float32)
    s = Sampling(1.3, 50, 0.9, seed=77)
    forward = [Sampler(s).sample(l, t) for t in range(40)]
    fresh = Sampler(s)
    backward = [fresh.sample(l, t) for t in reversed(range(40))][::-1]
    assert forward == backward
    other = Sampler(Sampling(1.3, 50, 0.9, seed=78))
    assert [other.sample(l, t) for t in range(40)] != forward


def test_an_unseeded_sampler_resolves_its_seed_once_and_reports_it():
    a = Sampler(Sampling(0.9))
    assert isinstance(a.params.seed, int) and 0 <= a.params.seed < 2**64
    b = Sampler(a.params)
    l = np.linspace(0, 1, 64, dtype=np.float32)
    assert [a.sample(l, t) for t in range(30)] == [b.sample(l, t) for t in range(30)]
    assert Sampler(Sampling(0.9)).params.seed != a.params.seed  # 2**-64 to fail by chance


def test_greedy_is_the_argmax_whatever_the_seed():
    l = np.array([0.1, 0.9, 0.9, 0.3], dtype=np.float32)
    assert Sampler(Sampling()).sample(l, 0) == 1
    assert Sampler(Sampling(temperature=0.7, top_k=1, seed=0)).sample(l, 5) == 1
    assert Sampler(Sampling()).greedy and not Sampler(Sampling(0.7)).greedy


@pytest.mark.parametrize("logits, position", [
    (np.array([1.0, np.nan], np.float32), 0),
    (np.array([1.0, np.inf], np.float32), 0),
    (np.full(3, -np.inf, np.float32), 0),
    (np.zeros((2, 2), np.float32), 0),
    (np.zeros(0, np.float32), 0),
    (np.zeros(4, np.float32), -1),
    (np.zeros(4, np.float32), 2**64),
])
def test_bad_logits_and_positions_are_refused(logits, position):
    with pytest.raises(InvalidArgumentError):
        Sampler(Sampling(1.0, seed=1)).sample(logits, position)


@pytest.mark.parametrize("kw", [dict(temperature=-1.0), dict(temperature=1e-320), dict(temperature="1"),
                                dict(temperature=float("nan")), dict(top_p=0.0), dict(top_p=1.5),
                                dict(top_p="0.5"), dict(top_k=-2), dict(top_k=1.5), dict(top_k=True),
                                dict(seed=-1), dict(seed=2**64), dict(seed=1.0)])
def test_sampling_arguments_are_validated(kw):
    with pytest.raises(InvalidArgumentError):
        Sampling(**{"temperature": 1.0, **kw})


def test_exp32_is_within_3_ulp_of_exp_and_zero_below_its_floor():
    x = np.concatenate([-np.random.default_rng(1).uniform(0, 29, 200_000), [0.0, -1e-30, -29.0]]).astype(np.float32)
    w = exp32(x)
    exact = np.exp(x.astype(np.float64))
    assert w.dtype == np.float32 and w[-3] == 1.0
    assert (np.abs(w - exact) / np.spacing(w).astype(np.float64)).max() <= 3.0
    assert exp32(np.array([-29.01, -100.0, -np.inf], np.float32)).tolist() == [0.0, 0.0, 0.0]
    # the constants are the float32 roundings of what they stand for
    want = [np.log2(np.e), 0.693145751953125, np.log(2) - 0.693145751953125, 1 / 720, 1 / 120, 1 / 24, 1 / 6,
            0.5, 1.0, 1.0]
    assert EXP32_CONSTANTS.tolist() == np.array(want, np.float32).tolist()


def test_exp32_is_its_float32_operations_in_order():
    # Recomputed step by step in Python floats rounded to float32 after every operation.
    def f32(v):
        return float(np.float32(v))
    for x in (-0.3, -1.7, -12.25, -28.9):
        x = f32(x)
        c = [float(v) for v in EXP32_CONSTANTS]
        n = float(np.rint(np.float32(f32(x * c[0]))))
        r = f32(f32(x - f32(n * c[1])) - f32(n * c[2]))
        p = c[3]
        for k in c[4:]:
            p = f32(f32(p * r) + k)
        assert exp32(np.array([x], np.float32))[0] == np.float32(p * 2.0 ** n)
