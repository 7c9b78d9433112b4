"""The cffi binding of libarc, in ABI mode: no compiled Python extension.

CDEF is the region of libarc/arc.h between its cdef markers (a test keeps them identical).
The library is found in this order: $ARC_LIBRARY if set (a path to a libarc.so), then the
libarc.so built into this package. A missing library, a missing driver or no GPU all end in
NoDeviceError, raised on the first GPU call; `import arcpy` never fails for want of a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import cffi

from .errors import ArcError, DeviceFaultError, InvalidArgumentError, NoDeviceError

CDEF = r"""
typedef enum arc_status {
    ARC_OK = 0,
    ARC_NOT_READY = 1,         /* arc_stream_query: work is still running; not an error */
    ARC_INVALID_ARGUMENT = 2,  /* a null handle, a size out of range, a shape the kernel can't do */
    ARC_NO_DEVICE = 3,         /* no driver, no GPU, or the device index does not exist */
    ARC_CUDA_ERROR = 4,        /* a CUDA call failed; the detail names it */
    ARC_DEVICE_FAULT = 5,      /* a sticky asynchronous fault: the context is unusable */
    ARC_OUT_OF_MEMORY = 6,
    ARC_CAPTURE_ERROR = 7,     /* graph capture or instantiation failed */
    ARC_BUSY = 8               /* the operation needs the stream idle and it is not */
} arc_status;
"""

ffi = cffi.FFI()
ffi.cdef(CDEF)

_LIB = None
_LOAD_ERROR = None


def library_path() -> Path:
    env = os.environ.get("ARC_LIBRARY")
    if env is not None:
        if not env:
            raise InvalidArgumentError("ARC_LIBRARY is set but empty: unset it or name a libarc.so")
        return Path(env)
    return Path(__file__).resolve().parent / "libarc.so"


def lib():
    """The loaded library. Raises NoDeviceError (once cached) if it cannot be loaded."""
    global _LIB, _LOAD_ERROR
    if _LIB is not None:
        return _LIB
    if _LOAD_ERROR is not None:
        raise NoDeviceError(_LOAD_ERROR)
    path = library_path()
    if not path.is_file():
        _LOAD_ERROR = f"libarc.so not found at {path}: reinstall arcpy (pip install .) to build it"
        raise NoDeviceError(_LOAD_ERROR)
    try:
        loaded = ffi.dlopen(str(path))
    except OSError as exc:
        _LOAD_ERROR = f"cannot load {path}: {exc}"
        raise NoDeviceError(_LOAD_ERROR) from None
    if loaded.arc_abi_version() != ABI_VERSION:
        _LOAD_ERROR = f"{path} has ABI version {loaded.arc_abi_version()}, arcpy needs {ABI_VERSION}"
        raise NoDeviceError(_LOAD_ERROR)
    _LIB = loaded
    return _LIB


ABI_VERSION = 1

_EXCEPTIONS = {
    "ARC_INVALID_ARGUMENT": InvalidArgumentError,
    "ARC_NO_DEVICE": NoDeviceError,
    "ARC_DEVICE_FAULT": DeviceFaultError,
}


def check(status: int) -> int:
    """Turn a libarc status into a typed exception carrying the per-thread detail.

    ARC_OK and ARC_NOT_READY are returned; everything else raises."""
    if status == 0 or status == 1:
        return status
    L = lib()
    detail = ffi.string(L.arc_last_error()).decode("utf-8", "replace")
    name = ffi.string(L.arc_status_string(status)).decode()
    enum_name = _STATUS_NAMES.get(status, "")
    cls = _EXCEPTIONS.get(enum_name, ArcError)
    raise cls(f"{name}: {detail}" if detail else name, status)


_STATUS_NAMES = {}
