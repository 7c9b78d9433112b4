"""Opening model files and parsing their JSON, trusting nothing about either.

Symbolic links are followed (the Hugging Face cache lays out each snapshot as links into its blob
store), but what a name reaches must be a regular file: a FIFO would block the open, a device
never end. JSON failures become one line that says what is wrong without repeating file bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import BinaryIO

from arcpy.errors import ModelFileError

# Real config.json, index and safetensors headers are kilobytes to a few megabytes.
MAX_JSON_BYTES = 100 * 1024 * 1024
_SLICE = 1 << 20  # JSON text whose items are counted is read a megabyte at a time
_NOT_BEFORE_ITEMS = bytes(sorted(set(range(256)) - set(b",:[{")))  # deleted: what is left is counted


def open_regular(path: Path) -> tuple[BinaryIO, int]:
    """Open `path` for binary reading -> (file, size). Refuses anything but a regular file."""
    # O_NONBLOCK lets a FIFO open return at once, so it can be refused below instead of hanging.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelFileError(f"{path}: not a regular file")
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def reading(path):
    """`with reading(path):` around reading a file: an OSError (a missing or unreadable file, a
    dangling link, an I/O error) becomes one ModelFileError line naming the file."""
    try:
        yield
    except OSError as e:
        raise ModelFileError(f"{e.filename or path}: cannot read ({e.strerror or e})") from None


def parse_json(raw: bytes) -> tuple[object, str | None]:
    """bytes -> (value, None), or (None, why the bytes are not JSON). `why` holds no file bytes."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "is not UTF-8 text"
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "is nested too deeply"
    except json.JSONDecodeError as e:
        return None, f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
    except ValueError:  # Python refuses to convert integers of more than 4300 digits
        return None, "holds a number too long to read"


def read_json_text(fh: BinaryIO, n: int, max_items: int) -> bytearray | None:
    """Up to `n` bytes of JSON text from `fh`, or None as soon as they hold more than `max_items`
    values and keys (parsing a hostile 100 MB text builds tens of millions of Python objects).

    Every item but the first follows one of , : [ { so their count bounds the items from above
    (the same bytes inside strings count too).
    """
    raw, items = bytearray(), 1
    while len(raw) < n:
        piece = fh.read(min(_SLICE, n - len(raw)))
        if not piece:
            break
        items += len(piece.translate(None, _NOT_BEFORE_ITEMS))
        if items > max_items:
            return None
        raw += piece
    return raw


def read_json_file(path: Path, what: str, max_items: int | None = None) -> object:
    """Parse a small JSON file (config.json, the shard index). `what` names it in messages;
    `max_items`, when given, bounds its values and keys before it is parsed. A file that cannot be
    read is one ModelFileError line, as is one that is not JSON."""
    with reading(path):
        fh, size = open_regular(path)
        with fh:
            if size > MAX_JSON_BYTES:
                raise ModelFileError(f"{path}: {size} bytes is too large for a {what}")
            # What the file holds, not the cap: read(n) sets aside n bytes before it reads any.
            raw = fh.read(size + 1) if max_items is None else read_json_text(fh, size + 1, max_items)
    if raw is None:
        raise ModelFileError(f"{path}: {what} holds more than {max_items} JSON items")
    value, problem = parse_json(raw)
    if problem is not None:
        raise ModelFileError(f"{path}: {what} {problem}")
    return value
