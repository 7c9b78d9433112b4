"""Compiler and linker flags for C programs built against the installed libarc.

    cc prog.c $(python -m arcpy.build_flags --cflags --libs) -o prog

--cflags names the folder of arc.h, --libs the folder of libarc.so (for the linker and, as an
rpath, for the loader: the program then runs from any directory). Both folders are the ones
arcpy itself loads the library from (arcpy._lib.library_path), so the flags follow an editable
install, a `pip install .` or $ARC_LIBRARY alike.
"""

from __future__ import annotations

import sys

from arcpy import _lib
from arcpy.errors import ArcError, InvalidArgumentError, NoDeviceError

USAGE = "usage: python -m arcpy.build_flags [--cflags] [--libs]"
OPTIONS = ("--cflags", "--libs")


def flags(cflags: bool, libs: bool) -> str:
    """The requested flags on one line, cflags first. Raises NoDeviceError when no built
    library (or its arc.h) is where arcpy would load it from."""
    lib = _lib.library_path()
    if lib.name != "libarc.so":
        raise InvalidArgumentError(f"{lib} is not named libarc.so, so -larc cannot find it")
    folder = lib.parent.resolve()
    for name in _lib.HEADERS:
        if not (folder / name).is_file():
            raise NoDeviceError(f"{name} not found beside {lib}: reinstall arcpy")
    out = []
    if cflags:
        out.append(f"-I{folder}")
    if libs:
        out += [f"-L{folder}", f"-Wl,-rpath,{folder}", "-larc"]
    return " ".join(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["--help"], ["-h"]):
        print(USAGE)
        return 0
    unknown = [a for a in args if a not in OPTIONS]
    if unknown or not args:
        what = f"unknown option {unknown[0]!r}" if unknown else "no option given"
        print(f"arcpy.build_flags: {what}; {USAGE}", file=sys.stderr)
        return 2
    try:
        print(flags("--cflags" in args, "--libs" in args))
    except ArcError as exc:
        print(f"arcpy.build_flags: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
