"""The KV cache's forms in the NumPy reference (arcpy/devices/kv_formats.py): Q8_0 as the gguf
package quantizes and dequantizes it, float8 e4m3 as the nearest of its 256 values, and the
reference's cache holding what the form reads back."""

import numpy as np
import pytest

from arcpy.devices.kv_formats import E4M3_MAX, kv_round, round_fp8, round_q8_0
from arcpy.devices.reference import ReferenceModel
from arcpy.errors import InvalidArgumentError
from arcpy.model import synthetic_model


def rows(seed: int) -> np.ndarray:
    """Rows of 128 values over many scales, with zero blocks, ties and a lone large value."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, 128)).astype(np.float32) * np.exp2(rng.integers(-12, 6, (64, 1))).astype(np.float32)
    x[3, :32] = 0.0
    x[5, :32] = np.arange(32, dtype=np.float32) - 15.5  # amax 127 (d = 1): x / d lands on halves
    x[5, 0] = 127.0
    x[7, 40] = 1e4
    return x


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_q8_0_reads_back_what_the_gguf_package_dequantizes(seed):
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize
    x = rows(seed)
    want = dequantize(quantize(x, Q.Q8_0), Q.Q8_0).astype(np.float32)
    np.testing.assert_array_equal(round_q8_0(x), want)


def e4m3_values() -> np.ndarray:
    """Every finite float8 e4m3fn value, from its bits (S EEEE MMM, bias 7; 0x7F and 0xFF are NaN)."""
    out = []
    for b in range(256):
        if b & 0x7F == 0x7F:
            continue
        s, e, m = b >> 7, (b >> 3) & 0xF, b & 7
        v = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        out.append(-v if s else v)
    return np.unique(np.array(out))


def test_fp8_is_the_nearest_e4m3_value_ties_to_even_saturating():
    values = e4m3_values()
    assert values.max() == E4M3_MAX and len(values) == 253  # +-0 counted once
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(4000) * np.exp2(rng.integers(-12, 9, 4000)),
                        (values[1:] + values[:-1]) / 2, values, [500.0, -1e6, 2.0 ** -11]]).astype(np.float32)
    got = round_fp8(x)
    # The nearest value by distance; at a tie, the one whose mantissa's last bit is 0 (even).
    dist = np.abs(x[:, None].astype(np.float64) - values[None, :])
    best = dist.min(axis=1, keepdims=True)
    for i in np.nonzero(np.isfinite(x))[0]:
        cands = values[dist[i] == best[i, 0]]
        if abs(x[i]) >= E4M3_MAX:
            want = np.copysign(E4M3_MAX, x[i])
        elif len(cands) == 1:
            want = cands[0]
        else:  # even: the candidate whose value over its spacing is an even integer
            e = np.floor(np.log2(np.abs(cands).max()))
            step = 2.0 ** (max(e, -6) - 3)
            want = next(c for c in cands if (c / step) % 2 == 0)
        assert got[i] == np.float32(want), (x[i], got[i], want)


def test_the_reference_cache_holds_what_its_form_reads_back():
    model = synthetic_model("qwen-tiny", seed=1)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    logits = {}
    for fmt in ("bf16", "q8_0", "fp8"):
        ref = ReferenceModel(model, kv_cache=fmt)
        logits[fmt] = ref.prefill(tokens)
        held = ref.k_cache[:, :, :len(tokens)]
        np.testing.assert_array_equal(kv_round(fmt)(held), held)  # each value one the form holds
    assert not np.array_equal(logits["bf16"], logits["q8_0"]) and not np.array_equal(logits["bf16"], logits["fp8"])
    with pytest.raises(InvalidArgumentError, match="one of bf16, q8_0, fp8"):
        ReferenceModel(model, kv_cache="q4")
