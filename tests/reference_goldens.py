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
