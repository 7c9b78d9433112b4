"""GPU tier: the device loop over the scripted model on a real GPU (marker `gpu`).

The scripted model's argmax is (token * 31 + position * 7 + 3) mod vocab, the rule of
arcpy.devices.scripted.scripted_next, so every token the ring shows can be checked exactly. Tests that
provoke a sticky fault or a hang run in a subprocess: a sticky fault poisons the process.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from gpu_buffers import CopyStep
from scripted_tokens import following

from arcpy import _lib
from arcpy.codes import FAULT_DEGENERATE, FAULT_NONE, FAULT_NONFINITE, FAULT_POSITION_RANGE, FAULT_TOKEN_RANGE
from arcpy.devices.scripted import scripted_device, scripted_next
from arcpy.devices.sequence import SequenceStart
from arcpy.errors import FaultWordError, InvalidArgumentError, ShortBurstError
from arcpy.loop.burst import BurstDriver
from arcpy.loop.engine import Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.sampling import Sampling

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent


def expected(token, position, n, vocab=32000, bias=3):
    return following(lambda t, p: scripted_next(t, p, vocab, bias), token, position, n)


def drain_idle(dev):
    while not dev.stream_query():
        pass


def test_burst_tokens_land_in_the_ring_in_order(ctx):
    dev = scripted_device(ctx)
    drv = BurstDriver(dev)
    drv.begin_sequence(SequenceStart(loop=True))
    dev.set_input(5, 0)
    before = ctx.counters()
    got = []
    for _ in range(8):
        got += list(drv.run(16))
    used = ctx.counters() - before
    assert got == expected(5, 0, 128)
    # One graph launch per step, one burst-id write per burst; stream queries only as a backstop.
    assert used.graph_launches == 128
    assert used.cuda_calls < 128 + 2 * 8 + 20, used
    dev.close()


def test_logits_are_not_handed_to_the_host_while_work_is_in_flight(ctx):
    dev = scripted_device(ctx)
    dev.set_input(5, 0)
    dev.enqueue_forward()
    dev.enqueue_logits_to_host()
    with pytest.raises(InvalidArgumentError, match="work is in flight"):
        dev.host_logits()
    with pytest.raises(InvalidArgumentError, match="work is in flight"):
        dev.sampled()
    drain_idle(dev)
    assert int(np.argmax(dev.host_logits())) == scripted_next(5, 0, 32000)
    dev.close()


def test_host_path_and_device_loop_agree_on_the_scripted_model(ctx):
    dev = scripted_device(ctx)
    latch = FallbackLatch()
    host = Engine(dev, "cuda", EngineSettings(device_loop=False), environ={}, latch=latch)
    loop = Engine(dev, "cuda", EngineSettings(device_loop=True, burst=8), environ={}, latch=latch)
    a = list(host.generate([5], 64))
    b = list(loop.generate([5], 64))
    assert a == b == expected(5, 0, 64)
    assert loop.stats.path == "device-loop" and loop.stats.host_waits == 0
    assert host.stats.host_waits == 64
    dev.close()


def same_float(a, b) -> bool:
    """Bit-equal float32s: a NaN equals the NaN it was copied from, and nothing else."""
    return np.float32(a).tobytes() == np.float32(b).tobytes()


@pytest.mark.parametrize("vocab", [32000, 128256, 151936])
def test_sampler_matches_numpy_argmax_with_ties_and_returns_the_winning_and_the_smallest_value(ctx, vocab):
    rng = np.random.default_rng(vocab)
    d_logits = ctx.device_alloc(vocab * 4)
    out, out_dev = ctx.pinned((1,), np.int32)
    value, value_dev = ctx.pinned((1,), np.float32)
    low, low_dev = ctx.pinned((1,), np.float32)
    cases = []
    for trial in range(6):
        x = rng.standard_normal(vocab).astype(np.float32)
        top = x.max() + 1.0
        if trial >= 1:  # ties: the lowest index must win
            idx = np.sort(rng.choice(vocab, size=2 + trial, replace=False))
            x[idx] = top
        cases.append(x)
    cases.append(np.full(vocab, 0.25, np.float32))                 # all equal
    cases.append(np.full(vocab, -np.inf, np.float32))              # all -inf
    neg = -np.abs(rng.standard_normal(vocab)).astype(np.float32)
    neg[vocab - 1] = 0.0
    cases.append(neg)                                              # max at the last index
    nan = rng.standard_normal(vocab).astype(np.float32)
    nan[[vocab // 3, vocab // 2]] = np.nan
    nan[vocab // 4] = np.inf
    cases.append(nan)                                              # NaN wins, first one, over +inf
    inf = rng.standard_normal(vocab).astype(np.float32)
    inf[[vocab // 5, vocab - 2]] = np.inf
    cases.append(inf)                                              # +inf wins, first one
    for x in cases:
        out[0], value[0], low[0] = -7, 12345.0, 12345.0
        ctx.upload_async(d_logits, x)
        _lib.check(ctx.lib.arc_argmax(ctx.ptr, d_logits, vocab, out_dev, value_dev, low_dev))
        ctx.wait_idle()
        want = int(np.argmax(x))
        assert int(out[0]) == want
        assert same_float(value[0], x[want]), (value[0], x[want])
        assert low[0] == np.nanmin(x), (low[0], np.nanmin(x))  # the flat case: low == value
    ctx.device_free(d_logits)


def test_sampler_value_output_is_optional(ctx):
    x = np.linspace(-1.0, 1.0, 5000, dtype=np.float32)[::-1].copy()
    d_logits = ctx.device_alloc(x.nbytes)
    out, out_dev = ctx.pinned((1,), np.int32)
    out[0] = -7
    ctx.upload_async(d_logits, x)
    _lib.check(ctx.lib.arc_argmax(ctx.ptr, d_logits, x.size, out_dev, ctx.ffi.NULL, ctx.ffi.NULL))
    ctx.wait_idle()
    assert int(out[0]) == 0
    ctx.device_free(d_logits)


def logits_case(case: str, width: int) -> np.ndarray:
    x = np.random.default_rng(11).standard_normal(width).astype(np.float32)
    if case == "finite":
        x[321] = 9.0
    elif case == "nan":
        x[100] = 50.0                  # the largest number; the NaN still wins the argmax
        x[width // 2] = np.nan
    elif case == "+inf":
        x[777] = np.inf
    elif case == "all -inf":
        x[:] = -np.inf
    elif case == "nan in the padding":
        x[width - 1] = np.nan
    return x


@pytest.mark.parametrize("case", ["finite", "nan", "+inf", "all -inf", "nan in the padding"])
def test_nonfinite_winning_logit_latches_the_fault_word_and_publishes_nothing(ctx, case):
    width = 32000
    x = logits_case(case, width)
    want = int(np.argmax(x))
    # A padded head (loop vocab below the width) for the padding case: a NaN there is reported
    # as non-finite logits, not as a token out of range.
    step = CopyStep(ctx, x, loop_vocab=width - 64 if case == "nan in the padding" else width)
    try:
        state = step.run(token=5, position=7, steps=3)
        if case == "finite":
            assert (state.fault, state.published) == (FAULT_NONE, 3)
            tokens = ctx.ffi.new("int32_t[3]")
            _lib.check(ctx.lib.arc_ring_read(step.loop, 0, 3, tokens))
            assert list(tokens) == [want] * 3
        else:
            # The first step latches; the fault is sticky, so the next two publish nothing either.
            assert (state.fault, state.fault_token, state.fault_pos, state.published) == \
                (FAULT_NONFINITE, want, 8, 0)
    finally:
        step.close()


def flat_case(case: str, width: int) -> np.ndarray:
    x = np.full(width, 0.25, np.float32)
    if case == "one lower":
        x[width - 1] = np.nextafter(np.float32(0.25), np.float32(0))  # not flat: decodes
    elif case == "signed zeros":
        x[:] = 0.0
        x[::2] = -0.0  # -0 equals +0: flat
    elif case == "flat in the padding":
        x[:width - 64] = np.linspace(-1, 1, width - 64, dtype=np.float32)  # the valid ids differ
    return x


@pytest.mark.parametrize("sampler", ["argmax", "draw"])
@pytest.mark.parametrize("width", [32000, 151936])
@pytest.mark.parametrize("case", ["flat", "signed zeros", "one lower", "flat in the padding"])
def test_flat_logits_latch_the_degenerate_fault_and_publish_nothing(ctx, sampler, width, case):
    # Both draws: 32000 ids fit the cluster draw on an H200, 151936 take the grid-wide one.
    x = flat_case(case, width)
    sampling = None if sampler == "argmax" else Sampling(temperature=0.7, top_p=0.9, seed=5)
    step = CopyStep(ctx, x, loop_vocab=width - 64 if case == "flat in the padding" else width, sampling=sampling)
    try:
        state = step.run(token=5, position=7, steps=3)
        if case in ("one lower", "flat in the padding"):
            assert (state.fault, state.published) == (FAULT_NONE, 3)
        else:
            # The first step latches; the fault is sticky, so the next two publish nothing either.
            assert (state.fault, state.fault_pos, state.published) == (FAULT_DEGENERATE, 8, 0)
            if sampler == "argmax":
                assert state.fault_token == 0  # equal values go to the lowest id
    finally:
        step.close()


def test_out_of_range_token_latches_the_fault_word_and_publishes_nothing(ctx):
    # lm_head padded to 32064, vocabulary 32000: the step at position 2 emits token 32010.
    dev = scripted_device(ctx, vocab=32064, loop_vocab=32000, mode="ARC_SCRIPT_TOKEN", at_pos=2, bias=32010)
    drv = BurstDriver(dev)
    drv.begin_sequence(SequenceStart(loop=True))
    dev.set_input(5, 0)
    got = []
    with pytest.raises(FaultWordError) as info:
        for tok in drv.run(6):
            got.append(tok)
    assert got == expected(5, 0, 2, 32064, bias=32010)
    assert (info.value.code, info.value.token, info.value.position) == (FAULT_TOKEN_RANGE, 32010, 3)
    drain_idle(dev)
    state = dev.poll_ring()
    assert state.published == 2 and state.fault == FAULT_TOKEN_RANGE
    dev.close()


def test_position_past_max_seq_latches_the_fault_word(ctx):
    dev = scripted_device(ctx, max_seq=4)
    drv = BurstDriver(dev)
    drv.begin_sequence(SequenceStart(loop=True))
    dev.set_input(5, 0)
    with pytest.raises(FaultWordError) as info:
        list(drv.run(6))
    assert info.value.code == FAULT_POSITION_RANGE and info.value.position == 4
    drain_idle(dev)
    assert dev.poll_ring().published == 3
    dev.close()


def test_stop_id_ends_the_burst_on_the_device(ctx):
    toks = expected(5, 0, 8)
    dev = scripted_device(ctx)
    drv = BurstDriver(dev)
    drv.begin_sequence(SequenceStart(loop=True, stop_ids=(toks[2],)))
    dev.set_input(5, 0)
    assert list(drv.run(8)) == toks[:3]
    drain_idle(dev)
    assert dev.poll_ring().published == 3
    dev.close()


def test_lost_step_is_detected_as_idle_but_short(ctx):
    dev = scripted_device(ctx)
    drv = BurstDriver(dev, query_every=64)
    drv.begin_sequence(SequenceStart(loop=True))
    dev.set_input(5, 0)
    dev.inject_lost_step(1)
    with pytest.raises(ShortBurstError, match="3 of 4"):
        list(drv.run(4))
    dev.close()


def run_child(body: str, timeout: int = 120) -> subprocess.CompletedProcess:
    code = "from arcpy.devices.context import Context\nfrom arcpy.devices.scripted import scripted_device\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_sticky_fault_is_surfaced_by_stream_query_in_a_subprocess():
    out = run_child('''
        from arcpy.devices.sequence import SequenceStart
        from arcpy.loop.burst import BurstDriver
        from arcpy.errors import ContextLostError
        ctx = Context(0)
        dev = scripted_device(ctx, mode="ARC_SCRIPT_ILLEGAL_ADDRESS", at_pos=2)
        drv = BurstDriver(dev, query_every=64)
        drv.begin_sequence(SequenceStart(loop=True))
        dev.set_input(5, 0)
        got = []
        try:
            # One step per burst: the faulting step runs after its burst was enqueued, so the
            # fault can only reach the host through the stream query.
            for _ in range(6):
                got += list(drv.run(1))
        except ContextLostError as exc:
            print("surfaced", len(got), exc)
        try:
            ctx.query()
        except ContextLostError:
            print("still poisoned")
    ''')
    assert out.returncode == 0, out.stderr
    assert "surfaced 2 " in out.stdout and "arc_stream_query" in out.stdout
    assert "cudaErrorIllegalAddress" in out.stdout and "still poisoned" in out.stdout
