"""When the next probe of a switched-off workload is due (pure timing, no judging).

Spacing starts at ``probe_initial`` (or, after a relapse, at the last off period's start
times the back-off), is multiplied by ``probe_backoff`` after every probe that was not
good, up to ``probe_max``, and drops to ``probe_min_spacing`` after a good one. Whatever
happens, two probe starts are never closer than ``probe_min_spacing``: every scheduling
goes through ``_not_before``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from router.config.speculation import SpecSettings

ProbeOutcome = Literal["good", "bad", "inconclusive"]


@dataclass
class ProbeSchedule:
    base_spacing: float = 0.0  # the spacing the current off period started with
    spacing: float = 0.0  # the current back-off spacing
    next_at: float | None = None  # None: not scheduled (key on, or a probe is out)
    last_at: float | None = None  # when the most recent probe was handed out
    ticket: int | None = None  # the probe currently out
    sent: int = 0
    last_outcome: ProbeOutcome | None = None

    def start(self, s: SpecSettings, now: float, relapse: bool) -> None:
        """The key was just turned off; ``relapse``: soon after it had come back."""
        if relapse and self.base_spacing:
            self.base_spacing = min(self.base_spacing * s.probe_backoff, s.probe_max)
        else:
            self.base_spacing = s.probe_initial
        self.spacing = self.base_spacing
        self.next_at = self._not_before(s, now + self.spacing)

    def stop(self) -> None:
        """The key was turned on again: nothing to probe."""
        self.next_at = None

    def due(self, now: float) -> bool:
        return self.ticket is None and self.next_at is not None and now >= self.next_at

    def claim(self, ticket: int, now: float) -> None:
        self.ticket = ticket
        self.last_at = now
        self.next_at = None  # known once this probe is judged
        self.sent += 1

    def lapsed(self, s: SpecSettings, now: float) -> bool:
        return (
            self.ticket is not None
            and self.last_at is not None
            and (now - self.last_at >= s.probe_timeout)
        )

    def settle(self, s: SpecSettings, outcome: ProbeOutcome, now: float) -> None:
        """The probe out came back (or lapsed): schedule the next one."""
        self.ticket = None
        self.last_outcome = outcome
        if outcome == "good":
            self.next_at = self._not_before(s, now)
            return
        self.spacing = min(max(self.spacing, s.probe_min_spacing) * s.probe_backoff, s.probe_max)
        last = self.last_at if self.last_at is not None else now
        self.next_at = self._not_before(s, last + self.spacing)

    def resize(self, s: SpecSettings) -> None:
        self.spacing = min(max(self.spacing, s.probe_min_spacing), s.probe_max)

    def _not_before(self, s: SpecSettings, at: float) -> float:
        if self.last_at is None:
            return at
        return max(at, self.last_at + s.probe_min_spacing)
