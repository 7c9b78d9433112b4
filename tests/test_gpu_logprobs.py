"""GPU tier: the device loop's log-probabilities (marker `gpu`). libarc/logprobs.cu against a
float64 NumPy log_softmax of the very logits the step sampled from (within 1e-3), on logits the
test chooses (vocabularies of several sizes, ties, -inf, a padded head) and on a real-shaped
model through the engine (equal to the host path's, no host wait, the decode rate kept)."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from gpu_buffers import CopyStep, begin, log_softmax64

from arcpy import _lib
from arcpy.codes import MAX_TOP_LOGPROBS
from arcpy.devices.cuda import open_cuda_device
from arcpy.loop import gate
from arcpy.loop.engine import Engine
from arcpy.loop.request import Request
from arcpy.loop.settings import EngineSettings
from arcpy.model import SHAPES, random_model
from arcpy.sampling import Sampler, Sampling

pytestmark = pytest.mark.gpu

TOL = 1e-3


class LogprobStep(CopyStep):
    """A step graph whose forward copies prepared logits, then samples (the argmax, or the draw),
    commits, and writes the log-probabilities: the kernel on logits the test chooses."""

    def __init__(self, ctx, x: np.ndarray, vocab: int, draw: bool = False, capacity: int = 16):
        super().__init__(ctx, x, vocab, max_seq=4096, capacity=capacity, draw=draw, logprobs=True)

    def run(self, steps: int, top_n: int, sampling: Sampling | None = None, stop_ids=()):
        ffi, lib = self.ctx.ffi, self.ctx.lib

        def setup(loop):
            _lib.check(begin(ffi, lib, loop, top_logprobs=top_n))
            _lib.check(begin(ffi, lib, loop, stop_ids=tuple(stop_ids)))
            if sampling is not None:
                _lib.check(begin(ffi, lib, loop, sampling=sampling))

        state = super().run(0, 0, steps, setup)
        n = state.published
        tokens = ffi.new("int32_t[]", max(n, 1))
        _lib.check(lib.arc_ring_read(self.loop, 0, n, tokens))
        lp, ids = ffi.new("float[]", max(n, 1)), ffi.new("int32_t[]", max(n, 1) * MAX_TOP_LOGPROBS)
        vals = ffi.new("float[]", max(n, 1) * MAX_TOP_LOGPROBS)
        _lib.check(lib.arc_ring_read_logprobs(self.loop, 0, state.logprobs, lp, ids, vals))
        top = [[(ids[k * MAX_TOP_LOGPROBS + j], vals[k * MAX_TOP_LOGPROBS + j]) for j in range(top_n)]
               for k in range(state.logprobs)]
        return list(tokens[0:n]), [lp[k] for k in range(state.logprobs)], top, state


def check_entry(x, vocab, token, logprob, top, top_n):
    ref = log_softmax64(x[:vocab])
    assert abs(logprob - ref[token]) <= TOL, (logprob, ref[token])
    order = np.lexsort((np.arange(vocab), -ref))[:top_n]
    assert len(top) == top_n
    got_ids = [i for i, _ in top]
    got_vals = np.array([v for _, v in top], dtype=np.float64)
    assert np.all(np.abs(got_vals - ref[order]) <= TOL) or not np.isfinite(ref[order]).all()
    # Ids: the reference's order, except where two values are within the tolerance of each other.
    for j, (i, want) in enumerate(zip(got_ids, order)):
        assert i == want or abs(ref[i] - ref[want]) <= TOL, (j, i, want)
    assert all(a >= b for a, b in zip(got_vals, got_vals[1:]))


CASES = {
    "random-50k": (50_000, 50_000),
    "random-152k": (151_936, 151_936),
    "padded": (49_152, 49_200),       # the head wider than the vocabulary: the padding is not a token
    "small": (100, 100),
    "one-block": (2_048, 2_048),
}


def logits_for(case, vocab, width, rng):
    x = (rng.standard_normal(width) * 3).astype(np.float32)
    if case == "padded":
        # Below the valid argmax (50, set by the test), but the padding's 48 entries would move
        # every log-probability by about 0.3 if the kernel counted them.
        x[vocab:] = 45.0
    return x


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("top_n", [0, 1, 5, 20])
def test_gpu_logprobs_equal_float64_log_softmax_greedy(ctx, case, top_n):
    vocab, width = CASES[case]
    x = logits_for(case, vocab, width, np.random.default_rng(vocab + top_n))
    if case == "padded":
        x[vocab - 1] = 50.0  # the argmax among the valid ids
    step = LogprobStep(ctx, x, vocab)
    try:
        tokens, lps, tops, state = step.run(3, top_n)
        assert state.fault == 0 and state.published == 3 and state.logprobs == 3
        for tok, lp, top in zip(tokens, lps, tops):
            assert tok == int(np.argmax(x[:vocab]))
            check_entry(x, vocab, tok, lp, top, top_n)
    finally:
        step.close()


def test_gpu_logprobs_of_a_drawn_token_are_the_models_distribution(ctx):
    vocab = 32_000
    x = (np.random.default_rng(5).standard_normal(vocab) * 2).astype(np.float32)
    sampling = Sampling(temperature=0.7, top_k=50, top_p=0.9, seed=9)
    step = LogprobStep(ctx, x, vocab, draw=True)
    try:
        tokens, lps, tops, state = step.run(8, 5, sampling)
        assert state.published == 8 == state.logprobs
        sampler = Sampler(sampling)
        for k, (tok, lp, top) in enumerate(zip(tokens, lps, tops)):
            assert tok == sampler.sample(x, k + 1)  # the draw at position k + 1
            check_entry(x, vocab, tok, lp, top, 5)  # before temperature and truncation
    finally:
        step.close()


def test_gpu_logprobs_ties_minus_infinity_and_a_stop(ctx):
    vocab = 10_000
    x = np.full(vocab, -np.inf, dtype=np.float32)
    x[[7, 4000, 9999]] = 2.0   # a three-way tie for the top
    x[[3, 5000]] = 1.0
    step = LogprobStep(ctx, x, vocab)
    try:
        tokens, lps, tops, state = step.run(4, 20, stop_ids=(7,))
        # The stop id ends the burst: one token published, one entry, later steps write none.
        assert tokens == [7] and state.logprobs == 1
        ref = log_softmax64(x)
        assert abs(lps[0] - ref[7]) <= TOL
        ids = [i for i, _ in tops[0]]
        assert ids[:5] == [7, 4000, 9999, 3, 5000]
        assert all(v == -np.inf for _, v in tops[0][5:])
    finally:
        step.close()


def test_gpu_logprobs_after_a_fault_write_nothing(ctx):
    x = np.random.default_rng(2).standard_normal(5000).astype(np.float32)
    x[123] = np.nan
    step = LogprobStep(ctx, x, 5000)
    try:
        tokens, lps, _, state = step.run(3, 5)
        assert state.fault == 3 and tokens == [] and state.logprobs == 0  # ARC_FAULT_NONFINITE
    finally:
        step.close()


def test_gpu_logprobs_refused_outside_their_range(ctx):
    ffi, lib = ctx.ffi, ctx.lib
    lp = ffi.new("arc_loop **")
    _lib.check(lib.arc_loop_create(ctx.ptr, 100, 64, 4, lp))
    try:
        for bad in (-1, MAX_TOP_LOGPROBS + 1):
            assert begin(ffi, lib, lp[0], top_logprobs=bad) != 0
        buf = ffi.new("float[]", 4)
        assert lib.arc_loop_enqueue_logprobs(lp[0], buf, 100) != 0  # no ring yet
        _lib.check(begin(ffi, lib, lp[0], top_logprobs=3))
        ids, vals = ffi.new("int32_t[]", 4 * MAX_TOP_LOGPROBS), ffi.new("float[]", 4 * MAX_TOP_LOGPROBS)
        assert lib.arc_ring_read_logprobs(lp[0], 0, 1, buf, ids, vals) != 0  # nothing written
    finally:
        ctx.wait_idle()
        lib.arc_loop_destroy(lp[0])


# -- through the engine, on a real-shaped model --------------------------------------------------

CONFIG = dataclasses.replace(SHAPES["smollm2-135M"], max_seq=1024)


@pytest.fixture(scope="module")
def engine():
    device = open_cuda_device(random_model(CONFIG, seed=11), 1024)
    with Engine(device, "cuda", EngineSettings(burst=16), environ={}, latch=gate.FallbackLatch()) as eng:
        yield eng


def answer(eng, loop, sampling, n=48, top=5):
    eng.device_loop = loop
    request = Request(prompt_ids=tuple(range(1, 40)), max_new_tokens=n, logprobs=top, sampling=sampling)
    return [p for p in eng.stream(request) if p.token is not None]


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, top_p=0.95, seed=3)])
def test_gpu_engine_logprobs_on_the_loop_equal_the_host_paths(engine, sampling):
    loop = answer(engine, True, sampling)
    assert engine.stats.path == "device-loop" and engine.stats.host_waits == 0
    host = answer(engine, False, sampling)
    assert engine.stats.path == "host"
    assert [p.token for p in loop] == [p.token for p in host]
    for a, b in zip(loop, host):
        assert abs(a.logprob.logprob - b.logprob.logprob) <= TOL
        for (ia, va), (ib, vb) in zip(a.logprob.top, b.logprob.top):
            assert abs(va - vb) <= TOL and (ia == ib or abs(va - vb) <= TOL)


def test_gpu_engine_decode_rate_with_top_logprobs_5_is_at_least_90_percent(engine, monkeypatch):
    # Both against the plain loop: a request without log-probabilities asked again would otherwise
    # speculate on its remembered answer, which one with them never does.
    monkeypatch.setattr(engine, "speculate", False)

    def rate(top):
        engine.device_loop = True
        request = Request(prompt_ids=(1, 2, 3), max_new_tokens=512, logprobs=top)
        list(engine.stream(request))  # warm
        best = 0.0
        for _ in range(3):
            started = time.perf_counter()
            n = sum(p.token is not None for p in engine.stream(request))
            best = max(best, n / (time.perf_counter() - started))
        return best

    plain, with_logprobs = rate(None), rate(5)
    assert with_logprobs >= 0.9 * plain, (with_logprobs, plain)


# -- the logit bias, on both paths --------------------------------------------------------------

def bias_answer(eng, loop, sampling, bias, n=32, logprobs=None):
    eng.device_loop = loop
    request = Request(prompt_ids=tuple(range(1, 40)), max_new_tokens=n, sampling=sampling, logit_bias=bias,
                      logprobs=logprobs)
    return [p for p in eng.stream(request) if p.token is not None]


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, top_p=0.95, seed=3)])
def test_gpu_logit_bias_is_added_alike_on_both_paths(engine, sampling):
    plain = [p.token for p in bias_answer(engine, True, sampling, {})]
    bias = {plain[0]: -100.0, plain[5]: -100.0, 17: 1.5}
    loop = [p.token for p in bias_answer(engine, True, sampling, bias)]
    assert engine.stats.path == "device-loop" and engine.stats.host_waits == 0
    host = [p.token for p in bias_answer(engine, False, sampling, bias)]
    assert engine.stats.path == "host"
    assert loop == host and loop != plain and plain[0] not in loop and plain[5] not in loop
    assert [p.token for p in bias_answer(engine, True, sampling, {})] == plain  # cleared again


def test_gpu_logit_bias_forces_a_token_and_its_logprobs_see_it(engine):
    got = bias_answer(engine, True, Sampling(), {123: 100.0}, n=8, logprobs=2)
    assert [p.token for p in got] == [123] * 8
    assert all(p.logprob.top[0][0] == 123 and p.logprob.logprob > -1e-3 for p in got)
    host = bias_answer(engine, False, Sampling(), {123: 100.0}, n=8, logprobs=2)
    for a, b in zip(got, host):
        assert abs(a.logprob.logprob - b.logprob.logprob) <= TOL
