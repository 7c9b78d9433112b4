"""`python -m arcpy.build_flags`: the flags a C program builds with, and the C example built with them
from outside the source tree, as examples/c/device_loop.c documents."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import arcpy
from arcpy import _lib

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "c" / "device_loop.c"
EXIT_NO_DEVICE = 2  # device_loop.c's documented status on a machine without a GPU


def config(*args, cwd, **env):
    """Run the module as a user would, from `cwd`, importing the arcpy these tests import."""
    path = os.pathsep.join(filter(None, [str(Path(arcpy.__file__).parent.parent), os.environ.get("PYTHONPATH")]))
    environ = dict(os.environ, PYTHONPATH=path, **env)
    return subprocess.run([sys.executable, "-m", "arcpy.build_flags", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=60)


def build_example(workdir: Path, flags: str) -> Path:
    """Copy the example into `workdir` and build it there with `flags`, as its header says."""
    shutil.copy(EXAMPLE, workdir / "device_loop.c")
    subprocess.run(["cc", "-Wall", "-Wextra", "-Werror", "device_loop.c", *flags.split(), "-o", "device_loop"],
                   cwd=workdir, check=True, capture_output=True, text=True)
    return workdir / "device_loop"


def test_flags_name_the_folder_of_the_header_and_of_the_library(tmp_path):
    out = config("--cflags", "--libs", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    folder = _lib.library_path().parent.resolve()
    assert out.stdout.split() == [f"-I{folder}", f"-L{folder}", f"-Wl,-rpath,{folder}", "-larc"]
    assert (folder / "arc.h").is_file() and (folder / "libarc.so").is_file()
    assert config("--libs", cwd=tmp_path).stdout.split() == [f"-L{folder}", f"-Wl,-rpath,{folder}", "-larc"]
    assert config("--cflags", cwd=tmp_path).stdout.split() == [f"-I{folder}"]


@pytest.mark.parametrize("args,message", [
    ((), "no option given"),
    (("--cflags", "--static"), "unknown option '--static'"),
])
def test_usage_errors_are_one_line(tmp_path, args, message):
    out = config(*args, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and message in out.stderr and "usage:" in out.stderr


def test_help_prints_the_usage(tmp_path):
    out = config("--help", cwd=tmp_path)
    assert (out.returncode, out.stderr) == (0, "") and out.stdout.startswith("usage: python -m arcpy.build_flags")


def test_a_missing_library_is_one_line(tmp_path):
    out = config("--libs", cwd=tmp_path, ARC_LIBRARY=str(tmp_path / "libarc.so"))
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == f"arcpy.build_flags: ARC_LIBRARY={str(tmp_path / 'libarc.so')!r}: no such file\n"


def test_a_library_not_named_libarc_so_is_refused(tmp_path):
    lib = tmp_path / "libarc-test.so"
    shutil.copy(_lib.library_path(), lib)
    out = config("--libs", cwd=tmp_path, ARC_LIBRARY=str(lib))
    assert out.returncode == 1 and "not named libarc.so" in out.stderr and out.stderr.count("\n") == 1


def test_the_c_example_builds_from_another_folder_with_the_flags_and_runs(tmp_path):
    flags = config("--cflags", "--libs", cwd=tmp_path)
    assert flags.returncode == 0, flags.stderr
    exe = build_example(tmp_path, flags.stdout)
    # From yet another folder: the rpath, not the working directory, finds the library.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([str(exe)], cwd=elsewhere, capture_output=True, text=True, timeout=60)
    if arcpy.cuda_available():
        assert out.returncode == 0, out.stderr
        assert "ok: 16 tokens, as scripted" in out.stdout
    else:
        assert out.returncode == EXIT_NO_DEVICE, out.stderr
        assert out.stderr.startswith("no CUDA device: ") and out.stderr.count("\n") == 1


def test_an_installed_copy_of_the_library_is_what_the_example_links_and_loads(tmp_path):
    # A library and header elsewhere, as `pip install .` places them in site-packages.
    site = tmp_path / "site" / "arcpy"
    site.mkdir(parents=True)
    shutil.copy(_lib.library_path(), site / "libarc.so")
    for name in _lib.HEADERS:
        shutil.copy(_lib.library_path().with_name(name), site / name)
    flags = config("--cflags", "--libs", cwd=tmp_path, ARC_LIBRARY=str(site / "libarc.so"))
    assert flags.returncode == 0, flags.stderr
    assert f"-Wl,-rpath,{site.resolve()}" in flags.stdout.split()
    build = tmp_path / "build"
    build.mkdir()
    exe = build_example(build, flags.stdout)
    ldd = shutil.which("ldd")
    if ldd is not None:
        resolved = subprocess.run([ldd, str(exe)], capture_output=True, text=True).stdout
        assert f"libarc.so => {site.resolve() / 'libarc.so'}" in resolved, resolved
    out = subprocess.run([str(exe)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, EXIT_NO_DEVICE), out.stderr


@pytest.mark.gpu
def test_the_c_example_runs_the_device_loop(tmp_path):
    exe = build_example(tmp_path, config("--cflags", "--libs", cwd=tmp_path).stdout)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ok: 16 tokens, as scripted" in out.stdout
