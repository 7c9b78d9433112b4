"""GPU tier: the whole forward on the GPU against the NumPy reference (marker `gpu`).

Shapes: the synthetic stories15M (head_dim 48), a grouped-query shape (32 heads, 8 KV heads,
head_dim 64, Llama 3 rope scaling, untied head), and the families' features (presets.py):
qwen3-tiny (q/k norms, YaRN), phi3-tiny (partial rotary, LongRoPE), smollm3-tiny (a layer
without RoPE), gemma3-tiny (head_dim 256, post-norms, GELU, scaled embedding and scores, a
32-position window on 4 of its 6 layers, a RoPE base per layer kind), and gemma3-tiny's layers with heads of 512
(gemma3-wide: libarc's SIMT attention for heads past 256). Logits must agree with the reference within a
bf16-level tolerance at positions 0, 1, 100 and 2000; the replayed graph must equal the eager
forward bit for bit; greedy decoding must pick the reference's token wherever the reference's
top-two margin exceeds the error measured at that step.
"""

import dataclasses

import numpy as np
import pytest
from gpu_buffers import decided_greedy_steps, gpu_logits

from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.reference import ReferenceModel
from arcpy.model import random_model, synthetic_model
from arcpy.model.presets import SHAPES as PRESETS

pytestmark = pytest.mark.gpu

SHAPES = ["stories15M", "gqa", "qwen3-tiny", "phi3-tiny", "smollm3-tiny", "gemma3-tiny", "gemma3-wide"]
CHECK_POSITIONS = (0, 1, 100, 2000)
MAX_SEQ = 2048


def build(name: str):
    if name == "gemma3-wide":
        return random_model(dataclasses.replace(PRESETS["gemma3-tiny"], head_dim=512, max_seq=4096), seed=7, name=name)
    return synthetic_model(name, seed=7, max_seq=4096)


@pytest.fixture(scope="module", params=SHAPES)
def pair(request):
    model = build(request.param)
    dev = open_cuda_device(model, max_seq=MAX_SEQ)
    yield model, dev
    dev.close()


def rel_error(got, want):
    assert np.all(np.isfinite(got)), "non-finite logits"
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(1.0, float(np.max(np.abs(want)))))


def test_forward_logits_match_the_reference_at_checkpoints(pair):
    model, dev = pair
    ref = ReferenceModel(model, max_seq=MAX_SEQ)
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, model.config.vocab, size=max(CHECK_POSITIONS) + 1)
    errors = {}
    for pos, tok in enumerate(tokens):
        want = ref.forward(int(tok), pos, logits=pos in CHECK_POSITIONS)
        if pos in CHECK_POSITIONS:
            got = gpu_logits(dev, int(tok), pos)
            errors[pos] = rel_error(got, want)
        else:
            dev.set_input(int(tok), pos)  # fill the GPU's KV cache the same way, no waits
            dev.enqueue_forward()
    print(f"{model.name}: max relative logit error by position {errors}")
    assert all(e <= 1e-2 for e in errors.values()), errors


def test_graph_replay_equals_the_eager_forward_bit_for_bit(pair):
    model, dev = pair
    for pos in (0, 1, 37, 511):
        tok = (pos * 7919 + 13) % model.config.vocab
        replayed = gpu_logits(dev, tok, pos)
        eager = gpu_logits(dev, tok, pos, eager=True)
        assert np.array_equal(replayed, eager), f"position {pos}: graph and eager differ"


def test_greedy_matches_the_reference_where_the_margin_exceeds_the_error(pair):
    model, dev = pair
    agreed, checked = decided_greedy_steps(model, dev, MAX_SEQ)
    print(f"{model.name}: {agreed}/{checked} decided steps agree")
    assert checked >= 16 and agreed == checked
