"""Is speculation actually happening on a backend? (pure)

A backend configured as speculative that reports no draft tokens over a window of
responses is flagged, instead of silently looking like 0 % acceptance (seed 001: speculation
configured but stripped; seed 003: 0.0 for a whole run).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class ObservedWindow:
    size: int = 20
    _drafted: deque[bool] = field(default_factory=deque)

    def add(self, drafted_any: bool) -> None:
        self._drafted.append(drafted_any)
        while len(self._drafted) > self.size:
            self._drafted.popleft()

    @property
    def observed(self) -> bool | None:
        """True: drafts seen in the window; False: a full window without any; None: too few."""
        if any(self._drafted):
            return True
        return False if len(self._drafted) >= self.size else None

    def reason(self) -> str | None:
        if self.observed is False:
            return (f"configured as speculative but reported no draft tokens in the last "
                    f"{self.size} responses")
        return None
