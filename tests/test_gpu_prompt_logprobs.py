"""GPU tier: a prompt's own log-probabilities (marker `gpu`), what a completion's echo returns.
libarc's row ranking (arc_op_row_logprobs) against a float64 NumPy log_softmax of logits the test
chooses (within 1e-3, the loop's tolerance); then through the engine: the prefill's rows scored
(arc_model_prompt_logprobs) equal, bit for bit, the first token's of a generation from each
prefix, and a prompt's scores those of its prefix; the scored rows serve the next request."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_buffers import log_softmax64

from arcpy import _lib
from arcpy.codes import MAX_TOP_LOGPROBS
from arcpy.devices.cuda import open_cuda_device
from arcpy.errors import InvalidArgumentError
from arcpy.loop import gate
from arcpy.loop.engine import Engine
from arcpy.loop.request import Request
from arcpy.loop.settings import EngineSettings
from arcpy.model import synthetic_model

pytestmark = pytest.mark.gpu

TOL = 1e-3


def rank(gpu, x: np.ndarray, vocab: int, targets: list[int], top_n: int):
    rows, stride = x.shape
    lib, ffi = gpu.lib, gpu.ffi
    need = ffi.new("uint64_t *")
    _lib.check(lib.arc_op_row_logprobs_scratch_bytes(rows, vocab, need))
    lp, ids, vals = gpu.alloc(rows * 4), gpu.alloc(rows * MAX_TOP_LOGPROBS * 4), gpu.alloc(rows * MAX_TOP_LOGPROBS * 4)
    gpu.put(ids, np.full(rows * MAX_TOP_LOGPROBS, -7, np.int32))  # entries past top_n stay as they were
    _lib.check(lib.arc_op_row_logprobs(gpu.ctx, ffi.cast("float *", gpu.upload(x.astype(np.float32))), rows, stride,
                                       vocab, top_n, ffi.cast("int32_t *", gpu.upload(np.asarray(targets, np.int32))),
                                       ffi.cast("float *", gpu.alloc(need[0])), ffi.cast("float *", lp),
                                       ffi.cast("int32_t *", ids), ffi.cast("float *", vals)))
    return (gpu.read(lp, np.float32, rows), gpu.read(ids, np.int32, rows * MAX_TOP_LOGPROBS).reshape(rows, -1),
            gpu.read(vals, np.float32, rows * MAX_TOP_LOGPROBS).reshape(rows, -1))


CASES = {  # rows, vocab, stride
    "small": (3, 100, 100),
    "one-slice": (5, 2_048, 2_048),
    "padded": (4, 49_152, 49_200),   # the head wider than the vocabulary: the padding is no token
    "large": (7, 128_256, 128_256),
    "tiny-vocab": (2, 3, 8),         # fewer ids than top_n: -1 and -inf after them
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("top_n", [0, 1, 5, 20])
def test_gpu_row_logprobs_equal_float64_log_softmax(gpu, case, top_n):
    rows, vocab, stride = CASES[case]
    rng = np.random.default_rng(rows * 1000 + top_n)
    x = (rng.standard_normal((rows, stride)) * 3).astype(np.float32)
    x[:, vocab:] = 40.0  # would move every value if the ranking counted the padding
    x[0, :vocab:7] = -np.inf  # ids no row may take
    x[-1, :4] = x[-1, :vocab].max() + 1.0  # a four-way tie at the top: the lower ids first
    targets = [int(rng.integers(0, vocab)) for _ in range(rows)]
    targets[0] = vocab  # outside the vocabulary: NaN
    lp, ids, vals = rank(gpu, x, vocab, targets, top_n)
    for r in range(rows):
        ref = log_softmax64(x[r, :vocab])
        if r == 0:
            assert np.isnan(lp[r])
        else:
            assert abs(lp[r] - ref[targets[r]]) <= TOL, (r, lp[r], ref[targets[r]])
        order = np.lexsort((np.arange(vocab), -ref))[:top_n]
        assert list(ids[r, :len(order)]) == list(order)
        assert np.all(np.abs(vals[r, :len(order)] - ref[order]) <= TOL) or not np.isfinite(ref[order]).all()
        assert np.all(ids[r, len(order):top_n] == -1) and np.all(vals[r, len(order):top_n] == -np.inf)
        assert np.all(ids[r, top_n:] == -7)
    if case == "tiny-vocab" or top_n == 0:
        return
    assert list(ids[-1, :min(top_n, 4)]) == list(range(min(top_n, 4)))  # the tie


def test_gpu_row_logprobs_refuse_bad_arguments(gpu):
    lib, ffi = gpu.lib, gpu.ffi
    buf = ffi.cast("float *", gpu.alloc(1 << 16))
    ids = ffi.cast("int32_t *", gpu.alloc(1 << 12))
    for rows, vocab, stride, top_n, what in ((0, 10, 10, 1, "rows"), (1, 11, 10, 1, "vocab"),
                                             (1, 10, 10, 21, "top_n")):
        with pytest.raises(InvalidArgumentError, match=what):
            _lib.check(lib.arc_op_row_logprobs(gpu.ctx, buf, rows, stride, vocab, top_n, ids, buf, buf, ids, buf))


PROMPT = list(range(1, 40))


@pytest.fixture(scope="module", params=["smollm2-135M", "tiny-quant"])
def engine(request):
    """A bf16 model, and one of every quantized format (its lm_head Q6_K, read packed)."""
    device = open_cuda_device(synthetic_model(request.param, seed=11, max_seq=1024), 1024)
    with Engine(device, "cuda", EngineSettings(burst=16), environ={}, latch=gate.FallbackLatch()) as eng:
        yield eng


def first_piece(eng, prompt):
    request = Request(prompt_ids=tuple(prompt), max_new_tokens=1, logprobs=5)
    return next(p for p in eng.stream(request) if p.token is not None)


def test_gpu_a_prompts_scores_are_the_first_tokens_of_its_prefixes(engine):
    """Entry i scores the row that a generation from prompt[:i + 1] draws its first token from: the
    same logits (the decode's lm_head GEMV of the prefill's row), so the same values, bit for bit."""
    scored = engine.prompt_logprobs(PROMPT, 5)
    assert len(scored) == len(PROMPT) - 1
    for i in range(len(PROMPT) - 1):
        engine.prefix.clear()  # a cold prefill of the prefix
        piece = first_piece(engine, PROMPT[:i + 1])
        assert scored[i].top == piece.logprob.top, i
        if piece.token == PROMPT[i + 1]:
            assert scored[i].logprob == piece.logprob.logprob
        assert scored[i].logprob <= scored[i].top[0][1] and np.isfinite(scored[i].logprob)


def test_gpu_a_prompts_scores_do_not_depend_on_what_follows(engine):
    """The prefill's rows, and their products, do not depend on the chunk's length: the scores of a
    prefix are the whole prompt's first scores, bit for bit."""
    whole = engine.prompt_logprobs(PROMPT, 20)
    part = engine.prompt_logprobs(PROMPT[:17], 20)
    assert part == whole[:16]


def test_gpu_the_scored_prompt_is_reused_by_the_next_request(engine):
    engine.prefix.clear()
    request = Request(prompt_ids=tuple(PROMPT), max_new_tokens=24)
    cold = [p.token for p in engine.stream(request) if p.token is not None]
    engine.prefix.clear()
    engine.prompt_logprobs(PROMPT, 2)
    warm = [p.token for p in engine.stream(request) if p.token is not None]
    assert engine.stats.cached_tokens == len(PROMPT) - 1 and warm == cold
