"""The GPU tests' reference that rounds a quantized product's input as libarc's GEMVs do
(gemv_inputs.py): the rounding itself, and that it touches products over quantized matrices alone."""

import numpy as np
from gemv_inputs import libarc_gemv_inputs, round_like_libarc

from arcpy.devices.reference import ReferenceModel
from arcpy.model import SHAPES, random_model, synthetic_model
from arcpy.model.native import expected_tensors, is_matrix
from arcpy.model.quant import FORMAT_NAMES


def test_each_32_values_round_at_127_over_their_largest():
    x = np.zeros(64, np.float32)
    x[:4] = [2.0, -1.0, 0.5 / 127 * 2, 0.3]   # amax 2: steps of 2 / 127
    x[32:34] = [-4.0, 4.0 * 63.5 / 127]       # a tie at 63.5 rounds to even, 64
    got = round_like_libarc(x)
    assert got[0] == 2.0 and got[1] == np.float32(-64 * (np.float32(2.0) / 127))
    assert got[3] == np.float32(19 * (np.float32(2.0) / 127)) and np.all(got[4:32] == 0)
    assert got[33] == np.float32(64 * (np.float32(4.0) / 127))


def test_only_products_over_quantized_matrices_round_their_input():
    cfg = SHAPES["gpt-oss-tiny"]
    q8 = {v: k for k, v in FORMAT_NAMES.items()}["Q8_0"]
    quantized = random_model(cfg, seed=5, formats={n: q8 for n in expected_tensors(cfg) if is_matrix(n)
                                                   and "experts." in n})
    before = ReferenceModel(quantized, max_seq=64).forward(1, 0)
    for model, moved in ((quantized, True), (synthetic_model("gpt-oss-tiny", seed=5), False)):
        plain = ReferenceModel(model, max_seq=64).forward(1, 0)
        with libarc_gemv_inputs():
            rounded = ReferenceModel(model, max_seq=64).forward(1, 0)
        assert (not np.array_equal(plain, rounded)) == moved
    assert np.array_equal(ReferenceModel(quantized, max_seq=64).forward(1, 0), before)  # restored on leaving


def _spread(shape: str) -> tuple[float, float]:
    """How far the reference's own logits move, with the routers' logits 16 times larger
    (test_gpu_moe.py's prefill), at worst over 8 prompts of 16 tokens: from float32 to the
    prefill's bf16 roundings; and at worst over 24 decode steps, from float32 inputs to the
    quantized GEMVs' rounding of the experts' inputs (Q8_0 experts)."""
    from arcpy.model.bf16 import bf16_to_f32, f32_to_bf16
    cfg = SHAPES[shape]
    q8 = {v: k for k, v in FORMAT_NAMES.items()}["Q8_0"]
    model = random_model(cfg, seed=5, formats={n: q8 for n in expected_tensors(cfg) if is_matrix(n)
                                               and "experts." in n})
    for name in [n for n in model.tensors if n.endswith("mlp.gate.weight")]:
        model.tensors[name] = f32_to_bf16(bf16_to_f32(model.tensors[name]) * np.float32(16))
    rel = lambda got, want: float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))  # noqa: E731
    rng = np.random.default_rng(9)
    prefill = 0.0
    for _ in range(8):
        tokens = [int(t) for t in rng.integers(0, cfg.vocab, 16)]
        prefill = max(prefill, rel(ReferenceModel(model, max_seq=64).prefill(tokens, bf16_products=True),
                                   ReferenceModel(model, max_seq=64).prefill(tokens)))
    plain, decode, token = ReferenceModel(model, max_seq=64), 0.0, 1
    with libarc_gemv_inputs():
        inputs = ReferenceModel(model, max_seq=64)
        for pos in range(24):
            want = plain.forward(token, pos)
            decode = max(decode, rel(inputs.forward(token, pos), want))
            token = int(np.argmax(want))
    return prefill, decode


def test_gpt_oss_tiny_moves_with_a_rounding_far_more_than_another_mixture():
    """Why the GPU tests hold gpt-oss-tiny's quantized decode to a rounding reference and its
    prefill to a wider bound: its reference's own logits move several times as far as
    qwen3moe-tiny's with the same roundings."""
    oss, other = _spread("gpt-oss-tiny"), _spread("qwen3moe-tiny")
    print(f"gpt-oss-tiny {oss}, qwen3moe-tiny {other}")
    assert oss[0] > 3 * other[0] and oss[1] > 3 * other[1]
