"""GPU tier: speculative steps in the device loop (marker `gpu`).

- The verify forward's rows against the decode forward at the same positions, row by row, as bits.
- The loop with speculation against the loop without it, token for token, on synthetic shapes
  (one with q/k/v biases), with speculation forced on every burst and with the policy; a budget
  that ends inside an accepted run; a stop id; a lost step, which falls back to the host path.
- The real model (SmolLM2-135M) on an extractive prompt: the same ids as the plain loop, with
  drafts accepted; and its golden ids with speculation on.
- Sampled steps: speculative bursts draw the plain sampled loop's tokens, peaked and broad draws
  (every synthetic shape, seven seeds, temperatures 0.05 to 1.3, top-k and top-p), and on the real
  model's extractive prompt; sampled requests speculate, unseeded or seeded, and a seeded one gives
  the plain loop's tokens.
- Quantized models (every format, q/k/v in three formats, a bf16 product among quantized ones, a
  quantized lm_head and a bf16 one) run all of the above.
"""

import numpy as np
import pytest
from gpu_buffers import gpu_logits
from test_real_model import CLEAR, FILE, needs_file

from arcpy import _lib
from arcpy.backends import open_engine
from arcpy.bench.speculate import driver_tokens, repeating_prompt
from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.sequence import SequenceStart
from arcpy.loop.burst import BurstDriver
from arcpy.loop.engine import DEVICE_LOOP, HOST, Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.request import Request
from arcpy.loop.settings import EngineSettings
from arcpy.loop.speculate import StepCost
from arcpy.model import synthetic_model
from arcpy.sampling import Sampling

pytestmark = pytest.mark.gpu
K = 7


@pytest.fixture(scope="module", params=["stories15M", "gqa", "qwen-tiny", "qwen3-tiny", "phi3-tiny", "smollm3-tiny",
                                        "gemma3-tiny", "tiny-quant", "tiny-quant-tied"])
def device(request):
    dev = open_cuda_device(synthetic_model(request.param, seed=3), max_seq=512, speculate=K)
    yield dev
    dev.close()


def engine(dev, *, speculate=True, always=False, burst=8, latch=None):
    cost = StepCost(measure=False, prior=0.0) if always else None
    return Engine(dev, "cuda", EngineSettings(device_loop=True, burst=burst, speculate=speculate), environ={},
                  latch=latch or FallbackLatch(), step_cost=cost)


def assert_verify_rows_are_decode_logits(device, prompt):
    """One speculative step after `prompt`: each of its verify rows equals, as bits, the decode
    forward's logits of the row's token at the row's position."""
    ctx, lib, ffi = device.ctx, device.lib, device.ffi
    drv = BurstDriver(device, max_spins=50_000_000)
    drv.begin_sequence(SequenceStart(loop=True))
    device.enqueue_prefill(prompt, 0)
    device.set_input(prompt[-1], len(prompt) - 1)
    list(drv.run_speculative(1, 1000, first_commit=True))  # the prefill's token, then one step at p
    p = len(prompt)
    ctx.wait_idle()
    lp, tp, rp = ffi.new("const float **"), ffi.new("const int32_t **"), ffi.new("int32_t *")
    _lib.check(lib.arc_model_speculation(device.forward.ptr, lp, tp, rp))
    rows, width = int(rp[0]), device.forward.width
    assert rows == K + 1
    logits, _ = ctx.pinned((rows, width), np.float32)
    tokens, _ = ctx.pinned((rows + 1,), np.int32)
    ctx.download_async(logits, lp[0])
    ctx.download_async(tokens, tp[0])
    ctx.wait_idle()
    verify, toks = logits.copy(), tokens.copy()
    assert 0 <= toks[rows] <= K
    for i in range(rows):  # the decode forward of row i's token at p + i reads the rows before it
        ref = gpu_logits(device, int(toks[i]), p + i)
        assert np.isfinite(ref).all(), f"row {i}: the decode's logits are not finite"
        diff = np.flatnonzero(verify[i].view(np.uint32) != ref.view(np.uint32))
        assert diff.size == 0, (f"row {i}: {diff.size} logits differ from the decode's as bits, first "
                                f"{diff[:3].tolist()}: {verify[i][diff[:3]].tolist()} vs {ref[diff[:3]].tolist()}")


def test_verify_rows_are_the_decode_forwards_logits_at_their_positions(device):
    assert_verify_rows_are_decode_logits(device, repeating_prompt(device.vocab))


def test_verify_rows_at_depth_are_the_decode_forwards_logits():
    # 4,477 positions: the attention's blocks take several tiles of positions, and the rows
    # p..p + 7 cross a tile boundary at 4,480 (70 tiles of 64, 35 chunks of 128).
    dev = open_cuda_device(synthetic_model("gqa", seed=3, max_seq=8192), max_seq=8192, speculate=K)
    try:
        prompt = np.random.default_rng(5).integers(3, dev.vocab, 4477).tolist()
        assert_verify_rows_are_decode_logits(dev, prompt)
    finally:
        dev.close()


@pytest.mark.parametrize("always", [True, False], ids=["every-burst", "policy"])
@pytest.mark.parametrize("burst", [1, 8])
def test_speculative_loop_gives_the_plain_loops_tokens(device, always, burst):
    prompt = repeating_prompt(device.vocab)
    plain = engine(device, speculate=False, burst=burst)
    want = list(plain.generate(prompt, 160))
    spec = engine(device, always=always, burst=burst)
    got = list(spec.generate(prompt, 160))
    assert got == want
    st = spec.stats
    assert st.path == DEVICE_LOOP and st.speculation == "on" and st.tokens == 160
    if always:
        assert st.spec_steps > 0 and 1.0 <= st.tokens_per_step <= K + 1


# Peaked and broad draws, several seeds: the verify's rows have the plain step's logits bit for bit,
# so every draw is the plain loop's, however near its threshold lies to a boundary.
DRAWS = [Sampling(temperature=0.05, seed=1), Sampling(temperature=0.05, seed=5, top_k=8, top_p=0.8),
         Sampling(temperature=0.7, seed=2), Sampling(temperature=1.0, seed=4, top_p=0.9),
         Sampling(temperature=0.3, seed=5, top_k=8, top_p=0.8), Sampling(temperature=1.0, seed=7, top_k=40),
         Sampling(temperature=1.3, seed=8)]
DRAW_IDS = ["t0.05", "t0.05-k8-p0.8", "t0.7", "t1-p0.9", "t0.3-k8-p0.8", "t1-k40", "t1.3"]


@pytest.mark.parametrize("sampling", DRAWS, ids=DRAW_IDS)
def test_sampled_speculative_steps_draw_the_plain_loops_tokens(device, sampling):
    # Every token is the draw after its row at its position: the plain sampled loop's draw.
    prompt = repeating_prompt(device.vocab, seed=4)
    want = driver_tokens(device, prompt, sampling, 160, speculative=False)
    assert driver_tokens(device, prompt, sampling, 160, speculative=True) == want


def test_an_unseeded_sampled_request_speculates(device):
    prompt = repeating_prompt(device.vocab, seed=4)
    spec = engine(device, always=True, burst=8)
    got = list(spec.generate(prompt, 120, sampling=Sampling(temperature=0.7)))
    st = spec.stats
    assert st.path == DEVICE_LOOP and st.speculation == "on" and st.spec_steps > 0 and st.seed is not None
    assert len(got) == 120 and all(0 <= t < device.vocab for t in got)
    # It drew: the seed it reports gives the plain loop's draws the same tokens (whether they differ
    # from the greedy answer depends on how peaked the model is, not on the path).
    seeded = Sampling(temperature=0.7, seed=st.seed)
    assert got == list(engine(device, speculate=False).generate(prompt, 120, sampling=seeded))


@pytest.mark.parametrize("sampling", DRAWS[2:5], ids=DRAW_IDS[2:5])
def test_a_sampled_request_with_its_own_seed_speculates_and_gives_the_plain_loops_tokens(device, sampling):
    prompt = repeating_prompt(device.vocab, seed=4)
    spec = engine(device, always=True, burst=8)
    got = list(spec.generate(prompt, 120, sampling=sampling))
    assert spec.stats.speculation == "on" and spec.stats.spec_steps > 0 and spec.stats.seed == sampling.seed
    assert got == list(engine(device, speculate=False).generate(prompt, 120, sampling=sampling))


@pytest.mark.parametrize("budget", [1, 2, 9, 37])
def test_the_budget_holds_inside_an_accepted_run(device, budget):
    prompt = repeating_prompt(device.vocab, seed=1)
    want = list(engine(device, speculate=False).generate(prompt, budget))
    spec = engine(device, always=True, burst=16)
    assert list(spec.generate(prompt, budget)) == want
    assert spec.stats.tokens == budget


def test_a_stop_id_ends_the_speculative_loop_where_it_ends_the_plain_one(device):
    prompt = repeating_prompt(device.vocab, seed=2)
    out = list(engine(device, speculate=False).generate(prompt, 120))
    stop = out[70]
    want = out[:out.index(stop)]
    spec = engine(device, always=True, burst=16)
    assert list(spec.generate(prompt, 120, stop_ids=[stop])) == want
    assert spec.stats.stop_id == stop


def test_a_lost_speculative_step_falls_back_to_the_host_path_with_the_same_tokens(device):
    prompt = repeating_prompt(device.vocab, seed=3)
    want = list(engine(device, speculate=False).generate(prompt, 64))
    latch = FallbackLatch()
    spec = engine(device, always=True, burst=8, latch=latch)
    gen = spec.generate(prompt, 64)
    got = [next(gen)]
    device.inject_lost_step(1)
    got += list(gen)
    assert got == want
    assert spec.stats.path == f"{DEVICE_LOOP}+{HOST}" and latch.latched
    assert "speculative steps ran" in spec.stats.fallback


PARAGRAPH = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He wound the great "
             "clockwork, trimmed the wick, and polished the lens until it shone. Ships far out at sea "
             "saw the beam sweep across the water and knew that the rocks were near.")


@pytest.fixture(scope="module")
def smollm2():
    from arcpy.loading import load_gguf
    return load_gguf(FILE)


@needs_file
def test_real_model_extractive_prompt_same_ids_with_drafts_accepted(smollm2):
    model, text = smollm2
    request = Request(messages=[{"role": "user", "content": "Repeat this paragraph exactly, word for word:\n\n"
                                 + PARAGRAPH}], max_new_tokens=120, stop_ids=text.eos_ids)
    with open_engine(model, "cuda", max_seq=512, burst=8, environ={}, latch=FallbackLatch(), text=text,
                     speculate=K) as eng:
        eng.speculate = False
        plain = [p.token for p in eng.stream(request) if p.token is not None]
        plain_stats = eng.stats
        eng.speculate = True
        got = [p.token for p in eng.stream(request) if p.token is not None]
        st = eng.stats
    assert got == plain
    assert plain_stats.speculation == "off" and st.speculation == "on"
    assert st.tokens_per_step > 1.5, st.summary()


@needs_file
def test_real_model_extractive_prompt_sampled_speculates_with_drafts_accepted(smollm2):
    model, text = smollm2
    request = Request(messages=[{"role": "user", "content": "Repeat this paragraph exactly, word for word:\n\n"
                                 + PARAGRAPH}], max_new_tokens=120, stop_ids=text.eos_ids,
                      sampling=Sampling(temperature=0.7, top_p=0.95))
    with open_engine(model, "cuda", max_seq=512, burst=8, environ={}, latch=FallbackLatch(), text=text,
                     speculate=K) as eng:
        got = [p.token for p in eng.stream(request) if p.token is not None]
        st = eng.stats
    assert got and st.speculation == "on" and st.tokens_per_step > 1.5, st.summary()


@needs_file
@pytest.mark.parametrize("case", CLEAR, ids=lambda c: c["question"])
def test_real_model_golden_ids_with_speculation(smollm2, case):
    model, text = smollm2
    with open_engine(model, "cuda", max_seq=256, burst=8, environ={}, latch=FallbackLatch(), speculate=K,
                     step_cost=StepCost(measure=False, prior=0.0)) as eng:
        got = list(eng.generate(case["prompt_ids"], 64, stop_ids=text.eos_ids))
        assert eng.stats.speculation == "on" and eng.stats.spec_steps > 0
    assert got == case["ids"][:-1]
