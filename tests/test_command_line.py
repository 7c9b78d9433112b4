"""The command line as a new user meets it: the prompt from stdin, every argument checked before the
model loads, one line per mistake, the statistics on Ctrl-C, stop ids kept out of the output."""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from arcpy.backends import open_engine
from arcpy.decode import read_prompt
from arcpy.model import SHAPES, random_model, save_model

WORDS = ["?", "hello", "there", "general", "kenobi", "END"] + [f"w{i}" for i in range(58)]


def decode(*args, env=None, stdin=subprocess.DEVNULL, timeout=300):
    return subprocess.run([sys.executable, "-m", "arcpy.decode", *args], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), stdin=stdin, timeout=timeout)


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """A tiny model directory with a word-level tokenizer.json and a chat template."""
    d = tmp_path_factory.mktemp("text-model")
    cfg = SHAPES["qwen-tiny"]
    save_model(random_model(cfg, seed=5, name="tiny"), d)
    vocab = {w: i for i, w in enumerate(WORDS)}
    vocab.update({f"x{i}": i for i in range(len(WORDS), cfg.vocab)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens(["END"])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "END", "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}))
    return d


def prompt_tokens(stderr: str) -> int:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("model "))
    return int(line.split("prompt ")[1].split()[0])


def test_prompt_dash_reads_standard_input(text_model):
    out = subprocess.run([sys.executable, "-m", "arcpy.decode", "--model", str(text_model), "--backend", "numpy",
                          "--prompt", "-", "-n", "2"], input="hello there general", capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert prompt_tokens(out.stderr) == 3  # the three words, not the one character "-"


def test_a_piped_prompt_is_read_without_the_option(text_model):
    out = subprocess.run([sys.executable, "-m", "arcpy.decode", "--model", str(text_model), "--backend", "numpy",
                          "-n", "2"], input="hello there general kenobi", capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert prompt_tokens(out.stderr) == 4 and "question:" not in out.stderr


class _Terminal:
    def isatty(self):
        return True

    def read(self):
        raise AssertionError("a terminal is not read without --prompt -")


def test_a_terminal_is_never_read_and_the_built_in_question_is_shown(text_model):
    assert read_prompt(None, None, _Terminal()) is None
    out = decode("--model", str(text_model), "--backend", "numpy", "--chat", "-n", "2")
    assert out.returncode == 0, out.stderr
    assert "question: What is the capital of France?" in out.stderr


@pytest.mark.parametrize("args, message", [
    (["--stop", ""], "a stop string must be a non-empty string"),
    (["--temperature", "1", "--top-p", "0"], "top-p"),
    (["--prompt-ids", "1 " + "9" * 5000], "is too large (at most 2147483647)"),
    (["--model", "/nonexistent/model.gguf"], "/nonexistent/model.gguf: no such file or directory"),
    (["--speculate", "8"], "--speculate"),
    (["--speculate", "-1"], "--speculate"),
    (["--speculate", "3", "--no-speculate"], "--speculate and --no-speculate contradict each other"),
])
def test_every_argument_is_checked_before_the_model_loads(text_model, args, message):
    model = [] if "--model" in args else ["--model", str(text_model)]
    out = decode(*model, "--backend", "numpy", *args)
    assert out.returncode in (1, 2), out.stderr
    assert "Traceback" not in out.stderr and "loaded " not in out.stderr, out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith(("error:", "Error:"))]
    assert len(errors) == 1 and message in out.stderr, out.stderr


def test_speculate_on_a_backend_without_a_device_loop_decodes_plainly_and_says_so():
    out = decode("--shape", "stories15M", "--prompt-ids", "1 2 3", "-n", "4", "--speculate", "7", "--backend", "numpy")
    assert out.returncode == 0, out.stderr
    plain = decode("--shape", "stories15M", "--prompt-ids", "1 2 3", "-n", "4", "--backend", "numpy")
    assert out.stdout == plain.stdout and out.stdout.strip()
    assert "--speculate 7 has no effect: the numpy backend has no device loop" in out.stderr


def test_speculation_is_on_by_default_and_silent_where_the_backend_cannot_run_it():
    out = decode("--shape", "stories15M", "--prompt-ids", "1 2 3", "-n", "4", "--backend", "numpy")
    assert out.returncode == 0, out.stderr
    assert "speculate" not in out.stderr, out.stderr


def test_a_seed_without_temperature_gets_a_note():
    out = decode("--shape", "stories15M", "--prompt-ids", "1", "-n", "2", "--seed", "3", "--backend", "numpy")
    assert out.returncode == 0, out.stderr
    assert "--seed has no effect without --temperature" in out.stderr


def test_a_prompt_longer_than_the_context_names_max_seq_and_the_model_s_limit():
    out = decode("--shape", "stories15M", "--prompt-ids", " ".join(["5"] * 40), "--max-seq", "32", "--backend",
                 "numpy")
    assert out.returncode == 1
    assert "the prompt has 40 tokens, but the context holds 32 positions" in out.stderr
    assert "raise --max-seq (the model allows up to 1024)" in out.stderr


def test_a_prompt_longer_than_the_model_s_own_context_is_told_to_be_shorter():
    out = decode("--shape", "stories15M", "--prompt-ids", " ".join(["5"] * 1100), "--max-seq", "32", "--backend",
                 "numpy")
    assert out.returncode == 1
    assert out.stderr.strip().endswith("the prompt has 1100 tokens, but the context holds 32 positions and leaves no "
                                       "room to generate: shorten the prompt (the model's own context is 1024 "
                                       "positions)"), out.stderr
    assert "raise --max-seq" not in out.stderr


def test_invalid_utf8_in_the_prompt_points_into_the_prompt(text_model):
    out = subprocess.run([sys.executable, "-m", "arcpy.decode", "--model", str(text_model), "--backend", "numpy",
                          "--chat", "--prompt", b"hello \xff there".decode("utf-8", "surrogateescape")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert "the user message is not valid UTF-8: character 6" in out.stderr and "'hello '" in out.stderr


def first_new(items, start=2):
    return next(i for i in range(start, len(items)) if items[i] not in items[:i])


def test_a_stop_id_never_reaches_the_output_in_id_mode(tmp_path):
    save_model(random_model(SHAPES["qwen-tiny"], seed=5, name="tiny"), tmp_path)  # no tokenizer: ids out
    args = ["--model", str(tmp_path), "--backend", "numpy", "--prompt-ids", "1 2", "-n", "8"]
    ids = [int(t) for t in decode(*args).stdout.split()]
    assert len(ids) == 8
    k = first_new(ids)
    out = decode(*args, "--stop-id", str(ids[k]))
    assert [int(t) for t in out.stdout.split()] == ids[:k]
    assert f"finished: stop_id; {k} tokens" in out.stderr


def test_a_stop_id_never_reaches_the_output_in_text_mode(text_model):
    args = ["--model", str(text_model), "--backend", "numpy", "--prompt", "hello", "-n", "8"]
    words = decode(*args).stdout.split()
    assert len(words) == 8
    k = first_new(words)
    vocab = json.loads((text_model / "tokenizer.json").read_text())["model"]["vocab"]
    out = decode(*args, "--stop-id", str(vocab[words[k]]))
    assert out.stdout.split() == words[:k], out.stderr


def installed_script(name):
    """The console script that the environment under test installed: beside its interpreter, not
    whatever PATH finds (a virtual environment used without activating it is not on PATH)."""
    found = shutil.which(name, path=sysconfig.get_path("scripts"))
    assert found, f"no {name} script in {sysconfig.get_path('scripts')}: is arcpy installed in this environment?"
    return found


def test_arcpy_without_arguments_shows_help_and_succeeds():
    for cmd in ([installed_script("arcpy")], [sys.executable, "-m", "arcpy"]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "Commands:" in out.stdout and "generate" in out.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT")
def test_ctrl_c_prints_the_statistics_so_far():
    proc = subprocess.Popen([sys.executable, "-m", "arcpy.decode", "--shape", "stories110M", "--backend", "numpy",
                             "--prompt-ids", "1", "-n", "4000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # Wait for the first tokens, then interrupt as a terminal would.
    deadline = time.monotonic() + 120
    first = proc.stdout.read(4)
    assert first and time.monotonic() < deadline
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "finished: interrupted;" in err and "tokens" in err and "Traceback" not in err


def test_decode_chat_and_serve_take_their_sampling_as_one_record():
    import dataclasses
    import inspect

    from arcpy import decode as decode_module, terminal_chat
    from arcpy.serve import command
    for f, record in ((decode_module.plan, decode_module.DecodeOptions), (terminal_chat.run, terminal_chat.ChatOptions),
                      (command.run, command.ServeOptions)):
        assert list(inspect.signature(f).parameters)[0] == "options", f
        names = {field.name for field in dataclasses.fields(record)}
        assert "sampling_opts" in names and not {"temperature", "top_k", "top_p", "seed"} & names, f


@pytest.mark.parametrize("temperature", ["1e-9", "2000000"])
def test_a_temperature_the_sampler_refuses_is_one_line(temperature):
    out = decode("--shape", "stories15M", "--prompt-ids", "1", "-n", "2", "--temperature", temperature, "--backend",
                 "numpy")
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "temperature must be 0 (greedy) or in [1e-06, 1e+06]" in out.stderr


class _TerminalText(io.StringIO):
    def isatty(self):
        return True


def test_a_long_prefill_on_the_cpu_reports_its_chunks_on_a_terminal_only():
    from arcpy.devices.numpy_device import PREFILL_CHUNK
    from arcpy.model import synthetic_model
    from arcpy.options import PrefillProgress

    prompt = [5] * (3 * PREFILL_CHUNK + 8)  # four chunks
    seen, terminal, pipe = [], _TerminalText(), io.StringIO()
    with open_engine(synthetic_model("stories15M"), "numpy",
                     prefill_progress=lambda *a: (seen.append(a), PrefillProgress(terminal)(*a),
                                                  PrefillProgress(pipe)(*a))) as engine:
        want = list(engine.generate(prompt, 2))
    assert seen == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    assert terminal.getvalue() == "".join(f"\rprefill: {k}/4 chunks" for k in range(4)) + "\r\033[K"
    assert pipe.getvalue() == ""
    with open_engine(synthetic_model("stories15M"), "numpy") as engine:
        assert list(engine.generate(prompt, 2)) == want  # the same tokens, told or not


def test_the_main_job_shows_the_prefill_on_a_terminal_and_not_in_a_pipe():
    pexpect = pytest.importorskip("pexpect")
    args = ["-m", "arcpy.decode", "--shape", "stories15M", "--prompt-ids", " ".join(["5"] * 200), "-n", "1",
            "--backend", "numpy"]
    child = pexpect.spawn(sys.executable, args, encoding="utf-8", timeout=300)
    child.expect("prefill: 3/4 chunks")
    child.expect(pexpect.EOF)
    piped = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0 and "prefill" not in piped.stderr, piped.stderr
