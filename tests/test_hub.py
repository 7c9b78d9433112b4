"""Models by name on the Hugging Face hub (arcpy/model/hub.py): names parsed, a GGUF file picked
by its quantization, resolved from a cache in the hub's own layout with the hub offline, fetched
from a stand-in hub on 127.0.0.1 (tests/hub_cache.py), and the front ends that take --model. No
test reaches the network."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hub_cache import FAMILY, HF_FILES, FakeHub, cache_repo, commit_of, gguf_repo, hf_repo

from arcpy.bench.http_client import ServerProcess, get
from arcpy.errors import ModelFileError
from arcpy.loading import load_checkpoint
from arcpy.model.hub import HubName, parse_name, pick_gguf, resolve_model, resolve_name

PROMPT = ["--prompt-ids", "5 6 7", "-n", "6", "--backend", "numpy"]


def hub_env(tmp_path: Path, **extra) -> dict:
    """The environment of a command run against the cache in tmp_path/hub: huggingface_hub's own
    variables, its home in tmp_path too, and offline unless `extra` says otherwise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "ARC_OFFLINE"))}
    path = [str(Path(__file__).resolve().parent.parent), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1",
               HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=os.pathsep.join(p for p in path if p))
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def arcpy(*args, env, module="arcpy", stdin=None, timeout=180):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          input=stdin, timeout=timeout)


def one_line_error(out, status=1) -> str:
    assert out.returncode == status, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out.stderr
    return errors[0]


def tokens(out) -> str:
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


# ---------------------------------------------------------------------------------------------
# names


@pytest.mark.parametrize("text, name", [
    ("org/name", HubName("org/name")),
    ("Qwen/Qwen3-0.6B", HubName("Qwen/Qwen3-0.6B")),
    ("org/name-GGUF:Q4_K_M", HubName("org/name-GGUF", quant="Q4_K_M")),
    ("org/name-GGUF/model-Q8_0.gguf", HubName("org/name-GGUF", file="model-Q8_0.gguf")),
    ("org/name-GGUF/Q4_K_M/model.gguf", HubName("org/name-GGUF", file="Q4_K_M/model.gguf")),
    ("name", None), ("/abs/path", None), ("./org/name", None), ("~/org/name", None), ("org/name/", None),
    ("org/name/config.json", None), ("org/name:", None), ("org/name:Q4 K", None), ("org//name", None),
    ("org/na..me", None), ("org/na--me", None), ("-org/name", None), ("a/b/c", None), ("org/name:Q4/x.gguf", None),
])
def test_names_of_the_hub_parse_and_nothing_else_does(text, name):
    assert parse_name(text) == name
    if name is not None:
        assert str(name) == text


def test_a_quantization_is_picked_as_a_whole_word_of_the_file_name():
    files = ["m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "m.Q8_0.gguf", "m-q6_k.gguf", "README.md", "mmproj-m-f16.gguf"]
    assert pick_gguf(files, "r", "Q4_K_M") == "m-Q4_K_M.gguf"
    assert pick_gguf(files, "r", "q8_0") == "m.Q8_0.gguf"
    assert pick_gguf(files, "r", "Q6_K") == "m-q6_k.gguf"
    with pytest.raises(ModelFileError, match=r"r has no \.gguf file of Q4_K; it has m-Q4_K_M\.gguf, m-Q4_K_S"):
        pick_gguf(files, "r", "Q4_K")  # a prefix of two quantizations is neither
    with pytest.raises(ModelFileError, match=r"r has 3 \.gguf files of Q5_0 \(a-Q5_0\.gguf, b-Q5_0"):
        pick_gguf(["a-Q5_0.gguf", "b-Q5_0.gguf", "c-Q5_0-00001-of-00002.gguf"], "r", "Q5_0")
    with pytest.raises(ModelFileError, match=r"r has 4 \.gguf files: name one with :QUANT or /FILE\.gguf"):
        pick_gguf(files, "r")  # the projector is no model to pick
    assert pick_gguf(["m-Q8_0.gguf", "mmproj-m-f16.gguf"], "r") == "m-Q8_0.gguf"
    assert pick_gguf(["config.json"], "r") is None
    with pytest.raises(ModelFileError, match=r"r has no \.gguf file: :Q8_0 picks one"):
        pick_gguf(["config.json"], "r", "Q8_0")


# ---------------------------------------------------------------------------------------------
# from the cache, offline


def test_names_resolve_from_the_cache_alone(tmp_path):
    cache = tmp_path / "hub"
    hf = hf_repo(cache)
    ggufs = gguf_repo(cache)
    one = gguf_repo(cache, "tiny/qwen3-one-GGUF", quants=("Q8_0",))
    tagged = hf_repo(cache, "tiny/qwen3", revision="v1")
    # At tag v1 the GGUF repository held one file: the name alone picks it there, not at main.
    v1 = cache_repo(cache, "tiny/qwen3-GGUF", {"qwen3-Q8_0.gguf": FAMILY / "model-q8_0.gguf"}, revision="v1")

    def resolve(name, revision=None):
        return resolve_name(parse_name(name), revision, "offline for the test", str(cache))

    assert resolve("tiny/qwen3").path == str(hf)
    assert resolve("tiny/qwen3", "v1").path == str(tagged) != str(hf)
    assert resolve("tiny/qwen3-GGUF:Q8_0").path == str(ggufs / "qwen3-Q8_0.gguf")
    assert resolve("tiny/qwen3-GGUF:bf16").path == str(ggufs / "qwen3-BF16.gguf")
    assert resolve("tiny/qwen3-GGUF/qwen3-BF16.gguf").path == str(ggufs / "qwen3-BF16.gguf")
    assert resolve("tiny/qwen3-one-GGUF").path == str(one / "qwen3-Q8_0.gguf")
    assert resolve("tiny/qwen3-GGUF", "v1").path == str(v1 / "qwen3-Q8_0.gguf")
    assert resolve("tiny/qwen3-GGUF", commit_of("tiny/qwen3-GGUF", "v1")).path == str(v1 / "qwen3-Q8_0.gguf")
    assert resolve("tiny/qwen3-one-GGUF").name == "tiny/qwen3-one-GGUF"
    assert resolve("tiny/qwen3").note is None
    model, text = load_checkpoint(resolve("tiny/qwen3-GGUF:Q8_0").path)
    assert model.config.vocab == 288 and text is not None


@pytest.mark.parametrize("name, revision, message", [
    ("tiny/qwen3-GGUF", None, "tiny/qwen3-GGUF in the cache has 2 .gguf files: name one with :QUANT or /FILE.gguf "
                              "(qwen3-BF16.gguf, qwen3-Q8_0.gguf)"),
    ("tiny/qwen3-GGUF:Q4_K_M", None, "tiny/qwen3-GGUF in the cache has no .gguf file of Q4_K_M; it has "
                                     "qwen3-BF16.gguf, qwen3-Q8_0.gguf"),
    ("tiny/qwen3-GGUF/nope.gguf", None, "tiny/qwen3-GGUF in the cache has no file 'nope.gguf'; its .gguf files: "
                                        "qwen3-BF16.gguf, qwen3-Q8_0.gguf"),
    ("tiny/qwen3:Q8_0", None, "tiny/qwen3 in the cache has no .gguf file: :Q8_0 picks one of a GGUF repository"),
    ("tiny/absent", None, "tiny/absent is not in the Hugging Face cache ({cache}) and offline for the test: fetch it "
                          "with the network first (arcpy pull tiny/absent)"),
    ("tiny/qwen3", "v2", "tiny/qwen3 (revision v2) is not in the Hugging Face cache ({cache}) and offline for the "
                         "test: fetch it with the network first (arcpy pull tiny/qwen3 --revision v2)"),
    ("tiny/readme", None, "tiny/readme in the cache has neither config.json nor a .gguf file: not a model arcpy reads"),
    ("tiny/pickle", None, "tiny/pickle in the cache has config.json but no model.safetensors or "
                          "model.safetensors.index.json (its files: bin): arcpy reads safetensors weights"),
    ("tiny/qwen3", " ", "revision ' ' is not a branch, tag or commit"),
])
def test_what_the_cache_cannot_answer_is_one_line(tmp_path, name, revision, message):
    cache = tmp_path / "hub"
    hf_repo(cache)
    gguf_repo(cache)
    readme = tmp_path / "README.md"
    readme.write_text("a model card\n")
    cache_repo(cache, "tiny/readme", {"README.md": readme})
    cache_repo(cache, "tiny/pickle", {"config.json": FAMILY / "config.json", "pytorch_model.bin": readme})
    with pytest.raises(ModelFileError) as err:
        resolve_name(parse_name(name), revision, "offline for the test", str(cache))
    assert str(err.value) == message.format(cache=cache)


def test_a_path_here_is_never_looked_up(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("org/name").path == "org/name"  # a folder here wins over the name
    assert resolve_model("org/name").name is None
    with pytest.raises(ModelFileError, match="a revision .v1. is for a model of the hub; org/name is a path here"):
        resolve_model("org/name", "v1")
    with pytest.raises(ModelFileError, match=r"^\./nothing: no such file or directory$"):
        resolve_model("./nothing")


# ---------------------------------------------------------------------------------------------
# a folder holding one .gguf file


def test_a_folder_holding_one_gguf_file_loads_it(tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(FAMILY / "model-q8_0.gguf", one)
    (one / "mmproj-f16.gguf").write_bytes(b"not read")  # a projector is no model
    by_folder, _ = load_checkpoint(one)
    by_file, _ = load_checkpoint(one / "model-q8_0.gguf")
    assert by_folder.name == by_file.name == "model-q8_0"
    shutil.copy(FAMILY / "model.gguf", one)
    with pytest.raises(ModelFileError, match=r"one has 2 \.gguf files: name the file \(model-q8_0\.gguf, model\.gguf\)$"):
        load_checkpoint(one)
    (one / "config.json").write_text("{}")  # a Hugging Face directory is read as one, whatever else it holds
    with pytest.raises(ModelFileError, match="config.json"):
        load_checkpoint(one)


# ---------------------------------------------------------------------------------------------
# the front ends


def test_the_main_job_decodes_a_model_named_on_the_hub_as_it_decodes_its_files(tmp_path):
    hf_repo(tmp_path / "hub")
    gguf_repo(tmp_path / "hub")
    env = hub_env(tmp_path)
    want = tokens(arcpy("--model", str(FAMILY), *PROMPT, env=env, module="arcpy.decode"))
    assert tokens(arcpy("--model", "tiny/qwen3", *PROMPT, env=env, module="arcpy.decode")) == want
    out = arcpy("generate", "--model", "tiny/qwen3-GGUF:BF16", *PROMPT, env=env)
    assert tokens(out) == want  # the GGUF file holds the same bf16 weights
    assert "model tiny/qwen3-GGUF:BF16: 2 layers" in out.stderr
    # Offline and absent from the cache: one line, and the way to fetch it.
    line = one_line_error(arcpy("--model", "tiny/other", *PROMPT, env=env, module="arcpy.decode"))
    assert line.endswith("HF_HUB_OFFLINE is on: fetch it with the network first (arcpy pull tiny/other)")
    # ARC_OFFLINE keeps the hub out too.
    line = one_line_error(arcpy("--model", "tiny/other", *PROMPT, env=hub_env(tmp_path, HF_HUB_OFFLINE=None,
                                                                              ARC_OFFLINE="1"), module="arcpy.decode"))
    assert "ARC_OFFLINE is on" in line


@pytest.mark.parametrize("args, message", [
    (["--model", "nothing-here"], "--model nothing-here: no such file or directory, nor a name org/name"),
    (["--model", "/no/such/dir"], "--model /no/such/dir: no such file or directory"),
    (["--revision", "v1"], "--revision is for a --model named on the hub (org/name)"),
    (["--model", str(FAMILY), "--revision", "v1"], f"--revision is for a --model named on the hub (org/name); {FAMILY} "
                                                  "is a path here"),
])
def test_a_model_neither_here_nor_a_name_is_a_usage_error(tmp_path, args, message):
    out = arcpy(*args, *PROMPT, env=hub_env(tmp_path), module="arcpy.decode")
    assert one_line_error(out, 2).startswith(f"error: {message}")


def test_chat_and_serve_take_a_name_of_the_hub(tmp_path):
    hf_repo(tmp_path / "hub")
    env = hub_env(tmp_path)
    with ServerProcess(["--model", "tiny/qwen3", "--backend", "numpy"], env=env) as server:
        status, body = get(server.url + "/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["tiny/qwen3"]
    out = arcpy("chat", "--model", "tiny/qwen3", "-n", "3", "--backend", "numpy", env=env, stdin="hello\n")
    assert out.returncode == 0 and "chat with tiny/qwen3 (backend numpy)" in out.stderr, out.stderr
    line = one_line_error(arcpy("chat", "--model", "tiny/qwen3", "--revision", "v9", env=env, stdin=""))
    assert line.endswith("(arcpy pull tiny/qwen3 --revision v9)")
    line = one_line_error(arcpy("serve", "--model", "tiny/absent", "--port", "0", "--backend", "numpy", env=env))
    assert "tiny/absent is not in the Hugging Face cache" in line
    assert one_line_error(arcpy("serve", "--model", "nothing-here", env=env), 2).startswith(
        "error: --model nothing-here: no such file or directory")


# ---------------------------------------------------------------------------------------------
# from a hub: arcpy pull


def fixture_repos() -> dict:
    hf = {n: (FAMILY / n).read_bytes() for n in HF_FILES}
    return {"tiny/qwen3": {**hf, "pytorch_model.bin": b"never fetched", "README.md": b"card"},
            "tiny/qwen3-GGUF": {"qwen3-Q8_0.gguf": (FAMILY / "model-q8_0.gguf").read_bytes(),
                                "qwen3-BF16.gguf": (FAMILY / "model.gguf").read_bytes()},
            "tiny/gated": hf}


def test_pull_fetches_only_what_arcpy_reads_and_offline_runs_find_it(tmp_path):
    with FakeHub(fixture_repos(), gated={"tiny/gated"}) as hub:
        env = hub_env(tmp_path, HF_HUB_OFFLINE=None, HF_ENDPOINT=hub.url, HF_TOKEN="hf_test_token")
        out = arcpy("pull", "tiny/qwen3", env=env)
        assert out.returncode == 0, out.stderr
        folder = Path(out.stdout.strip())
        assert sorted(p.name for p in folder.iterdir()) == sorted(HF_FILES)  # no pickle, no card
        assert (folder / "model.safetensors").read_bytes() == (FAMILY / "model.safetensors").read_bytes()
        gguf = Path(tokens(arcpy("pull", "tiny/qwen3-GGUF:Q8_0", env=env)))
        assert gguf.name == "qwen3-Q8_0.gguf" and not (gguf.parent / "qwen3-BF16.gguf").exists()
        # Every request of the hub carried the token of HF_TOKEN.
        asked = [r for r in hub.requests if r[1].startswith(("/api/models/", "/tiny/"))]
        assert asked and all(auth == "Bearer hf_test_token" for _, _, auth in asked)
        # The hub's answers, one line each.
        assert one_line_error(arcpy("pull", "tiny/absent", env=env)) == (
            f"error: tiny/absent: no such model repository on the hub at {hub.url} (a private one needs a token: "
            "HF_TOKEN)")
        assert one_line_error(arcpy("pull", "tiny/gated", env=env)).startswith(
            "error: tiny/gated is gated: accept its terms on the hub")
        assert one_line_error(arcpy("pull", "tiny/qwen3-GGUF", env=env)) == (
            "error: tiny/qwen3-GGUF has 2 .gguf files: name one with :QUANT or /FILE.gguf (qwen3-BF16.gguf, "
            "qwen3-Q8_0.gguf)")
        assert one_line_error(arcpy("pull", "not a name", env=env), 2).startswith("error: not a name: not a name org/")
    offline = hub_env(tmp_path)
    assert tokens(arcpy("pull", "tiny/qwen3", env=offline)) == str(folder)
    assert tokens(arcpy("--model", "tiny/qwen3", *PROMPT, env=offline, module="arcpy.decode")) == tokens(
        arcpy("--model", str(FAMILY), *PROMPT, env=offline, module="arcpy.decode"))
    # What was not pulled is not there offline.
    assert "tiny/qwen3-GGUF in the cache has no .gguf file of BF16; it has qwen3-Q8_0.gguf" in one_line_error(
        arcpy("pull", "tiny/qwen3-GGUF:BF16", env=offline))


def test_a_hub_that_cannot_be_reached_leaves_the_cache(tmp_path):
    hf_repo(tmp_path / "hub")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = hub_env(tmp_path, HF_HUB_OFFLINE=None, HF_ENDPOINT=closed)
    out = arcpy("--model", "tiny/qwen3", *PROMPT, env=env, module="arcpy.decode")
    assert out.returncode == 0, out.stderr
    assert f"note: the hub at {closed} cannot be reached (" in out.stderr and "tiny/qwen3 from the cache" in out.stderr
    line = one_line_error(arcpy("pull", "tiny/absent", env=env))
    assert f"tiny/absent is not in the Hugging Face cache ({tmp_path / 'hub'}) and the hub at {closed} cannot be " \
           "reached" in line


def test_a_download_on_a_terminal_shows_the_hubs_progress_bar(tmp_path):
    pexpect = pytest.importorskip("pexpect")
    gguf = (FAMILY / "model-q8_0.gguf").read_bytes()
    with FakeHub({"tiny/qwen3-GGUF": {"qwen3-Q8_0.gguf": gguf}}) as hub:
        env = hub_env(tmp_path, HF_HUB_OFFLINE=None, HF_ENDPOINT=hub.url)
        child = pexpect.spawn(sys.executable, ["-m", "arcpy", "pull", "tiny/qwen3-GGUF"], env=env, encoding="utf-8",
                              dimensions=(24, 120))
        child.expect(pexpect.EOF, timeout=120)
    assert "qwen3-Q8_0.gguf: 100%" in child.before and f"{len(gguf) / 1e3:.0f}k/{len(gguf) / 1e3:.0f}k" in child.before
    assert child.before.strip().endswith("qwen3-Q8_0.gguf")
