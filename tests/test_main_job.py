"""The main job and the CLI on the CPU: the NumPy backend decodes, bad input is one line."""

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

import arcpy
from arcpy.cli import main as cli
from arcpy.engine import HOST, Engine
from arcpy.model import random_model, save_model, SHAPES, synthetic_model
from arcpy.reference import ReferenceModel
from arcpy.sampling import Sampling

CPU_ONLY = pytest.mark.skipif(arcpy.cuda_available(), reason="checks the CPU-only behaviour")


def decode(*args, env=None):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "arcpy.decode", *args], capture_output=True, text=True,
                          env=full_env, timeout=300)


def token_line(stdout):
    return [int(t) for t in stdout.splitlines()[1].split()]


@pytest.fixture(scope="module")
def stories():
    return synthetic_model("stories15M")


@CPU_ONLY
def test_main_job_decodes_on_a_cpu_only_machine(stories):
    out = decode("-n", "12", "--prompt", "1 2 3")
    assert out.returncode == 0, out.stderr
    assert token_line(out.stdout) == ReferenceModel(stories).greedy([1, 2, 3], 12)
    assert "path host, backend numpy" in out.stdout
    assert "NumPy reference backend, which is slow" in out.stderr


def test_help_lists_the_options():
    out = decode("--help")
    assert out.returncode == 0
    for option in ("--model", "--prompt", "--max-new-tokens", "--device-loop", "--burst", "--backend",
                   "--temperature", "--top-k", "--top-p", "--seed", "--stop-id", "--max-seq"):
        assert option in out.stdout


@pytest.mark.parametrize("args, env, message", [
    (["-n", "2"], {"ARC_GRAPH_DEVICE_LOOP": "maybe"}, "ARC_GRAPH_DEVICE_LOOP='maybe' is not understood"),
    (["-n", "2"], {"ARC_GRAPH_VERIFY_ALWAYS": "2"}, "ARC_GRAPH_VERIFY_ALWAYS='2' is not understood"),
    (["--model", "/nonexistent/model"], {}, "/nonexistent/model"),
    (["--prompt", "1 32000"], {}, "token id 32000 is outside the vocabulary"),
    (["--prompt", "1 x"], {}, "expected token ids"),
    (["--max-seq", "4", "--prompt", "1 2 3 4 5"], {}, "max_seq 4 leaves no room"),
])
def test_bad_input_is_one_clear_line_and_no_traceback(args, env, message):
    out = decode(*args, env=env)
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], out.stderr
    assert "Traceback" not in out.stderr


@CPU_ONLY
def test_asking_for_cuda_without_a_gpu_is_one_line():
    out = decode("--backend", "cuda", "-n", "2")
    assert out.returncode == 1
    assert out.stderr.strip().startswith("error: no CUDA device") and "\n" not in out.stderr.strip()


def test_main_job_reads_a_model_directory(tmp_path):
    cfg = SHAPES["qwen-tiny"]
    model = random_model(cfg, seed=5, name="tiny")
    save_model(model, tmp_path)
    out = decode("--model", str(tmp_path), "--backend", "numpy", "-n", "6", "--prompt", "4 5")
    assert out.returncode == 0, out.stderr
    assert token_line(out.stdout) == ReferenceModel(model).greedy([4, 5], 6)


def test_main_job_refuses_a_corrupt_weight_file(tmp_path):
    model = random_model(SHAPES["qwen-tiny"], seed=5, name="tiny")
    save_model(model, tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    out = decode("--model", str(tmp_path), "--backend", "numpy", "-n", "2")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "model.safetensors" in out.stderr


def test_engine_on_the_numpy_backend_matches_the_reference(stories):
    eng = Engine.load(stories, "numpy", max_seq=256, environ={})
    assert list(eng.generate([1, 2], 10)) == ReferenceModel(stories).greedy([1, 2], 10)
    assert eng.stats.path == HOST and eng.stats.host_waits == 10
    eng.start([1, 2], 3)
    assert [eng.step(), eng.step(), eng.step(), eng.step()][3] is None


def test_engine_sampling_is_seeded_on_the_numpy_backend(stories):
    eng = Engine.load(stories, "numpy", max_seq=64, environ={})
    s = Sampling(temperature=1.0, top_p=0.9, seed=42)
    assert list(eng.generate([1], 8, sampling=s)) == list(eng.generate([1], 8, sampling=s))


def test_cli_info_and_smoke():
    runner = CliRunner()
    info = runner.invoke(cli, ["info"])
    assert info.exit_code == 0 and "ABI version: 1" in info.output
    smoke = runner.invoke(cli, ["smoke", "-n", "6"])
    assert smoke.exit_code == 0, smoke.output
    assert "ok   numpy" in smoke.output and "6/6 tokens equal the reference" in smoke.output
