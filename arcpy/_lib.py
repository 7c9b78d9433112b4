"""The cffi binding of libarc, in ABI mode: no compiled Python extension.

The cdef is read from arc.h itself (the copy the build places beside libarc.so): the region
between its `arc-cdef-begin` and `arc-cdef-end` markers, so the binding cannot drift from the
ABI. The library is found in this order: $ARC_LIBRARY (a path to a libarc.so; its arc.h is
expected beside it), then the libarc.so built into this package. A missing library, a missing
driver or no GPU all end in NoDeviceError on the first GPU call: `import arcpy` never fails for
want of a GPU, and nothing here can crash the interpreter on a machine without one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import cffi

from .errors import ArcError, ContextLostError, InvalidArgumentError, NoDeviceError

ABI_VERSION = 1
ARC_OK = 0
ARC_NOT_READY = 1

_MARKERS = re.compile(r"/\* arc-cdef-begin \*/(.*)/\* arc-cdef-end \*/", re.S)


def cdef_from_header(text: str) -> str:
    """The declarations between the cdef markers of arc.h."""
    m = _MARKERS.search(text)
    if m is None:
        raise NoDeviceError("arc.h has no arc-cdef-begin/arc-cdef-end markers")
    return m.group(1)


def library_path() -> Path:
    env = os.environ.get("ARC_LIBRARY")
    if env is not None:
        if not env.strip():
            raise InvalidArgumentError("ARC_LIBRARY is set but empty: unset it or name a libarc.so")
        return Path(env)
    return Path(__file__).resolve().parent / "libarc.so"


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
            header = path.with_name("arc.h")
            if not path.is_file():
                raise OSError(f"libarc.so not found at {path}: reinstall arcpy (pip install .) to build it")
            if not header.is_file():
                raise OSError(f"arc.h not found beside {path}: reinstall arcpy")
            ffi = cffi.FFI()
            ffi.cdef(cdef_from_header(header.read_text()))
            try:
                lib = ffi.dlopen(str(path))
            except OSError as exc:
                raise OSError(f"cannot load {path}: {exc}") from None
            version = lib.arc_abi_version()
            if version != ABI_VERSION:
                raise OSError(f"{path} has ABI version {version}, this arcpy needs {ABI_VERSION}")
        except OSError as exc:
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
