"""Environment gates, read by value, and the process-wide fallback latch (docs/ARCHITECTURE.md,
section 3).

A flag is read by value, not by presence: 1/true/on/yes enable; 0/false/off/no and the empty
string are explicit refusals (so an operator can pin a gate off where something upstream sets
it); anything else is an error that names the variable, never a guess. The parser is
`arcpy.checks.read_flag`, shared with the variables read below this layer (ARC_OFFLINE).
"""

from __future__ import annotations

import logging
import threading
from typing import Mapping

from arcpy.checks import read_flag
from arcpy.devices.protocol import Capabilities
from arcpy.devices.sequence import SequenceSpec

log = logging.getLogger("arcpy")

DEVICE_LOOP = "ARC_GRAPH_DEVICE_LOOP"
GRAPH = "ARC_GRAPH"
VERIFY_ALWAYS = "ARC_GRAPH_VERIFY_ALWAYS"

# What an unset gate means. The device loop is on: it draws the same tokens as the host path
# (sampled ones too, by one definition) and is faster on every shape measured.
DEFAULTS = {DEVICE_LOOP: True, GRAPH: True, VERIFY_ALWAYS: False}


def read_all(environ: Mapping[str, str] | None = None) -> None:
    """Read every gate once, so that a bad value is an error on every backend, at start-up."""
    for name, default in DEFAULTS.items():
        read_flag(name, default, environ)


class FallbackLatch:
    """Once the device loop fails, it stays off for the process; the reason is logged once."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reason: str | None = None

    @property
    def latched(self) -> bool:
        return self.reason is not None

    def trip(self, reason: str) -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
        log.warning("arcpy: device loop disabled for this process: %s", reason)

    def clear(self) -> None:
        """For tests: a new process would start with the latch open."""
        with self._lock:
            self.reason = None


LATCH = FallbackLatch()


def device_loop_admission(requested: bool | None, capabilities: Capabilities, spec: SequenceSpec, *,
                          environ: Mapping[str, str] | None = None, latch: FallbackLatch = LATCH,
                          verify: bool | None = None) -> tuple[bool, str]:
    """(admitted, reason): whether `spec` runs on the device loop. `requested` and `verify` are
    explicit API/CLI choices; None defers to the environment (unset means on, where the backend
    has a loop). What the device can do is its own rule (Capabilities.admits). The reason names
    the first gate that refused."""
    if verify is None:
        verify = read_flag(VERIFY_ALWAYS, DEFAULTS[VERIFY_ALWAYS], environ)
    wanted = read_flag(DEVICE_LOOP, DEFAULTS[DEVICE_LOOP], environ) if requested is None else requested
    if not wanted:
        return False, f"{DEVICE_LOOP} is off"
    if verify:
        return False, f"{VERIFY_ALWAYS} is on: the host path verifies every step"
    admitted, reason = capabilities.admits(spec)
    if not admitted:
        return False, reason
    if latch.latched:
        return False, f"latched off earlier in this process: {latch.reason}"
    return True, "admitted"
