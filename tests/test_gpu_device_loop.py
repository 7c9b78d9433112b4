"""GPU tier: the device loop over the real forward (marker `gpu`).

Token identity with the host path for 256 steps, on the synthetic model and a grouped-query
model, for bursts of 1, 4 and 16, with and without a stop id inside a burst; and the four
fault injections of docs/ARCHITECTURE.md's section 2, each in its own subprocess.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gpu_buffers import device, engine  # noqa: F401 (a fixture)

from arcpy.devices.cuda import open_cuda_device
from arcpy.loop.engine import DEVICE_LOOP, HOST, Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.model import synthetic_model

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent
STEPS = 256
PROMPT = [1, 306, 4966, 304]


@pytest.fixture(scope="module")
def host_tokens(device):
    eng = engine(device, False)
    toks = list(eng.generate(PROMPT, STEPS))
    assert eng.stats.path == HOST and len(toks) == STEPS
    return toks


@pytest.mark.parametrize("burst", [1, 4, 16])
def test_device_loop_equals_host_path_for_256_steps(device, host_tokens, burst):
    eng = engine(device, True, burst)
    got = list(eng.generate(PROMPT, STEPS))
    st = eng.stats
    assert st.path == DEVICE_LOOP and st.fallback is None
    assert got == host_tokens
    assert st.host_waits == 0 and st.prefill
    # The prompt went through one prefill, the first token through its commit: no graph launch.
    assert st.graph_launches == STEPS - 1


@pytest.mark.parametrize("burst", [1, 4, 16])
def test_stop_id_inside_a_burst_ends_both_paths_alike(device, host_tokens, burst):
    # A token first seen at an index that is not the last of its burst.
    k = next(i for i in range(5, STEPS) if host_tokens[i] not in host_tokens[:i] and (i + 1) % burst)\
        if burst > 1 else 9
    stop = host_tokens[k]
    host = list(engine(device, False).generate(PROMPT, STEPS, stop_ids=[stop]))
    eng = engine(device, True, burst)
    loop = list(eng.generate(PROMPT, STEPS, stop_ids=[stop]))
    assert loop == host == host_tokens[: host_tokens.index(stop)]  # the stop id is not handed out
    assert eng.stats.finish_reason == "stop_id" and eng.stats.path == DEVICE_LOOP and eng.stats.stop_id == stop
    # Nothing after the stop reached the ring: the tail of the burst published nothing.
    device.ctx.wait_idle()
    assert device.poll_ring().published == len(loop) + 1


def test_step_api_hands_out_the_same_tokens_and_parks_the_rest(device, host_tokens):
    eng = engine(device, True, 16)
    eng.start(PROMPT, 40)
    got = [eng.step()]
    assert len(eng.parked) == 15
    while (t := eng.step()) is not None:
        got.append(t)
    assert got == host_tokens[:40] and not eng.parked


def test_verify_always_checks_replay_against_eager_on_the_host_path(device):
    # Verification feeds the prompt through the decode step, token by token, as prefill=False does.
    by_token = list(Engine(device, "cuda", EngineSettings(device_loop=False, prefill=False), environ={},
                           latch=FallbackLatch()).generate(PROMPT, 24))
    eng = Engine(device, "cuda", EngineSettings(device_loop=True), environ={"ARC_GRAPH_VERIFY_ALWAYS": "1"},
                 latch=FallbackLatch())
    assert list(eng.generate(PROMPT, 24)) == by_token
    assert eng.stats.path == HOST and not eng.stats.prefill


@pytest.mark.parametrize("burst", [1, 16])
def test_token_by_token_prompts_keep_both_paths_equal(device, burst):
    host = list(Engine(device, "cuda", EngineSettings(device_loop=False, prefill=False), environ={},
                       latch=FallbackLatch()).generate(PROMPT, 64))
    eng = Engine(device, "cuda", EngineSettings(device_loop=True, burst=burst, prefill=False), environ={},
                 latch=FallbackLatch())
    assert list(eng.generate(PROMPT, 64)) == host
    assert eng.stats.graph_launches == 64 + len(PROMPT) - 1 and not eng.stats.prefill


def test_eager_forward_decodes_the_same_tokens_and_the_loop_stands_aside(device, host_tokens):
    model = synthetic_model(device.name_of_shape, seed=3)
    eager = open_cuda_device(model, max_seq=1024, use_graph=False)
    try:
        eng = engine(eager, True)
        assert list(eng.generate(PROMPT, 24)) == host_tokens[:24]
        assert eng.stats.path == HOST and eng.stats.graph_launches == 0
    finally:
        eager.close()


def test_main_job_and_smoke_on_the_gpu():
    run = [sys.executable, "-m", "arcpy.decode", "--shape", "stories15M", "--device-loop", "-n", "32", "--burst", "8"]
    out = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == 32  # the ids, and nothing else, on stdout
    assert "path device-loop, backend cuda" in out.stderr and "0.00 host waits" in out.stderr
    smoke = subprocess.run([sys.executable, "-m", "arcpy.cli", "smoke", "-n", "32"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert smoke.stdout.count("ok   cuda") == 2, smoke.stdout


CHILD_PRELUDE = '''
import sys
from arcpy.devices.cuda import open_cuda_device
from arcpy.loop.engine import Engine
from arcpy.loop.settings import EngineSettings
from arcpy.loop.gate import FallbackLatch
from arcpy.model import synthetic_model
from arcpy.errors import ArcError, ContextLostError, DeviceFaultError
from arcpy.devices.context import Context
from arcpy.devices.scripted import scripted_device
'''


def run_child(body: str, timeout: int = 180) -> subprocess.CompletedProcess:
    code = CHILD_PRELUDE + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    print(out.stdout, out.stderr)
    return out


def test_injected_out_of_range_token_falls_back_latches_and_names_token_and_position():
    # The lm_head is wider than the vocabulary the loop accepts (a padded head): the first
    # argmax that lands in the padding latches the fault word.
    out = run_child('''
        model = synthetic_model("stories15M", seed=3)
        dev = open_cuda_device(model, max_seq=512, vocab_limit=16000)
        latch = FallbackLatch()
        eng = Engine(dev, "cuda", EngineSettings(device_loop=True, burst=4), environ={}, latch=latch)
        got = []
        try:
            for t in eng.generate([1], 64):
                got.append(t)
        except DeviceFaultError as exc:
            print("error:", exc)
        print("published-before-fault", len(got), all(t < 16000 for t in got))
        print("latched:", latch.reason)
        print("path:", eng.stats.path)
        ring = dev.poll_ring()
        print("ring", ring.published, ring.fault)
    ''')
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert "latched:" in lines and "token out of range" in lines["latched:"]
    token_pos = lines["latched:"].split("token out of range: ")[1]
    assert token_pos in lines["error:"], "the final error names the same token and position"
    assert lines["path:"] == "device-loop+host"
    published, fault = lines["ring"].split()
    n_before = int(lines["published-before-fault"].split()[0])
    assert fault == "1" and int(published) == n_before  # nothing published at or after the fault


def test_injected_illegal_address_is_surfaced_and_the_process_refuses_further_work():
    out = run_child('''
        ctx = Context(0)
        dev = scripted_device(ctx, mode="ARC_SCRIPT_ILLEGAL_ADDRESS", at_pos=6)
        eng = Engine(dev, "cuda", EngineSettings(device_loop=True, burst=4), environ={}, latch=FallbackLatch())
        eng.driver.query_every = 256
        try:
            list(eng.generate([5], 32))
        except ContextLostError as exc:
            print("surfaced:", exc)
        try:
            eng.start([5], 4)
        except DeviceFaultError as exc:
            print("refused:", exc)
    ''')
    assert out.returncode == 0, out.stderr
    assert "surfaced: device fault:" in out.stdout and "cudaErrorIllegalAddress" in out.stdout
    assert "refused: the GPU context is unusable" in out.stdout


def test_injected_spin_trips_max_spins_then_is_released():
    out = run_child('''
        import numpy as np
        ctx = Context(0)
        flag, flag_dev = ctx.pinned((1,), np.uint32)
        dev = scripted_device(ctx, mode="ARC_SCRIPT_SPIN", at_pos=3, flag=ctx.ffi.cast("uint32_t *", flag_dev))
        eng = Engine(dev, "cuda", EngineSettings(device_loop=True, burst=8), environ={}, latch=FallbackLatch())
        eng.driver.max_spins = 300_000
        try:
            list(eng.generate([5], 16))
        except DeviceFaultError as exc:
            print("tripped:", exc)
        flag[0] = 1
        ctx.wait_idle()
        print("released")
    ''')
    assert out.returncode == 0, out.stderr
    assert "tripped: device loop: no token and no error in 300000 polls" in out.stdout
    assert "released" in out.stdout


def test_injected_lost_step_is_detected_as_idle_but_short_and_falls_back():
    out = run_child('''
        model = synthetic_model("stories15M", seed=3)
        dev = open_cuda_device(model, max_seq=512)
        host = list(Engine(dev, "cuda", EngineSettings(device_loop=False), environ={},
                           latch=FallbackLatch()).generate([1], 48))
        latch = FallbackLatch()
        eng = Engine(dev, "cuda", EngineSettings(device_loop=True, burst=8), environ={}, latch=latch)
        eng.driver.query_every = 256
        dev.inject_lost_step(10)
        got = list(eng.generate([1], 48))
        print("identical:", got == host)
        print("fallback:", eng.stats.fallback)
    ''')
    assert out.returncode == 0, out.stderr
    assert "identical: True" in out.stdout
    assert "fallback: device loop: the stream is idle but only" in out.stdout


def test_a_long_prompt_preempted_at_once_leaves_the_next_sequence_as_it_would_be_alone(device):
    # The first prefill may still be running when the second sequence starts (and rewrites the
    # pinned prompt once it has retired); the cache rows it wrote beyond the second prompt are
    # rewritten before they are read.
    other = [7, 8, 9, 10, 11, 12]
    alone = list(engine(device, False).generate(other, 24))
    for loop in (True, False):
        eng = engine(device, loop, 8)
        eng.start(PROMPT * 200, 4)  # a long prompt, preempted before anything is read
        assert list(eng.generate(other, 24)) == alone
