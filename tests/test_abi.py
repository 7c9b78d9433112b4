"""The build and the rules of the C ABI, checked on the sources and on the built libarc.so."""

import re
import subprocess
import sys
from pathlib import Path

import cffi
import pytest

import arcpy
from arcpy import _lib

ROOT = Path(__file__).resolve().parent.parent
LIBARC = ROOT / "libarc"
SOURCES = sorted(LIBARC.rglob("*.cu")) + sorted(LIBARC.rglob("*.cuh")) + [LIBARC / "arc.h"]
HEADER = (LIBARC / "arc.h").read_text()
CDEF = _lib.cdef_from_header(HEADER)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def declared_functions():
    return re.findall(r"\b(arc_\w+)\s*\(", strip_comments(CDEF))


def exported_symbols():
    out = subprocess.run(["nm", "-D", "--defined-only", str(_lib.library_path())],
                         capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}


def test_the_build_produced_libarc_and_its_header_beside_the_package():
    path = _lib.library_path()
    assert path.is_file(), "pip install . builds arcpy/libarc.so"
    assert path.with_name("arc.h").read_text() == HEADER


@pytest.mark.parametrize("pattern", [
    r"\bcuda(Stream|Device|Event|Ctx|Thread)Synchronize\b",
    r"\bcu(Stream|Ctx|Event)Synchronize\b",
    r"\bcudaMemcpy(2D|3D|ToSymbol|FromSymbol)?\s*\(",   # the blocking copies
    r"\bcudaMemset\s*\(",
    r"\bcudaStreamWaitEvent\b.*cudaEventBlockingSync",
])
def test_no_libarc_source_blocks_the_host_on_the_gpu(pattern):
    offenders = [f"{src.relative_to(ROOT)}: {line.strip()}"
                 for src in SOURCES for line in strip_comments(src.read_text()).splitlines()
                 if re.search(pattern, line)]
    assert offenders == []


def test_no_exported_symbol_mentions_sync():
    assert [s for s in exported_symbols() if "sync" in s.lower()] == []


def test_exports_are_exactly_the_declared_c_functions():
    assert exported_symbols() == set(declared_functions())


def test_cdef_region_has_no_macros_and_parses_in_cffi():
    assert "#" not in CDEF
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    assert ffi.sizeof("arc_ring_state") == 20


def test_every_entry_point_returns_a_status_but_the_three_readers():
    readers = {"arc_abi_version", "arc_status_string", "arc_last_error"}
    decls = re.findall(r"^\s*([\w\s\*]+?)\s*\b(arc_\w+)\s*\(", strip_comments(CDEF), flags=re.M)
    assert decls
    for ret, name in decls:
        if name not in readers:
            assert ret.strip() == "int", f"{name} returns {ret!r}, not a status"


def test_abi_names_are_prefixed():
    text = strip_comments(CDEF)
    typedefs = re.findall(r"typedef\s+(?:struct|enum)\s+(\w+)", text)
    constants = re.findall(r"\b([A-Za-z_]\w*)\s*=\s*\d", text)
    assert typedefs and constants
    assert all(t.startswith("arc_") for t in typedefs)
    assert all(c.startswith("ARC_") for c in constants)
    assert all(f.startswith("arc_") for f in declared_functions())


def test_status_strings_and_abi_version_come_from_the_library():
    ffi, lib = _lib.load()
    assert lib.arc_abi_version() == _lib.ABI_VERSION
    assert ffi.string(lib.arc_status_string(2)) == b"invalid argument"
    assert ffi.string(lib.arc_status_string(999)) == b"unknown status"


def test_invalid_arguments_raise_a_typed_error_with_the_detail():
    ffi, lib = _lib.load()
    with pytest.raises(arcpy.InvalidArgumentError, match="arc_loop_create: null argument"):
        _lib.check(lib.arc_loop_create(ffi.NULL, 10, 10, 4, ffi.new("arc_loop **")))
    with pytest.raises(arcpy.InvalidArgumentError, match="null argument"):
        _lib.check(lib.arc_ring_poll(ffi.NULL, ffi.NULL))


@pytest.mark.skipif(arcpy.cuda_available(), reason="checks behaviour without a GPU")
def test_without_a_gpu_import_works_and_gpu_calls_raise_clearly():
    code = (
        "import arcpy\n"
        "from arcpy.device import Context\n"
        "assert arcpy.cuda_available() is False\n"
        "print(arcpy.cuda_status())\n"
        "try:\n"
        "    Context()\n"
        "except arcpy.NoDeviceError as e:\n"
        "    print('raised', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "raised no CUDA device" in out.stdout
    assert "driver" in out.stdout.lower()


def test_a_missing_library_is_a_clear_no_device_error(tmp_path):
    code = (
        "import arcpy\n"
        "print(arcpy.cuda_available(), arcpy.cuda_status())\n"
    )
    env = {"ARC_LIBRARY": str(tmp_path / "libarc.so"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("False libarc.so not found at")


def build_c_example(tmp_path):
    exe = tmp_path / "device_loop"
    lib = _lib.library_path()
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{lib.parent}",
                    str(ROOT / "examples" / "c" / "device_loop.c"), str(lib), f"-Wl,-rpath,{lib.parent}",
                    "-o", str(exe)], check=True, capture_output=True, text=True)
    return exe


def test_a_c_program_builds_against_the_header_and_links_the_library(tmp_path):
    exe = build_c_example(tmp_path)
    if not arcpy.cuda_available():
        out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and out.stderr.startswith("no CUDA device")


@pytest.mark.gpu
def test_the_c_program_runs_the_device_loop(tmp_path):
    out = subprocess.run([str(build_c_example(tmp_path))], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ok: 16 tokens, as scripted" in out.stdout
