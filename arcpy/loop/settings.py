"""EngineSettings: how an Engine decodes (arcpy/loop/engine.py), one frozen record.

    Engine(device, "cuda", EngineSettings(device_loop=True, burst=8))

The engine's collaborators (the environment it reads its gates from, the fallback latch, the
step costs it shares) are not settings: Engine takes them as keywords of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from arcpy.codes import MAX_BURST
from arcpy.errors import InvalidArgumentError
from arcpy.loop.burst import MAX_SPINS


@dataclass(frozen=True)
class EngineSettings:
    device_loop: bool | None = None  # None: ARC_GRAPH_DEVICE_LOOP decides (unset: the loop wherever the device has one)
    burst: int = 4                   # steps a burst of the device loop runs, 1..MAX_BURST
    verify: bool | None = None       # the host path verifies every step; None: ARC_GRAPH_VERIFY_ALWAYS decides
    max_spins: int = MAX_SPINS       # the burst driver's polls of the ring before it calls a hang
    prefill: bool = True             # off: the prompt goes through the decode step token by token
    speculate: bool = True           # off: never a speculative step, even where the device has one
    prefix_cache: bool = True        # off: every prompt is prefilled whole
    prompt_cache_bytes: int | None = None  # device memory for earlier prefixes (None: the device's default)
    draft_memory: bool = True        # drafts also come from earlier sequences (off: from each sequence alone)

    def __post_init__(self) -> None:
        burst = self.burst
        if not (isinstance(burst, int) and 1 <= burst <= MAX_BURST):
            raise InvalidArgumentError(f"burst must be an integer in 1..{MAX_BURST}, got {burst!r}")


SETTING_NAMES = frozenset(f.name for f in fields(EngineSettings))
