"""The mixtures of experts against transformers (CPU tier): the NumPy reference on the fixtures of
tests/data/moe (arcpy's tiny MoE presets with random weights, saved under transformers' names,
with transformers' float32 logits from those files; made by scripts/moe_fixtures.py) must give
those logits. Where the fixtures have not been made, these tests skip and say so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from arcpy.devices.reference import ReferenceModel
from arcpy.model import load_model

DATA = Path(__file__).parent / "data" / "moe"
FAMILIES = sorted(p.name for p in DATA.iterdir() if (p / "golden.npz").is_file()) if DATA.is_dir() else []
pytestmark = pytest.mark.skipif(not FAMILIES, reason="no MoE fixtures: python scripts/moe_fixtures.py tests/data/moe")
EXACT = 1e-4       # a float32 KV cache: only summation order differs
TOLERANCE = 0.04   # arcpy's numerics (a bf16 KV cache), as for the dense families


def run(family: str, exact: bool, monkeypatch) -> tuple[np.ndarray, dict]:
    import arcpy.devices.kv_formats as kv_formats
    if exact:
        monkeypatch.setitem(kv_formats.ROUND, "bf16", lambda a: a)  # the KV cache in float32
    with np.load(DATA / family / "golden.npz") as d:
        g = {k: d[k] for k in d}
    ref = ReferenceModel(load_model(DATA / family))
    return np.stack([ref.forward(int(t), i) for i, t in enumerate(g["tokens"])]), g


@pytest.mark.parametrize("family", FAMILIES or ["none"])
def test_the_moe_layer_program_computes_what_transformers_computes(family, monkeypatch):
    got, g = run(family, True, monkeypatch)
    err = float(np.abs(got - g["logits"]).max() / np.abs(g["logits"]).max())
    print(f"{family}: max relative logit error {err:.3g} with a float32 cache")
    assert err <= EXACT, f"{family}: {err:.3g}"


@pytest.mark.parametrize("family", FAMILIES or ["none"])
def test_the_reference_with_arcpys_numerics_stays_near_transformers(family, monkeypatch):
    got, g = run(family, False, monkeypatch)
    scale = float(np.abs(g["logits"]).max())
    err = float(np.abs(got - g["logits"]).max()) / scale
    assert err <= TOLERANCE, f"{family}: {err:.3g}"
    clear = g["margin"] > 2 * err * scale
    assert np.array_equal(got.argmax(axis=1)[clear], g["logits"].argmax(axis=1)[clear])
