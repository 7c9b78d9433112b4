"""What the goldens' tests of the families share (tests/test_qwen35.py, test_gpt_oss.py,
test_gemma4.py): a fixture's recorded goldens, the NumPy reference's logits of a token sequence,
and the error they are measured by."""

from pathlib import Path

import numpy as np

from arcpy.devices.reference import ReferenceModel


def read_golden(folder: Path) -> dict:
    """The arrays of a fixture's golden.npz (its tokens and transformers' float32 logits)."""
    with np.load(folder / "golden.npz") as d:
        return {k: d[k] for k in d}


def reference_logits(model, tokens) -> np.ndarray:
    """The reference's logits at every position of `tokens`, one token at a time from position 0."""
    ref = ReferenceModel(model)
    return np.stack([ref.forward(int(t), i) for i, t in enumerate(tokens)])


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference, relative to the largest magnitude of `want`."""
    return float(np.abs(got - want).max() / np.abs(want).max())


def assert_greedy_goldens(folder: Path, tolerance: float) -> float:
    """The reference's logits of a fixture (arcpy's bf16 cache) within `tolerance` of transformers'
    over the greedy steps, every step's top-two margin clear of twice that error, and the greedy ids
    transformers'; returns the error."""
    from arcpy.model import load_model
    g = read_golden(folder)
    tokens, n = g["tokens"], int(g["n_prompt"])
    model = load_model(folder)
    got, want = reference_logits(model, tokens)[n - 1:], g["logits"][n - 1:]
    err = relative_error(got, want)
    print(f"{folder.name}: max relative logit error {err:.3g} over {len(want)} positions")
    assert err <= tolerance
    assert np.all(g["margin"][n - 1:] > 2 * err * np.abs(want).max())  # every greedy step is clear of the error
    assert ReferenceModel(model).greedy([int(t) for t in tokens[:n]], len(tokens) - n) == [int(t) for t in tokens[n:]]
    return err
