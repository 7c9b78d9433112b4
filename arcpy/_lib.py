"""The cffi binding of libarc, in ABI mode: no compiled Python extension.

The cdef is read from the headers themselves (the copies the build places beside libarc.so):
the region between the `arc-cdef-begin` and `arc-cdef-end` markers of arc.h (the decode API),
then of arc_model.h (the model), arc_ops.h (the kernel entry points) and arc_test.h (the test
hooks), so the binding cannot drift from the ABI. The library is found in this order:
1. $ARC_LIBRARY, a path to a libarc.so (its arc.h beside it). Set, it is the only candidate: a
   missing or unloadable file is an error naming the variable, never a silent fallback.
2. The libarc.so built into this package.
3. When this package is a source checkout without a build (run from the project's folder after
   `pip install .`), the libarc.so of the installed distribution.
A package built with ARC_CUDA_ARCHS=none has no libarc.so, and a file saying so in its place
(SKIPPED): the CUDA backend is then unavailable, said in one line (NOT_BUILT), and the NumPy
backend reads libarc's tables from arcpy.model.table (not_built()).
A missing library, a missing driver or no GPU all end in NoDeviceError on the first GPU call:
`import arcpy` never fails for want of a GPU, and nothing here can crash the interpreter.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import cffi

from arcpy.codes import ABI_VERSION, ARC_NOT_READY, ARC_OK
from arcpy.errors import ArcError, ContextLostError, InvalidArgumentError, NoDeviceError

LIBRARY_ENV = "ARC_LIBRARY"
_MARKERS = re.compile(r"/\* arc-cdef-begin \*/(.*)/\* arc-cdef-end \*/", re.S)
_PACKAGE = Path(__file__).resolve().parent
HEADERS = ("arc.h", "arc_model.h", "arc_ops.h", "arc_test.h")  # in the order their cdefs are read
SKIPPED = "libarc.skipped"  # what the build leaves in libarc.so's place where ARC_CUDA_ARCHS=none
NOT_BUILT = "libarc.so was not built (ARC_CUDA_ARCHS=none): the CUDA backend is unavailable"


def cdef_from_header(text: str, name: str = "arc.h") -> str:
    """The declarations between the cdef markers of a header (`name` for the error)."""
    m = _MARKERS.search(text)
    if m is None:
        raise NoDeviceError(f"{name} has no arc-cdef-begin/arc-cdef-end markers")
    return m.group(1)


def cdef_beside(path: Path) -> str:
    """The cdef of the headers beside a libarc.so, in the order of HEADERS."""
    parts = []
    for name in HEADERS:
        header = path.with_name(name)
        if not header.is_file():
            raise OSError(f"{name} not found beside {path}: reinstall arcpy")
        parts.append(cdef_from_header(header.read_text(), name))
    return "".join(parts)


def _installed_library() -> Path | None:
    """libarc.so of an installed arcpy distribution other than this package's folder. Several
    can be found: a source tree that was built from holds the metadata of its own build."""
    try:
        from importlib.metadata import distributions
        for dist in distributions(name="arcpy"):
            path = Path(str(dist.locate_file("arcpy/libarc.so"))).resolve()
            if path.is_file() and path.parent != _PACKAGE:
                return path
    except (ImportError, OSError, ValueError):
        return None
    return None


def not_built() -> bool:
    """This package was built without libarc.so (ARC_CUDA_ARCHS=none), and ARC_LIBRARY names none."""
    return (LIBRARY_ENV not in os.environ and not (_PACKAGE / "libarc.so").is_file()
            and (_PACKAGE / SKIPPED).is_file())


def library_path() -> Path:
    """Where libarc.so is loaded from (see the module's docstring); raises NoDeviceError when
    ARC_LIBRARY is set to nothing usable, naming the variable."""
    env = os.environ.get(LIBRARY_ENV)
    if env is not None:
        if not env.strip():
            raise NoDeviceError(f"{LIBRARY_ENV} is set but empty: unset it or name a libarc.so")
        path = Path(env)
        if not path.is_file():
            raise NoDeviceError(f"{LIBRARY_ENV}={env!r}: no such file")
        return path
    here = _PACKAGE / "libarc.so"
    if here.is_file():
        return here
    if (_PACKAGE / SKIPPED).is_file():
        raise NoDeviceError(NOT_BUILT)
    installed = _installed_library()
    if installed is not None:
        return installed
    if (_PACKAGE.parent / "libarc" / "arc.h").is_file():
        raise NoDeviceError(
            f"arcpy is imported from the source tree at {_PACKAGE.parent}, which has no built libarc.so: "
            "build it there (pip install -e .) or run from another folder to use the installed arcpy")
    raise NoDeviceError(f"libarc.so not found at {here}: reinstall arcpy (pip install .) to build it")


class _Binding:
    """ffi and lib, loaded on first use; a failure is remembered and raised again."""

    def __init__(self):
        self.ffi = None
        self.lib = None
        self.error = None

    def load(self):
        if self.lib is not None:
            return self
        if self.error is not None:
            raise NoDeviceError(self.error)
        try:
            path = library_path()
            ffi = cffi.FFI()
            ffi.cdef(cdef_beside(path))
            try:
                lib = ffi.dlopen(str(path))
            except OSError as exc:
                raise OSError(f"cannot load {path}: {exc}") from None
            version = lib.arc_abi_version()
            if version != ABI_VERSION:
                raise OSError(f"{path} has ABI version {version}, this arcpy needs {ABI_VERSION}")
        except (OSError, NoDeviceError) as exc:
            self.error = str(exc)
            raise NoDeviceError(self.error) from None
        self.ffi, self.lib = ffi, lib
        return self


_binding = _Binding()


def load():
    """(ffi, lib) of libarc. Raises NoDeviceError if the library cannot be loaded."""
    b = _binding.load()
    return b.ffi, b.lib


_EXCEPTIONS = {
    "ARC_INVALID_ARGUMENT": InvalidArgumentError,
    "ARC_NO_DEVICE": NoDeviceError,
    "ARC_DEVICE_FAULT": ContextLostError,
}


def check(status: int) -> int:
    """Turn a libarc status into a typed exception carrying the per-thread detail.

    ARC_OK and ARC_NOT_READY are returned (the latter only comes from polling calls);
    every other status raises: InvalidArgumentError, NoDeviceError, ContextLostError, or
    ArcError for the rest, each with the status code in `.status`."""
    if status == ARC_OK or status == ARC_NOT_READY:
        return status
    ffi, lib = load()
    detail = ffi.string(lib.arc_last_error()).decode("utf-8", "replace")
    summary = ffi.string(lib.arc_status_string(status)).decode()
    enum_name = ffi.string(ffi.cast("arc_status", status))
    cls = _EXCEPTIONS.get(enum_name, ArcError)
    raise cls(f"{summary}: {detail}" if detail else summary, status)


def device_count() -> int:
    """Number of visible CUDA devices; raises NoDeviceError without a library or driver."""
    ffi, lib = load()
    n = ffi.new("int *")
    check(lib.arc_device_count(n))
    return n[0]


def cuda_available() -> tuple[bool, str]:
    """(True, device summary) or (False, the reason). Never raises, never crashes."""
    try:
        n = device_count()
    except ArcError as exc:
        return False, str(exc)
    if n == 0:
        return False, "no CUDA device is visible"
    return True, f"{n} CUDA device(s)"


def auto_backend() -> str:
    """The backend "auto" stands for: "cuda" when a GPU is usable, else "numpy". When
    ARC_LIBRARY names a library that cannot be loaded, that is an error (NoDeviceError naming
    the variable), not a quiet fallback to the CPU."""
    ok, _ = cuda_available()
    if ok:
        return "cuda"
    if LIBRARY_ENV in os.environ and _binding.error is not None:
        raise NoDeviceError(_binding.error)
    return "numpy"
