"""Checks shared by the config, the tensor table and the file readers, the quoting of file text, and
the reading of on/off environment variables."""

from __future__ import annotations

import math
import os
from typing import Mapping

import numpy as np

from arcpy.errors import InvalidArgumentError

_QUOTE_LIMIT = 60
_ON = {"1", "true", "on", "yes"}
_OFF = {"0", "false", "off", "no", ""}


def require(cond: bool, msg: str) -> None:
    if not cond:
        raise InvalidArgumentError(msg)


def is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def is_real(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def is_finite_real(v) -> bool:
    """A number that converts to a finite float (a huge int does not: float() overflows)."""
    if not is_real(v):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def quoted(value, limit: int = _QUOTE_LIMIT) -> str:
    """A value read from a file, fit for a one-line message.

    Strings are ASCII-escaped and quoted, so a newline or a terminal escape in a file cannot
    forge a second line; everything is cut to about `limit` characters. Lists of a few scalars
    are shown item by item (shapes, offsets); other containers only by their size.
    """
    if isinstance(value, str):
        text = ascii(value[:limit])
        return text + "..." if len(value) > limit else text
    if value is None or isinstance(value, (bool, float)) or is_int(value):
        text = ascii(value)
        return text[:limit] + "..." if len(text) > limit else text
    if isinstance(value, list) and len(value) <= 8 and not any(isinstance(v, (list, dict)) for v in value):
        return "[" + ", ".join(quoted(v, 24) for v in value) + "]"
    if isinstance(value, (list, dict)):
        kind = "list" if isinstance(value, list) else "object"
        return f"<{kind} of {len(value)} items>"
    return f"<{type(value).__name__}>"


def read_flag(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """An on/off environment variable, read by value: 1/true/on/yes enable; 0/false/off/no and the
    empty string disable; unset is `default`; anything else is an error that names the variable."""
    env = os.environ if environ is None else environ
    if name not in env:
        return default
    value = env[name].strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise InvalidArgumentError(
        f"{name}={env[name]!r} is not understood: use 1/true/on/yes to enable, 0/false/off/no or empty to disable"
    )
