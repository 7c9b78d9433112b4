"""GPU tier: constrained answers on the GPU (marker `gpu`). The answer's mask is applied in the
device loop (libarc/mask.cu): each step waits on the device for the mask the host writes as the
token before it lands, with no host wait a token. Every answer parses and validates; the rate
against the unconstrained device loop is measured on the demo model (printed, for docs/PERF.md)."""

from __future__ import annotations

import json
import time

import pytest

jsonschema = pytest.importorskip("jsonschema")  # the `test` extra's: the judge
pytest.importorskip("llguidance")

from agent_helpers import QWEN3  # noqa: E402
from test_constrained import SCHEMAS, fmt  # noqa: E402

from arcpy import load_checkpoint  # noqa: E402
from arcpy.backends import open_engine
from arcpy.demo import demo_model_path  # noqa: E402
from arcpy.loop.request import Request  # noqa: E402
from arcpy.sampling import Sampling  # noqa: E402

pytestmark = pytest.mark.gpu


def test_constrained_answers_validate_on_the_gpu():
    model, text = load_checkpoint(QWEN3)
    cut = []
    with open_engine(model, "cuda", text=text, max_seq=256) as engine:
        for i in range(200):
            schema = SCHEMAS[i % len(SCHEMAS)]
            r = Request(messages=[{"role": "user", "content": "Hi"}], max_new_tokens=220,
                        sampling=Sampling(temperature=1.0, seed=i), response_format=fmt(schema))
            out = "".join(engine.chat(r))
            assert engine.stats.path == "device-loop" and engine.stats.host_waits == 0  # the mask on the device
            if engine.stats.finish_reason == "token_budget":
                # A schema's number may take any count of digits: a random model can draw digits
                # past any budget (seed 193 did at 220 tokens). What it wrote the grammar allowed.
                cut.append(i)
                continue
            assert engine.stats.finish_reason == "stop_id", (i, out)
            jsonschema.validate(json.loads(out), schema)
        print(f"constrained answers cut by the budget of 220: {len(cut)} of 200 {cut}")
        assert len(cut) <= 2, cut
        # Greedy and constrained: the argmax over what the grammar allows.
        r = Request(messages=[{"role": "user", "content": "Hi"}], max_new_tokens=40,
                    response_format=fmt({"enum": ["alpha", "beta"]}))
        assert "".join(engine.chat(r)) in ('"alpha"', '"beta"')


@pytest.mark.skipif(demo_model_path() is None, reason="the demo model is not fetched (python -m arcpy.demo)")
def test_the_rate_under_a_schema_against_the_device_loop():
    model, text = load_checkpoint(demo_model_path())
    schema = {"type": "array", "minItems": 200, "maxItems": 200, "items": {"type": "integer", "minimum": 0,
                                                                            "maximum": 9}}
    ask = [{"role": "user", "content": "List two hundred numbers from 0 to 9, separated by commas."}]
    with open_engine(model, "cuda", text=text, burst=16) as engine:
        rates = {}
        runs = (("device loop, unconstrained", {}), ("device loop, schema", {"response_format": fmt(schema)}))
        for name, extra in runs:
            best = 0.0
            for seed in range(3):
                r = Request(messages=ask, max_new_tokens=700, sampling=Sampling(temperature=0.8, seed=seed), **extra)
                stamps, texts = [], []
                for piece in engine.stream(r):
                    texts.append(piece.text)
                    if piece.token is not None:
                        stamps.append(time.perf_counter())
                if extra:
                    jsonschema.validate(json.loads("".join(texts)), schema)
                    assert engine.stats.path == "device-loop" and engine.stats.host_waits == 0  # the mask on the device
                if len(stamps) > 8:  # a sampled free answer may end at once; the rate needs a run of tokens
                    best = max(best, (len(stamps) - 1) / (stamps[-1] - stamps[0]))
            assert best > 0, f"{name}: no answer of more than 8 tokens in 3 seeds"
            rates[name] = best
        print(json.dumps({"demo model tok/s": rates,
                          "share": rates["device loop, schema"] / rates["device loop, unconstrained"]}))
        assert rates["device loop, schema"] > 0
