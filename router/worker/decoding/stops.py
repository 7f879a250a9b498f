"""Stop strings over streamed text: emit only what cannot be the start of a stop string.

Stop strings are matched on decoded text, not token ids, because one string can be spelled by
many token sequences. Text that might be the beginning of a stop string is held back until the
next piece decides it; on a match the output is truncated before the stop string.
"""

from __future__ import annotations


class StopScanner:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> str:
        """The text that is now safe to emit; sets ``stopped`` when a stop string completed."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buffer = self._held + text
        found = _first_match(buffer, self.stops)
        if found is not None:
            cut, self.matched = found
            self.stopped = True
            self._held = ""
            return buffer[:cut]
        keep = _longest_partial(buffer, self.stops)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """At the end of generation the held-back text was not a stop string after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


def _first_match(buffer: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """(where, which) of the earliest stop string in ``buffer`` (the first listed on a tie)."""
    found = [(i, s) for s in stops if (i := buffer.find(s)) >= 0]
    return min(found, key=lambda f: f[0]) if found else None


def _longest_partial(buffer: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``buffer`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(buffer)), best, -1):
            if buffer.endswith(stop[:n]):
                best = n
                break
    return best
