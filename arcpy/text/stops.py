"""Where a generation ends in its text: stop strings."""

from __future__ import annotations

from arcpy.checks import quoted
from arcpy.errors import InvalidArgumentError
from arcpy.text.codec import StreamDecoder

__all__ = ["StopStrings", "TextStream"]


class StopStrings:
    """Holds text back until it cannot be part of a stop string.

    `push(text)` -> (safe, hit): `safe` is text that is no part of any stop string; the longest
    tail that could begin one waits for the next push. `hit` is True once a stop string is
    complete: the text before it is released, the stop string and everything after are dropped,
    and later pushes release nothing. Where stop strings overlap, the first one to complete in
    the text wins, so the cut does not depend on how the text was split into pushes.
    `flush()` releases the waiting tail at the end of a stream that hit nothing. With no stop
    strings every push passes through whole.
    """

    def __init__(self, stops=()):
        if isinstance(stops, str) or not hasattr(stops, "__iter__"):
            raise InvalidArgumentError(f"stop strings must be a list of strings, got {type(stops).__name__}")
        stops = tuple(stops)
        for s in stops:
            if not isinstance(s, str) or not s:
                raise InvalidArgumentError(f"a stop string must be a non-empty string, got {quoted(s)}")
        self.stops = stops
        self._tail = ""
        self.hit = False

    def push(self, text: str) -> tuple[str, bool]:
        if not isinstance(text, str):
            raise InvalidArgumentError(f"StopStrings.push: text must be a str, got {type(text).__name__}")
        if self.hit:
            return "", True
        buf = self._tail + text
        # The first stop to complete wins (the longest, if several end together): the same cut
        # however the text was split into pushes.
        ends = [(i + len(s), i) for s in self.stops if (i := buf.find(s)) >= 0]
        if ends:
            self.hit, self._tail = True, ""
            return buf[:min(ends)[1]], True
        keep = self._partial(buf)
        self._tail = buf[len(buf) - keep:]
        return buf[:len(buf) - keep], False

    def _partial(self, buf: str) -> int:
        """Length of the longest tail of `buf` that a stop string starts with."""
        longest = max((len(s) for s in self.stops), default=1)
        for n in range(min(len(buf), longest - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def flush(self) -> str:
        rest, self._tail = self._tail, ""
        return rest


class TextStream:
    """Token ids in, final text out: a StreamDecoder followed by StopStrings. `push(id)` returns
    (text, hit) like StopStrings.push; `finish()` the rest at the end of a stream that hit no stop
    string."""

    def __init__(self, spec, stops=()):
        self.decoder = StreamDecoder(spec)
        self.stops = StopStrings(stops)

    def push(self, token_id: int) -> tuple[str, bool]:
        return self.stops.push(self.decoder.push(token_id))

    def finish(self) -> str:
        if self.stops.hit:
            return ""
        safe, hit = self.stops.push(self.decoder.flush())
        return safe if hit else safe + self.stops.flush()
