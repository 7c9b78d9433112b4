"""The build and the rules of the C ABI, checked on the sources and on the built libarc.so."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import cffi
import pytest

import arcpy
from arcpy import _lib, codes

ROOT = Path(__file__).resolve().parent.parent
LIBARC = ROOT / "libarc"
SOURCES = (sorted(LIBARC.rglob("*.cu")) + sorted(LIBARC.rglob("*.cuh"))
           + [LIBARC / name for name in _lib.HEADERS])
HEADER = (LIBARC / "arc.h").read_text()
DECODE_CDEF = _lib.cdef_from_header(HEADER) + _lib.cdef_from_header((LIBARC / "arc_model.h").read_text(), "arc_model.h")
OPS_CDEF = _lib.cdef_from_header((LIBARC / "arc_ops.h").read_text(), "arc_ops.h")
TEST_CDEF = _lib.cdef_from_header((LIBARC / "arc_test.h").read_text(), "arc_test.h")
CDEF = DECODE_CDEF + OPS_CDEF + TEST_CDEF


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
    for name in _lib.HEADERS:
        assert path.with_name(name).read_text() == (LIBARC / name).read_text(), name


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
    assert ffi.sizeof("arc_ring_state") == 28


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
    with pytest.raises(arcpy.InvalidArgumentError, match="arc_graph_node_count: null argument"):
        _lib.check(lib.arc_graph_node_count(ffi.NULL, ffi.new("uint64_t *")))
    with pytest.raises(arcpy.InvalidArgumentError, match="arc_argmax: null argument"):
        _lib.check(lib.arc_argmax(ffi.NULL, ffi.NULL, 8, ffi.NULL, ffi.NULL, ffi.NULL))


def header_constant(name):
    """An enum constant as cffi reads it from the header alone: no libarc.so involved (the
    process's own symbols stand in for a library; constants need none)."""
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return getattr(ffi.dlopen(None), name)


def test_limits_and_fault_codes_are_enum_constants_of_the_header():
    assert header_constant("ARC_MAX_STOP_IDS") == 8
    assert header_constant("ARC_FAULT_NONFINITE") == 3
    _, lib = _lib.load()
    assert (lib.ARC_MAX_STOP_IDS, lib.ARC_FAULT_NONFINITE) == (8, 3)


def test_the_python_copies_of_the_abi_numbers_equal_the_header():
    pairs = {
        "ARC_OK": codes.ARC_OK, "ARC_NOT_READY": codes.ARC_NOT_READY, "ARC_BUSY": codes.ARC_BUSY,
        "ARC_FAULT_NONE": codes.FAULT_NONE, "ARC_FAULT_TOKEN_RANGE": codes.FAULT_TOKEN_RANGE,
        "ARC_FAULT_POSITION_RANGE": codes.FAULT_POSITION_RANGE, "ARC_FAULT_NONFINITE": codes.FAULT_NONFINITE,
        "ARC_MAX_STOP_IDS": codes.MAX_STOP_IDS, "ARC_MAX_TOP_LOGPROBS": codes.MAX_TOP_LOGPROBS,
        "ARC_DRAFT_MEMORY": codes.DRAFT_MEMORY, "ARC_MAX_WORLD": codes.MAX_WORLD,
        "ARC_MAX_LOGIT_BIAS": codes.MAX_LOGIT_BIAS,
        **{f"ARC_FORMAT_{name.upper()}": number for number, name in codes.FORMAT_NAMES.items()},
        **{f"ARC_OP_{name}": number for number, name in codes.OP_NAMES.items()},
        "ARC_MAX_LAYER_OPS": codes.MAX_LAYER_OPS,
        "ARC_ACT_SILU": codes.ACTIVATIONS.index("silu"), "ARC_ACT_GELU_TANH": codes.ACTIVATIONS.index("gelu_tanh"),
        "ARC_ROUTE_SOFTMAX_TOPK": codes.ROUTINGS.index("softmax_topk"),
        "ARC_ROUTE_TOPK_SOFTMAX": codes.ROUTINGS.index("topk_softmax"),
    }
    assert len(codes.ACTIVATIONS) == 2
    assert {name: header_constant(name) for name in pairs} == pairs
    _, lib = _lib.load()
    assert lib.arc_abi_version() == codes.ABI_VERSION


@pytest.mark.parametrize("name", ["ARC_MAX_STOP_IDS", "ARGMAX_MAX_BLOCKS", "ARC_ATTN_MAX_GROUPS", "ARC_ABI_VERSION",
                                  "GEMV_MAX_COLS"])
def test_each_constant_of_libarc_is_defined_once(name):
    homes = [src.relative_to(ROOT).as_posix() for src in SOURCES
             for _ in re.finditer(rf"\b{name}\s*=\s*\d", strip_comments(src.read_text()))]
    assert len(homes) == 1, homes


def test_device_attributes_are_read_once_per_context_not_per_launch():
    askers = [src.name for src in SOURCES if "cudaDeviceGetAttribute" in strip_comments(src.read_text())]
    assert askers == ["core.cu"]
    # The GEMV's work split follows the context's multiprocessor count, not the H200's 132.
    assert not re.search(r"\b132\b", strip_comments((LIBARC / "model" / "gemv" / "gemv.cu").read_text()))


def test_test_hooks_sit_in_a_header_of_their_own_that_builds_on_arc_h():
    assert "Not part of the decode API" in TEST_CDEF
    hook_functions = set(re.findall(r"\b(arc_\w+)\s*\(", strip_comments(TEST_CDEF)))
    assert hook_functions == {"arc_script_forward", "arc_loop_inject_lost_step"}
    assert "arc_script" not in strip_comments(DECODE_CDEF) and "inject" not in strip_comments(DECODE_CDEF)
    assert '#include "arc.h"' in (LIBARC / "arc_test.h").read_text()


def test_kernel_entry_points_sit_in_arc_ops_h_and_nowhere_else():
    ops = set(re.findall(r"\b(arc_op_\w+)\s*\(", strip_comments(OPS_CDEF)))
    assert {"arc_op_gemv", "arc_op_qgemv", "arc_op_prefill_attention", "arc_op_gemv_rows"} <= ops
    assert all(name.startswith("arc_op_") for name in ops)
    assert "arc_op_" not in strip_comments(DECODE_CDEF) + strip_comments(TEST_CDEF)
    assert '#include "arc.h"' in (LIBARC / "arc_ops.h").read_text()


def test_graph_node_count_is_exported():
    assert "arc_graph_node_count" in exported_symbols()


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) is not installed")
def test_libarc_names_itself_libarc_so_so_that_larc_finds_it_without_symlinks():
    out = subprocess.run(["readelf", "-d", str(_lib.library_path())], capture_output=True, text=True,
                         check=True).stdout
    assert re.findall(r"\(SONAME\)\s+Library soname: \[(.*?)\]", out) == ["libarc.so"]


@pytest.mark.skipif(arcpy.cuda_available(), reason="checks behaviour without a GPU")
def test_without_a_gpu_import_works_and_gpu_calls_raise_clearly():
    code = (
        "import arcpy\n"
        "from arcpy.devices.context import Context\n"
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
    assert out.stdout == f"False ARC_LIBRARY={str(tmp_path / 'libarc.so')!r}: no such file\n"


def test_arc_sampling_holds_exactly_the_sampling_record_s_fields():
    # The sampling a request carries reaches the draw field by field (sampling_struct): a parameter
    # added to one and not the other would be lost on the way.
    import dataclasses

    from arcpy.devices.context import sampling_struct
    from arcpy.sampling import Sampling

    ffi = cffi.FFI()
    ffi.cdef(DECODE_CDEF)
    c_fields = [name for name, _ in ffi.typeof("arc_sampling").fields]
    assert sorted(c_fields) == sorted(f.name for f in dataclasses.fields(Sampling))
    s = sampling_struct(ffi, Sampling(temperature=0.7, top_k=2**40, top_p=0.9, seed=2**63 + 5))
    assert (s.temperature, s.top_k, s.top_p, s.seed) == (0.7, 2**31 - 1, 0.9, 2**63 + 5)
