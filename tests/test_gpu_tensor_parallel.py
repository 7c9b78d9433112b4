"""GPU tier: tensor parallelism (marker `gpu`; arcpy/parallel/cuda.py, libarc/comm.cu).

- A world of one through NCCL on one GPU: the rank's step graphs hold its (empty) sums and give the
  whole model's tokens bit for bit, greedy and seeded, on the device loop with no host wait a
  token, bf16 and quantized; what a split rank refuses (its prefill, speculative steps).
- With two GPUs or more (skipped on one): the split's tokens against the whole model's; a commit lost on
  rank 1 caught before its token is handed out.
"""

import pytest

from arcpy import _lib
from arcpy.backends import open_engine
from arcpy.devices.sequence import SequenceStart
from arcpy.errors import ArcError, InvalidArgumentError, NoDeviceError
from arcpy.loop.engine import DEVICE_LOOP
from arcpy.model import synthetic_model
from arcpy.sampling import Sampling

pytestmark = pytest.mark.gpu
PROMPT = [3, 141, 59, 26, 53, 58, 97, 93]
DRAWS = [None, Sampling(temperature=0.8, top_p=0.9, seed=5)]


def gpus() -> int:
    try:
        return _lib.device_count()
    except ArcError:
        return 0


def split(model, devices):
    try:
        return open_engine(model, "cuda", max_seq=256, devices=devices, burst=8, device_loop=True)
    except NoDeviceError as exc:
        pytest.skip(f"no NCCL here: {exc}")


@pytest.mark.parametrize("shape", ["qwen3-tiny", "tiny-quant", "stories15M"])
def test_a_world_of_one_gives_the_whole_models_tokens(shape):
    model = synthetic_model(shape, seed=9)
    with open_engine(model, "cuda", max_seq=256, speculate=0, prefill=False, burst=8, device_loop=True) as whole, \
            split(model, [0]) as one:
        assert one.device.capabilities.name.startswith("1 x ")
        for sampling in DRAWS:
            want = list(whole.generate(PROMPT, 48, sampling=sampling))
            got = list(one.generate(PROMPT, 48, sampling=sampling))
            assert got == want, sampling
            assert one.stats.path == DEVICE_LOOP and one.stats.host_waits == 0
        assert "rank 0 on" in one.device.memory_report()


def test_a_split_rank_refuses_its_prefill_and_speculative_steps():
    with split(synthetic_model("qwen3-tiny", seed=9), [0]) as one:
        rank = one.device.ranks[0]
        ffi, lib = rank.ffi, rank.lib
        ids = ffi.new("int32_t[]", PROMPT)
        assert lib.arc_model_prefill(rank.forward.ptr, ids, len(PROMPT), 0) != 0
        assert "split model" in ffi.string(lib.arc_last_error()).decode()
        assert lib.arc_model_speculate_reserve(rank.forward.ptr, 3) != 0
        assert "split model" in ffi.string(lib.arc_last_error()).decode()
        with pytest.raises(InvalidArgumentError, match="log-probabilities"):
            one.device.begin_sequence(SequenceStart(loop=True, logprobs=2))


@pytest.mark.parametrize("world", [2, 4])
def test_the_split_over_gpus_gives_the_whole_models_greedy_tokens(world):
    if gpus() < world:
        pytest.skip(f"{world} GPUs needed")
    model = synthetic_model("gqa", seed=9)  # 32 heads, 8 key/value heads
    with open_engine(model, "cuda", max_seq=256, speculate=0, prefill=False, burst=8, device_loop=True) as whole:
        want = list(whole.generate(PROMPT, 32))
    with split(model, list(range(world))) as tp:
        assert list(tp.generate(PROMPT, 32)) == want  # sums in another order: equal where no near tie
        assert tp.stats.host_waits == 0


def test_a_commit_lost_on_rank_1_is_caught_before_its_token_and_falls_back():
    if gpus() < 2:
        pytest.skip("2 GPUs needed")
    from arcpy.loop.gate import FallbackLatch

    model = synthetic_model("gqa", seed=9)
    with open_engine(model, "cuda", max_seq=256, devices=[0, 1], burst=8, device_loop=True,
                     latch=FallbackLatch()) as tp:
        want = list(tp.generate(PROMPT, 24))
        tp.device.ranks[1].inject_lost_step(5)  # rank 1's input goes stale: every rank's sums go wrong
        assert list(tp.generate(PROMPT, 24)) == want
        assert tp.stats.fallback and ("disagree" in tp.stats.fallback or "idle" in tp.stats.fallback)
