"""Sliding windows over recent speculative results (pure, bounded memory).

``AcceptanceWindow`` pools draft counts over the most recent ``size`` draft tokens or
verification rounds (acceptance = sum accepted / sum drafted, so a long answer weighs more
than a short one). ``SpeedWindow`` keeps the last ``size`` decode speeds and judges on
their median, which one request slowed by something else cannot move.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass

from router.config.speculation import WindowUnit


@dataclass(frozen=True, slots=True)
class WindowEntry:
    drafted: int
    accepted: int
    steps: int | None


@dataclass(frozen=True, slots=True)
class AcceptanceFigures:
    drafted: int
    accepted: int
    units: int  # draft tokens or verification rounds held, as the window counts them
    entries: int

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


class AcceptanceWindow:
    """The smallest run of most recent entries that covers ``size`` units.

    With ``unit="rounds"``, an entry whose source does not report verification rounds
    (LM Studio, llama.cpp per response) counts its draft tokens instead. Every entry is at
    least one unit, so the window never holds more than ``size`` entries.
    """

    def __init__(self, size: int, unit: WindowUnit = "tokens") -> None:
        self.size = size
        self.unit = unit
        self._entries: deque[WindowEntry] = deque()
        self._drafted = 0
        self._accepted = 0
        self._units = 0

    def add(self, drafted: int, accepted: int, steps: int | None = None) -> None:
        if drafted <= 0:
            return
        entry = WindowEntry(drafted, min(accepted, drafted), steps)
        self._entries.append(entry)
        self._account(entry, +1)
        # Drop the oldest while the rest still covers the window.
        while len(self._entries) > 1 and (
            self._units - self._units_of(self._entries[0]) >= self.size
        ):
            self._account(self._entries.popleft(), -1)

    def figures(self) -> AcceptanceFigures:
        return AcceptanceFigures(self._drafted, self._accepted, self._units, len(self._entries))

    def entries(self) -> tuple[WindowEntry, ...]:
        return tuple(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._drafted = self._accepted = self._units = 0

    def _units_of(self, entry: WindowEntry) -> int:
        if self.unit == "rounds" and entry.steps:
            return entry.steps
        return entry.drafted

    def _account(self, entry: WindowEntry, sign: int) -> None:
        self._drafted += sign * entry.drafted
        self._accepted += sign * entry.accepted
        self._units += sign * self._units_of(entry)


class SpeedWindow:
    """The last ``size`` decode speeds (tokens/s)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: deque[float] = deque(maxlen=size)

    def add(self, tokens_per_second: float) -> None:
        self._values.append(tokens_per_second)

    def median(self, min_samples: int = 1) -> float | None:
        if len(self._values) < max(1, min_samples):
            return None
        return statistics.median(self._values)

    def values(self) -> tuple[float, ...]:
        return tuple(self._values)

    def clear(self) -> None:
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)


ALL_WORKLOADS = "*"  # the model-wide baseline, used when a workload has none of its own


class BaselineSpeeds:
    """Decode speeds without speculation, per lane (or backend), model and workload, and per
    lane and model.

    Decode speed without speculation hardly depends on the content, so when a workload has
    too few samples of its own the model-wide window of the same lane stands in; lanes are
    never mixed (one lane's plain speed says nothing of another's, which may decode several
    sequences at once or run on other hardware). At most ``max_slots`` windows are kept, the
    least recently fed forgotten first.
    """

    def __init__(self, size: int, max_slots: int) -> None:
        self.size = size
        self.max_slots = max_slots
        self._windows: OrderedDict[tuple[str | None, str, str], SpeedWindow] = OrderedDict()

    def add(
        self, model: str, workload: str, tokens_per_second: float, lane: str | None = None
    ) -> None:
        for scope in dict.fromkeys((workload, ALL_WORKLOADS)):
            slot = (lane, model, scope)
            window = self._windows.get(slot)
            if window is None:
                window = self._windows[slot] = SpeedWindow(self.size)
            self._windows.move_to_end(slot)
            window.add(tokens_per_second)
        while len(self._windows) > self.max_slots:
            self._windows.popitem(last=False)

    def median(
        self, model: str, workload: str, min_samples: int, lane: str | None = None
    ) -> tuple[float | None, str | None]:
        """(median, "workload" | "model") from the most specific window of ``lane`` that
        has enough (samples recorded without a lane stand in for every lane)."""
        lanes = (lane, None) if lane is not None else (None,)
        for each in lanes:
            for scope, name in ((workload, "workload"), (ALL_WORKLOADS, "model")):
                window = self._windows.get((each, model, scope))
                median = None if window is None else window.median(min_samples)
                if median is not None:
                    return median, name
        return None, None
