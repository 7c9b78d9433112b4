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
