"""Build: compile every .cu under libarc/ (libarc/model/ and its folders too) into arcpy/libarc.so
with the nvcc of the CUDA 13.0 wheels (nvidia-cuda-nvcc and friends, build requirements in
pyproject.toml).

Never a system CUDA: nvcc is looked up only inside the installed `nvidia` wheels, and cudart is
linked statically, so the library needs only the driver (libcuda.so.1) at run time.
ARC_CUDA_ARCHS overrides the targets, e.g. "80;90" (SASS for each, PTX for the last). With 90
among them, model/gemm/gemm_sm90.cu is compiled for sm_90a alone, against the CUTLASS headers of the
nvidia-cutlass wheel (also a build requirement); without it, that file builds its stand-ins.
ARC_CUDA_ARCHS=none builds no library at all (a CPU-only install: the NumPy backend runs, the CUDA
backend says it was not built): libarc.skipped takes libarc.so's place, and the build asks for no
CUDA wheels (build_backend.py).
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DEFAULT_ARCHS = "80;90"
# The sources whose device code takes longest to compile start first, slowest first, so that none
# of them begins last and runs alone. Measured on 2026-12-06 in a default build (targets 80;90) on
# a 2-core machine, two compiles at a time (docs/INSTALL.md): attention.cu 88 s, gemm_sm90.cu 62 s,
# qgemv_k.cu 52 s, qgemv_q8_q4.cu 51 s, gemm_quant.cu 18 s, qgemv_rows_k.cu 17 s, gemm.cu 14 s,
# sample.cu 14 s, qgemv_rows_q8_q4.cu 14 s, gemv.cu 13 s, gemv_rows.cu 12 s, sample_cluster.cu 10 s,
# prefill_attention.cu 8 s; the other 20 sources at most 2.3 s each.
SLOW_FIRST = ("model/attention.cu", "model/gemm/gemm_sm90.cu", "model/qgemv/qgemv_k.cu", "model/qgemv/qgemv_q8_q4.cu",
              "model/gemm/gemm_quant.cu", "model/qgemv/qgemv_rows_k.cu", "model/gemm/gemm.cu", "sample.cu",
              "model/qgemv/qgemv_rows_q8_q4.cu", "model/gemv/gemv.cu", "model/gemv/gemv_rows.cu", "sample_cluster.cu",
              "model/prefill_attention.cu")
# Sources with no device code: compiled as C++, which skips nvcc's device passes (1.5 s each).
HOST_ONLY = ("core.cu", "graph.cu", "comm.cu")
# The C ABI (arc.h), its kernel entry points (arc_ops.h) and its test hooks (arc_test.h), shipped beside libarc.so.
HEADERS = ("arc.h", "arc_model.h", "arc_ops.h", "arc_test.h")
SKIPPED = "libarc.skipped"  # in libarc.so's place where ARC_CUDA_ARCHS=none (arcpy/_lib.py reads it)


def fail(message):
    sys.exit(f"error: arcpy build: {message}")


def find_cuda_wheels():
    """The cu13 folder of the nvidia wheels (bin/nvcc, include, lib), from sys.path only."""
    for entry in sys.path:
        top = Path(entry or ".") / "nvidia" / "cu13"
        if (top / "bin" / "nvcc").is_file():
            return top
    fail("nvcc not found: install the build requirements (pip does this for `pip install .`; "
         "by hand: pip install 'nvidia-cuda-nvcc==13.0.*' 'nvidia-cuda-runtime==13.0.*' "
         "'nvidia-cuda-crt==13.0.*' 'nvidia-nvvm==13.0.*' 'nvidia-cuda-cccl==13.0.*')")


# Compiled for sm_90a only (its kernel uses wgmma and TMA), when the targets include 90.
SM90A = "model/gemm/gemm_sm90.cu"


def find_cutlass():
    """The include folder of the nvidia-cutlass wheel, located without importing it."""
    spec = importlib.util.find_spec("cutlass_library")
    for entry in (spec.submodule_search_locations or []) if spec else []:
        top = Path(entry) / "source" / "include"
        if (top / "cutlass" / "cutlass.h").is_file():
            return top
    fail("the CUTLASS headers were not found: install the build requirements (pip does this for "
         "`pip install .`; by hand: pip install 'nvidia-cutlass==4.2.*')")


def cuda_archs():
    """The targets; [] for ARC_CUDA_ARCHS=none (no library)."""
    raw = os.environ.get("ARC_CUDA_ARCHS", DEFAULT_ARCHS)
    if raw.strip().lower() == "none":
        return []
    archs = [a.strip() for a in re.split(r"[;,\s]+", raw) if a.strip()]
    if not archs or not all(re.fullmatch(r"[1-9][0-9]a?", a) for a in archs):
        fail(f"ARC_CUDA_ARCHS={raw!r}: expected compute capabilities like '80;90', or none")
    return archs


def arch_flags():
    archs = cuda_archs()
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    last = archs[-1]
    flags.append(f"-gencode=arch=compute_{last},code=compute_{last}")
    return flags


def libarc_sources():
    """Every .cu of libarc, in its folders too, the slowest to compile first."""
    top = ROOT / "libarc"
    sources = sorted(top.rglob("*.cu"))
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    return sorted(sources, key=lambda src: rank.get(src.relative_to(top).as_posix(), len(rank)))


def compile_libarc(target: Path):
    cuda = find_cuda_wheels()
    host = shutil.which("g++")
    if host is None:
        fail("no C++ host compiler: nvcc needs g++ on PATH (e.g. apt-get install g++)")
    sources = libarc_sources()
    nvcc = str(cuda / "bin" / "nvcc")
    targets = arch_flags()
    common = ["-std=c++17", "-O3", "-ccbin", host, "-Xcompiler=-fPIC", "--expt-relaxed-constexpr",
              f"-I{ROOT / 'libarc'}", *targets]
    # With cores to spare, a slow source compiles its targets in parallel (attention.cu: 13 s
    # becomes 7 s). On two cores the slow source and the others already keep both busy, and the
    # threads would only add their own start-up work.
    slow_threads = [f"--threads={len(targets)}"] if (os.cpu_count() or 1) > 2 else []
    # nvcc finds its own headers next to itself; a stray CUDA_HOME must not redirect it.
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CPATH")}
    objdir = target.parent / ".libarc-build"
    objdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def compile_one(src):
        name = src.relative_to(ROOT / "libarc").as_posix()
        obj = objdir / (name[:-len(".cu")].replace("/", "__") + ".o")  # one object a path: stems may repeat
        extra = ["-x", "c++"] if name in HOST_ONLY else slow_threads if name in SLOW_FIRST else []
        flags = common
        if name == SM90A and any(a.rstrip("a") == "90" for a in cuda_archs()):
            flags = [f for f in common if not f.startswith("-gencode")]
            extra = ["-gencode=arch=compute_90a,code=sm_90a", "-DARC_SM90A", f"-I{find_cutlass()}"]
        run([nvcc, *flags, *extra, "-c", str(src), "-o", str(obj)], env)
        return obj

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        # The link takes the objects by name, whatever order they compiled in.
        objects = sorted(pool.map(compile_one, sources))
    # The SONAME is the file's own name, so `-larc` with an rpath to this folder resolves
    # without a versioned symlink.
    run([nvcc, *common, "-shared", "-cudart=static", f"-L{cuda / 'lib'}", "-Xlinker=-soname=libarc.so",
         f"-Xlinker=--version-script={ROOT / 'libarc' / 'exports.map'}",
         "-Xcompiler=-static-libstdc++,-static-libgcc",
         *map(str, objects), "-o", str(target)], env)
    shutil.rmtree(objdir, ignore_errors=True)
    # The headers ship beside the library: C users include them, and arcpy/_lib.py takes its cffi
    # cdef from them, so the binding cannot drift from the ABI.
    for header in HEADERS:
        shutil.copyfile(ROOT / "libarc" / header, target.parent / header)
    print(f"arcpy build: {target} from {len(sources)} sources in {time.monotonic() - started:.1f}s")


def run(cmd, env):
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    what = cmd[-3] if "-c" in cmd else "the link"
    # Each step's seconds (`pip install -v` shows them): where the build's wall time goes.
    name = what if what == "the link" else Path(what).name
    print(f"arcpy build: {name} {time.monotonic() - started:.1f}s", flush=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        fail(f"nvcc failed on {what}")
    if proc.stderr.strip():  # warnings: the sources are meant to compile without any
        sys.stderr.write(f"arcpy build: nvcc warnings for {what}:\n{proc.stderr}")


class BuildPyWithLibarc(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            target = ROOT / "arcpy" / "libarc.so"
        else:
            target = Path(self.build_lib) / "arcpy" / "libarc.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        skipped = target.with_name(SKIPPED)
        if not cuda_archs():
            # Nothing of an earlier build may stay behind to be loaded in its place.
            for stale in (target, *(target.with_name(h) for h in HEADERS)):
                stale.unlink(missing_ok=True)
            skipped.write_text("ARC_CUDA_ARCHS=none: libarc.so was not built\n")
            print("arcpy build: ARC_CUDA_ARCHS=none: no libarc.so (the NumPy backend runs; the CUDA one is "
                  "unavailable)")
            return
        skipped.unlink(missing_ok=True)
        compile_libarc(target)


class BinaryDistribution(Distribution):
    """libarc.so is machine code: the wheel is tagged for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibarc}, distclass=BinaryDistribution)
