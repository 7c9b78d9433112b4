"""Golden greedy decodes: token ids recorded once and frozen here, checked on both tiers.

A change that moves the kernels and the NumPy reference together (a new rounding, a wrong RoPE
pairing in both) changes these ids and fails here, though the two still agree with each other.
The prompts were chosen so that every step's top-two logit margin is well above the GPU's
measured error against the reference (at most 1.3e-3 of the logit scale up to position 100,
docs/PERF.md): the GPU must give exactly these ids too.
"""

import numpy as np
import pytest

from arcpy.backends import open_engine
from arcpy.devices.reference import ReferenceModel
from arcpy.loop.engine import DEVICE_LOOP, HOST
from arcpy.loop.gate import FallbackLatch
from arcpy.model import synthetic_model

# shape -> (prompt, the 48 greedy ids that follow it), weights synthetic_model(shape, seed=0)
GOLDEN = {
    "stories15M": ([1, 26161, 10553, 14487], [
        21986, 28620, 4124, 8207, 22817, 21741, 12507, 29114, 5348, 9232, 18228, 10189, 29346, 31917,
        16228, 10852, 23162, 17280, 12715, 19995, 11950, 11710, 17994, 15374, 7757, 28646, 7694, 13112,
        20569, 29874, 28152, 15861, 28354, 14335, 4658, 6095, 24559, 6801, 30201, 4081, 4874, 16726,
        5156, 5471, 12155, 14052, 4269, 8289]),
    "qwen-tiny": ([1, 46, 17, 443], [
        368, 76, 453, 224, 471, 443, 5, 1, 224, 215, 41, 448, 462, 508, 202, 49, 96, 104, 47, 446, 57,
        128, 488, 503, 332, 368, 90, 183, 124, 412, 510, 223, 348, 321, 439, 388, 300, 379, 10, 422, 32,
        477, 267, 69, 407, 358, 70, 264]),
}
MAX_SEQ = 256
# The smallest top-two margin (relative to the largest |logit|) the golden runs may have.
MIN_MARGIN = 3e-3


def margins(ref: ReferenceModel, prompt, ids):
    """Top-two margin of each step's logits, teacher-forced along `ids`."""
    ref.reset()
    pos, out = 0, []
    for tok in prompt + ids[:-1]:
        logits = ref.forward(tok, pos)
        pos += 1
        if pos >= len(prompt):
            top = np.sort(logits)[-2:]
            out.append((top[1] - top[0]) / np.abs(logits).max())
    return out


@pytest.mark.parametrize("shape", sorted(GOLDEN))
def test_reference_greedy_ids_are_the_golden_ones(shape):
    prompt, ids = GOLDEN[shape]
    ref = ReferenceModel(synthetic_model(shape, seed=0), max_seq=MAX_SEQ)
    assert ref.greedy(prompt, len(ids)) == ids
    assert min(margins(ref, prompt, ids)) > MIN_MARGIN


@pytest.mark.parametrize("shape", sorted(GOLDEN))
def test_numpy_backend_decodes_the_golden_ids(shape):
    prompt, ids = GOLDEN[shape]
    with open_engine(synthetic_model(shape, seed=0), "numpy", max_seq=MAX_SEQ, environ={}) as eng:
        assert list(eng.generate(prompt, len(ids))) == ids


@pytest.mark.gpu
@pytest.mark.parametrize("loop", [False, True], ids=["host-path", "device-loop"])
@pytest.mark.parametrize("shape", sorted(GOLDEN))
def test_gpu_decodes_the_golden_ids(shape, loop):
    prompt, ids = GOLDEN[shape]
    with open_engine(synthetic_model(shape, seed=0), "cuda", max_seq=MAX_SEQ, device_loop=loop, burst=8,
                     environ={}, latch=FallbackLatch()) as eng:
        got = list(eng.generate(prompt, len(ids)))
        assert eng.stats.path == (DEVICE_LOOP if loop else HOST)
    assert got == ids

