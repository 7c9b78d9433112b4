"""llama.cpp's test vocabularies and real chat templates, from the llama-cpp-python sdist on PyPI.

The sdist vendors the llama.cpp tree, whose models/ folder holds vocabulary-only GGUF files
(ggml-vocab-*.gguf, with the tokenizer tests' .inp/.out beside them) and models' own chat templates
(templates/*.jinja). pip downloads the sdist once (its sha256 pinned here); only those files are
kept, in arcpy's cache folder (arcpy.demo.cache_dir), which a folder appears in whole or not at all.
The tests read them there: nothing of them is in this repository.

A test skips only where pip cannot reach the package index; any other failure fails it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

import pytest

from arcpy.demo import cache_dir

PACKAGE, VERSION = "llama-cpp-python", "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MODELS = PurePosixPath(f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models")
FOLDER = f"llama.cpp-models-{VERSION}"
DONE = ".sdist-sha256"  # written last: the folder is whole
# What pip says when it cannot reach an index (then the tests skip).
UNREACHABLE = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
               "Network is unreachable", "ProxyError", "Max retries exceeded", "(from versions: none)")


@functools.lru_cache(maxsize=None)
def llamacpp_models() -> Path:
    """The folder with llama.cpp's ggml-vocab-* files and its templates/ folder, fetched first
    where it is absent."""
    target = cache_dir() / FOLDER
    if _whole(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="arcpy-sdist-") as tmp:
        sdist = _download(Path(tmp))
        part = target.parent / f".{FOLDER}.{os.getpid()}.{secrets.token_hex(4)}.part"
        try:
            _extract(sdist, part)
            (part / DONE).write_text(SDIST_SHA256)
            if target.exists() and not _whole(target):  # left by another version of this module
                shutil.rmtree(target)
            try:
                os.replace(part, target)
            except OSError:  # another run put it there first
                if not _whole(target):
                    raise
        finally:
            shutil.rmtree(part, ignore_errors=True)
    return target


def _whole(folder: Path) -> bool:
    try:
        return (folder / DONE).read_text() == SDIST_SHA256
    except OSError:
        return False


def _download(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-input", "--quiet",
           f"{PACKAGE}=={VERSION}", "-d", str(dest)]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                          timeout=900)
    said = proc.stdout + proc.stderr
    if proc.returncode != 0:
        last = [line for line in said.splitlines() if line.strip()][-1:] or [f"exit status {proc.returncode}"]
        if any(sign in said for sign in UNREACHABLE):
            pytest.skip(f"pip cannot reach the package index for {PACKAGE}=={VERSION}: {last[0]}")
        pytest.fail(f"pip could not download {PACKAGE}=={VERSION}: {last[0]}")
    found = sorted(dest.glob("*.tar.gz"))
    if len(found) != 1:
        pytest.fail(f"pip reported success but left {len(found)} sdists for {PACKAGE}=={VERSION}, not one")
    sdist = found[0]
    digest = hashlib.sha256()
    with open(sdist, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != SDIST_SHA256:
        pytest.fail(f"{sdist.name} has sha256 {digest.hexdigest()}, not the pinned {SDIST_SHA256}")
    return sdist


def _wanted(name: str) -> PurePosixPath | None:
    """Where a member of the sdist goes in the folder, or None for what is not kept."""
    path = PurePosixPath(name)
    if path.parent == MODELS and path.name.startswith("ggml-vocab-"):
        return PurePosixPath(path.name)
    if path.parent == MODELS / "templates" and path.suffix == ".jinja":
        return PurePosixPath("templates", path.name)
    return None


def _extract(sdist: Path, folder: Path) -> None:
    (folder / "templates").mkdir(parents=True)
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            where = _wanted(member.name)
            if where is None or not member.isfile():
                continue
            with tar.extractfile(member) as src, open(folder / where, "wb") as out:
                shutil.copyfileobj(src, out)
