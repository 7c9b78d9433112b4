"""scripts/perplexity.py: a text's perplexity, each window scored from position 0 as a prompt's
log-probabilities are (Engine.prompt_logprobs), on the backend and with the KV cache form asked
for; here on the NumPy backend against the reference's own prefill of every row."""

import importlib.util
import math
from pathlib import Path

import numpy as np

from arcpy.backends import open_engine
from arcpy.devices.reference import ReferenceModel
from arcpy.model import synthetic_model

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("perplexity_script", ROOT / "scripts" / "perplexity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_nll(model, tokens, window, kv_cache):
    """Each window's tokens after its first, -log softmax of the reference's rows from an empty cache."""
    nll, n = 0.0, 0
    for s in range(0, len(tokens) - 1, window):
        w = tokens[s:s + window]
        if len(w) < 2:
            break
        logits = ReferenceModel(model, max_seq=window, kv_cache=kv_cache).prefill(w, every_row=True)[:-1]
        logits = logits.astype(np.float64)
        top = logits.max(axis=1)
        logz = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
        nll += float((logz - logits[np.arange(len(w) - 1), w[1:]]).sum())
        n += len(w) - 1
    return nll, n


def test_windows_score_as_the_references_rows_in_each_form():
    script = load_script()
    model = synthetic_model("qwen-tiny", seed=4)
    tokens = np.random.default_rng(0).integers(0, model.config.vocab, 150).tolist()  # windows of 64, 64, 22
    scores = {}
    for form in ("bf16", "q8_0"):
        with open_engine(model, "numpy", max_seq=64, kv_cache=form, speculate=0, environ={}) as engine:
            nll, n = script.score(engine, tokens, 64)
        want, want_n = reference_nll(model, tokens, 64, form)
        assert n == want_n == 147
        assert math.isclose(nll, want, rel_tol=1e-5), (form, nll, want)
        scores[form] = nll
    assert scores["bf16"] != scores["q8_0"]  # the form reached the cache
