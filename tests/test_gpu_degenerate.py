"""GPU tier: a forward whose logits are all equal (here: a final norm of zeros, so every logit is
0) is the model's fault, latched as ARC_FAULT_DEGENERATE by every sampler that commits in the
device loop: the lm_head's fused argmax over bf16 and quantized weights (model/gemv/gemv.cu,
model/qgemv/qgemv.cuh), the draw, the argmax after a prefill (argmax.cu), and the speculative step's
accept (model/forward/speculate.cu), greedy and sampled. The host path raises the same error from arc_argmax's smallest
logit and from the logits it reads. No path falls back, and no token is emitted. The samplers'
kernels alone are tested on chosen logits in tests/test_gpu_loop.py."""

import numpy as np
import pytest

from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.sequence import SequenceStart
from arcpy.errors import DegenerateLogitsError
from arcpy.loop.burst import BurstDriver
from arcpy.loop.engine import DEVICE_LOOP, HOST, Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.model import synthetic_model
from arcpy.sampling import Sampling

pytestmark = pytest.mark.gpu
SAMPLED = Sampling(temperature=0.8, top_p=0.95, seed=7)


def flat_model(shape: str):
    """The preset with a final norm of zeros: every logit of every forward is exactly 0."""
    model = synthetic_model(shape, seed=3, max_seq=256)
    norm = model.tensors["model.norm.weight"]
    model.tensors["model.norm.weight"] = np.zeros_like(norm)
    return model


@pytest.fixture(scope="module", params=["stories15M", "tiny-quant"])
def device(request):
    dev = open_cuda_device(flat_model(request.param), max_seq=256, speculate=4)
    yield dev
    dev.close()


@pytest.mark.parametrize("sampling", [None, SAMPLED], ids=["fused-argmax", "draw"])
def test_the_step_graphs_latch_degenerate_logits_and_publish_nothing(device, sampling):
    drv = BurstDriver(device)
    drv.begin_sequence(SequenceStart(loop=True, sampling=sampling))
    device.set_input(1, 0)
    got = []
    with pytest.raises(DegenerateLogitsError, match="position 0 gave degenerate logits"):
        for tok in drv.run(4):
            got.append(tok)
    assert got == [] and device.poll_ring().published == 0


@pytest.mark.parametrize("sampling", [None, SAMPLED], ids=["greedy", "sampled"])
def test_the_speculative_accept_latches_degenerate_logits(device, sampling):
    assert device.capabilities.speculate_k == 4  # bf16 and quantized alike
    drv = BurstDriver(device)
    prompt = [1, 5, 9, 5, 9, 5]
    drv.begin_sequence(SequenceStart(loop=True, sampling=sampling, history=tuple(prompt),
                                     input=(prompt[-1], len(prompt) - 1)))
    with pytest.raises(DegenerateLogitsError, match=f"position {len(prompt) - 1} "):
        list(drv.run_speculative(2, 8))
    assert device.poll_ring().published == 0


@pytest.mark.parametrize("sampling", [None, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("loop", [True, False], ids=["device-loop", "host-path"])
@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "token-by-token"])
def test_the_engine_raises_on_both_paths_without_fallback(device, loop, sampling, prefill):
    latch = FallbackLatch()
    eng = Engine(device, "cuda",
                 EngineSettings(device_loop=loop, burst=4, prefill=prefill, speculate=False, prefix_cache=False),
                 environ={}, latch=latch)
    got = []
    with pytest.raises(DegenerateLogitsError, match="position 3 gave degenerate logits"):
        for tok in eng.generate([1, 20, 30, 40], 8, sampling=sampling):
            got.append(tok)
    assert got == [] and not latch.latched and eng.poisoned is None
    assert eng.stats.path == (DEVICE_LOOP if loop else HOST) and eng.stats.finish_reason == "fault"
