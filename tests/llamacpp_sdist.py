"""llama.cpp's own test files, from the llama-cpp-python sdist on PyPI (it vendors llama.cpp's tree).

    llamacpp_models() -> Path   the folder holding models/ggml-vocab-* (llama.cpp's tokenizer test
                                vocabularies, with their .inp/.out cases) and templates/*.jinja
                                (the chat templates of models/templates)

pip downloads the sdist alone, once (`pip download --no-deps`, so the user's index and proxy
settings hold), and it is checked against the sha256 pinned here; only those files are kept, in
the cache folder arcpy.demo.cache_dir() names ($ARC_CACHE, else $XDG_CACHE_HOME/arcpy, else
~/.cache/arcpy). They are extracted beside the folder and renamed into place, so the folder is
whole or absent. Where pip cannot reach the index, the calling test skips and says so; every
other failure fails it.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from arcpy.demo import cache_dir, sha256_of

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_MODELS = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/"
# What pip says when it cannot connect at all (no network, no route, no name, a proxy refusing).
_UNREACHABLE = re.compile(r"NewConnectionError|ConnectTimeoutError|Failed to establish a new connection"
                          r"|Temporary failure in name resolution|Name or service not known|Network is unreachable"
                          r"|ProxyError|Connection refused|nodename nor servname")


def llamacpp_models() -> Path:
    """The folder of llama.cpp's test vocabularies (ggml-vocab-*) with templates/ inside it,
    fetched into the cache folder if it is not there yet."""
    folder = cache_dir() / f"{PACKAGE}-{VERSION}-models"
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="arcpy-llamacpp-"))
    try:
        part = folder.parent / f".{folder.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
        part.mkdir()
        try:
            _extract(_download(tmp), part)
            os.replace(part, folder)
        except OSError:
            if not folder.is_dir():  # another run may have put it there first
                raise
        finally:
            shutil.rmtree(part, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _download(tmp: Path) -> Path:
    """The sdist, downloaded by pip into `tmp` and checked against the pinned hash. pip's
    warnings are kept: they are where it says that it could not connect (as it retries)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE, "--no-input",
           f"{PACKAGE}=={VERSION}", "-d", str(tmp)]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, errors="replace")
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR:")] or lines or [f"exit status {proc.returncode}"]
        why = f"pip could not download {PACKAGE}=={VERSION} ({errors[0][:160]})"
        if any(_UNREACHABLE.search(line) for line in lines):
            pytest.skip(f"{why}: the index cannot be reached, and llama.cpp's test files come from it")
        pytest.fail(why, pytrace=False)
    sdist = tmp / SDIST
    with open(sdist, "rb") as fh:
        got = sha256_of(fh)
    if got != SDIST_SHA256:
        pytest.fail(f"the downloaded {SDIST} has sha256 {got}, not the pinned {SDIST_SHA256}", pytrace=False)
    return sdist


def _wanted(name: str) -> str | None:
    """Where a member of the sdist goes in the folder (None: not kept)."""
    if not name.startswith(_MODELS):
        return None
    rest = name[len(_MODELS):]
    if rest.startswith("ggml-vocab-") and "/" not in rest:
        return rest
    if rest.startswith("templates/") and rest.endswith(".jinja") and rest.count("/") == 1:
        return rest
    return None


def _extract(sdist: Path, into: Path) -> None:
    """The vocabularies and templates of `sdist`, as plain files under `into`."""
    (into / "templates").mkdir()
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            where = _wanted(member.name)
            if where is None or not member.isfile():
                continue
            with tar.extractfile(member) as src, open(into / where, "xb") as dst:
                shutil.copyfileobj(src, dst)
