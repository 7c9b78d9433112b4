"""The main job and the CLI on the CPU: the NumPy backend decodes, bad input is one line."""

import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from arcpy.backends import open_engine
import arcpy
from arcpy.cli import main as cli
from arcpy.codes import ABI_VERSION
from arcpy.devices.reference import ReferenceModel
from arcpy.loop.engine import HOST
from arcpy.model import SHAPES, random_model, save_model, synthetic_model
from arcpy.sampling import Sampling

CPU_ONLY = pytest.mark.skipif(arcpy.cuda_available(), reason="checks the CPU-only behaviour")


def decode(*args, env=None):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "arcpy.decode", *args], capture_output=True, text=True,
                          env=full_env, timeout=300)


def token_line(stdout):
    return [int(t) for t in stdout.split()]


@pytest.fixture(scope="module")
def stories():
    return synthetic_model("stories15M")


@CPU_ONLY
def test_main_job_decodes_on_a_cpu_only_machine(stories):
    out = decode("--shape", "stories15M", "-n", "12", "--prompt-ids", "1 2 3")
    assert out.returncode == 0, out.stderr
    assert token_line(out.stdout) == ReferenceModel(stories).greedy([1, 2, 3], 12)
    assert "finished: token_budget; 12 tokens" in out.stderr and "path host, backend numpy" in out.stderr
    assert "NumPy reference backend, which is slow" in out.stderr


def test_bench_help_says_what_the_installed_command_does():
    """An installed arcpy has no scripts/ folder: the help describes the command itself."""
    r = CliRunner().invoke(cli, ["bench", "--help"])
    assert r.exit_code == 0 and "scripts/" not in r.output, r.output
    assert "host path against device loop" in r.output and "Needs a GPU" in r.output
    assert "bench" in CliRunner().invoke(cli, ["--help"]).output


def test_help_lists_the_options():
    out = decode("--help")
    assert out.returncode == 0
    for option in ("--model", "--shape", "--prompt", "--prompt-ids", "--chat", "--system", "--max-new-tokens",
                   "--device-loop", "--burst", "--backend", "--temperature", "--top-k", "--top-p", "--seed",
                   "--stop-id", "--stop", "--max-seq", "--version"):
        assert option in out.stdout


S = ["--shape", "stories15M"]


@pytest.mark.parametrize("args, env, message", [
    (S + ["-n", "2"], {"ARC_GRAPH_DEVICE_LOOP": "maybe"}, "ARC_GRAPH_DEVICE_LOOP='maybe' is not understood"),
    (S + ["-n", "2"], {"ARC_GRAPH_VERIFY_ALWAYS": "2"}, "ARC_GRAPH_VERIFY_ALWAYS='2' is not understood"),
    (["--model", "/nonexistent/model"], {}, "/nonexistent/model"),
    (S + ["--prompt-ids", "1 32000"], {}, "token id 32000 is outside the vocabulary"),
    (S + ["--prompt-ids", "1 x"], {}, "expected token ids"),
    (S + ["--max-seq", "4", "--prompt-ids", "1 2 3 4 5"], {}, "the context holds 4 positions and leaves no room to "
                                                              "generate: raise --max-seq (the model allows up to 1024)"),
    (S + ["-n", "2"], {"ARC_GRAPH": "2"}, "ARC_GRAPH='2' is not understood"),
    (S + ["-n", "2"], {"ARC_OFFLINE": "maybe"}, "ARC_OFFLINE='maybe' is not understood"),
    (S + ["-n", "2"], {"ARC_LIBRARY": ""}, "ARC_LIBRARY is set but empty"),
    (S + ["-n", "2"], {"ARC_LIBRARY": " "}, "ARC_LIBRARY is set but empty"),
    (S + ["-n", "2"], {"ARC_LIBRARY": "/nonexistent/libarc.so"}, "ARC_LIBRARY='/nonexistent/libarc.so': no such file"),
    (S + ["--temperature", "1e-320", "-n", "2"], {}, "temperature must be 0 (greedy) or in"),
    (S + ["--max-seq", "100000000"], {}, "--max-seq 100000000 exceeds the model's context of 1024"),
    (S + ["--prompt-ids", "1_0"], {}, "expected token ids"),
    (S + ["--prompt-ids", "\u0661\u0662"], {}, "expected token ids"),
    (["--model", ""], {}, "--model is empty"),
    (S + ["--prompt", "hello"], {}, "--prompt needs a model with a tokenizer"),
    (S + ["--prompt", "1", "--prompt-ids", "1"], {}, "give --prompt or --prompt-ids, not both"),
    (S + ["--model", "x"], {}, "give --model or --shape, not both"),
    (S + ["--system", "be brief", "--prompt-ids", "1"], {}, "--system needs --chat"),
])
def test_bad_input_is_one_clear_line_and_no_traceback(args, env, message):
    out = decode(*args, env=env)
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args", [["--seed", "-1", "--temperature", "1"], ["--top-p", "0"], ["-n", "-3"]])
def test_option_values_out_of_range_are_a_usage_error_not_a_traceback(args):
    out = decode(*args)
    assert out.returncode == 2 and "Error: Invalid value" in out.stderr
    assert "Traceback" not in out.stderr


def test_smoke_refuses_more_tokens_than_the_model_holds():
    result = CliRunner().invoke(cli, ["smoke", "-n", "2000"])
    assert result.exit_code == 2 and "2000 is not in the range" in result.output


def test_info_with_a_bad_arc_library_is_one_line_and_fails():
    result = CliRunner().invoke(cli, ["info"], env={"ARC_LIBRARY": "/nonexistent/libarc.so"})
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == ["error: ARC_LIBRARY='/nonexistent/libarc.so': no such file"]


@pytest.mark.parametrize("changes, expected", [
    ([("model.layers.1.mlp.down_proj.weight", (3, 7), 0x7FC0)],  # a bf16 NaN: refused at load
     "tensor 'model.layers.1.mlp.down_proj.weight' holds a NaN weight at [3, 7]"),
    # the largest finite bf16 in a final-norm weight: no trained model has one, refused at load
    ([("model.norm.weight", (5,), 0x7F7F)], "tensor 'model.norm.weight' holds a weight of 3.39e+38 at [5]"),
    # weights of 1e30 (as large as a model may hold) in the final norm and the lm_head: the logits overflow
    ([("model.norm.weight", slice(None), 0x7149), ("lm_head.weight", slice(None), 0x7149)],
     "position 1 gave non-finite logits"),
], ids=["nan", "too-large", "overflowing"])
@pytest.mark.parametrize("sampling", [[], ["--temperature", "1", "--seed", "7"]], ids=["greedy", "sampled"])
def test_a_bad_weight_is_one_error_line_not_tokens(tmp_path, sampling, changes, expected):
    model = random_model(SHAPES["qwen-tiny"], seed=5, name="tiny")
    for name, at, word in changes:
        model.tensors[name] = model.tensors[name].copy()
        model.tensors[name][at] = word
    save_model(model, tmp_path)
    out = decode("--model", str(tmp_path), "--backend", "numpy", "--prompt-ids", "1 2", "-n", "4", *sampling)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], out.stderr


@CPU_ONLY
def test_asking_for_cuda_without_a_gpu_is_one_line():
    out = decode("--shape", "stories15M", "--backend", "cuda", "-n", "2")
    assert out.returncode == 1
    assert out.stderr.strip().startswith("error: no CUDA device") and "\n" not in out.stderr.strip()


def test_main_job_reads_a_model_directory(tmp_path):
    cfg = SHAPES["qwen-tiny"]
    model = random_model(cfg, seed=5, name="tiny")
    save_model(model, tmp_path)
    out = decode("--model", str(tmp_path), "--backend", "numpy", "-n", "6", "--prompt-ids", "4 5")
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
    eng = open_engine(stories, "numpy", max_seq=256, environ={})
    assert list(eng.generate([1, 2], 10)) == ReferenceModel(stories).greedy([1, 2], 10)
    assert eng.stats.path == HOST and eng.stats.host_waits == 10
    eng.start([1, 2], 3)
    assert [eng.step(), eng.step(), eng.step(), eng.step()][3] is None


def test_engine_sampling_is_seeded_on_the_numpy_backend(stories):
    eng = open_engine(stories, "numpy", max_seq=64, environ={})
    s = Sampling(temperature=1.0, top_p=0.9, seed=42)
    assert list(eng.generate([1], 8, sampling=s)) == list(eng.generate([1], 8, sampling=s))


def test_cli_info_and_smoke():
    runner = CliRunner()
    info = runner.invoke(cli, ["info"])
    assert info.exit_code == 0 and f"ABI version: {ABI_VERSION}" in info.output
    smoke = runner.invoke(cli, ["smoke", "-n", "6"])
    assert smoke.exit_code == 0, smoke.output
    assert "ok   numpy" in smoke.output and "6/6 tokens equal the reference" in smoke.output


def test_a_sampled_run_without_a_seed_reports_the_one_that_repeats_it():
    args = S + ["--backend", "numpy", "-n", "6", "--prompt-ids", "1 2 3", "--temperature", "1"]
    first = decode(*args)
    assert first.returncode == 0, first.stderr
    seed = int(re.search(r"; seed (\d+)", first.stderr).group(1))
    again = decode(*args, "--seed", str(seed))
    assert token_line(again.stdout) == token_line(first.stdout) and f"; seed {seed}" in again.stderr
    assert "; seed" not in decode(*S, "--backend", "numpy", "-n", "2", "--prompt-ids", "1 2").stderr


def test_logprobs_option_prints_each_tokens_log_probability(stories):
    out = decode("--shape", "stories15M", "-n", "5", "--prompt-ids", "1 2 3", "--logprobs", "3", "--backend", "numpy")
    assert out.returncode == 0, out.stderr
    lines = [line.split() for line in out.stderr.splitlines() if line.startswith("logprob ")]
    tokens = token_line(out.stdout)
    assert [int(parts[1]) for parts in lines] == tokens and len(tokens) == 5
    for parts in lines:
        value = float(parts[2])
        alternatives = " ".join(parts[3:]).strip("[]").split(", ")
        assert value <= 0 and len(alternatives) == 3
        assert alternatives[0].split()[0] == parts[1]  # greedy: the token is the likeliest
    bad = decode("--shape", "stories15M", "--logprobs", "21")
    assert bad.returncode != 0 and "--logprobs" in bad.stderr
