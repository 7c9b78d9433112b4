"""scripts/server_overhead.py and scripts/load_test.py run, on the NumPy backend with a tiny model, and
report what they promise (their figures are the GPU's business; here: that they work)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import make_text_model, server_env

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import load_test  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    words = {w for p in load_test.PROMPTS for w in p.split()}
    return make_text_model(tmp_path_factory.mktemp("scripts") / "tiny", words=sorted(words))


def script(name, *args, timeout=600):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True,
                          env=server_env(), timeout=timeout)


def test_server_overhead_measures_the_three_targets(model_dir, tmp_path):
    out = script("server_overhead.py", "--model", str(model_dir), "--backend", "numpy", "--tokens", "16", "--runs", "2",
                 "--json", str(tmp_path / "bench.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["same_text"] and report["backend"] == "numpy" and report["device"].startswith("CPU")
    assert report["decode"]["engine_tokens_per_s"] > 0 and report["decode"]["server_tokens_per_s"] > 0
    assert report["time_to_first_token"]["server_ms"] > 0 and report["cancel"]["hang_up_to_next_first_token_ms"] > 0
    assert len(report["samples"]["hang_up_to_next_first_token_ms"]) == 2


def test_load_test_checks_every_answer_against_the_answer_alone(model_dir, tmp_path):
    out = script("load_test.py", "--model", str(model_dir), "--backend", "numpy", "--clients", "4", "--requests", "4",
                 "--rounds", "2", "--max-tokens", "12", "--hang-up", "0.3", "--json", str(tmp_path / "load.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "load.json").read_text())
    assert report["passed"] and report["checks"]["answers_equal_alone"] and report["checks"]["rss_does_not_grow"]
    assert report["distinct_answers_alone"] > 1  # a mix-up between requests would show
    assert sum(r["completed"] for r in report["results"]) > 0 and sum(r["hung_up"] for r in report["results"]) > 0
    assert all(r["requests"] == 16 for r in report["results"])


def test_load_test_multi_turn_reports_the_cache_and_equal_answers(model_dir, tmp_path):
    out = script("load_test.py", "--model", str(model_dir), "--backend", "numpy", "--turns", "3",
                 "--conversations", "2", "--history-words", "80", "--max-tokens", "6",
                 "--json", str(tmp_path / "turns.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "turns.json").read_text())
    assert report["passed"] and report["same_answers"] and report["mode"] == "multi-turn"
    assert 0 < report["hit_rate"] < 1 and report["cold_cached_tokens"] == 0
    assert [t["turn"] for t in report["turns"]] == [1, 2, 3]
    assert all(t["ttft_cached"]["count"] == 2 == t["ttft_cold"]["count"] for t in report["turns"])
