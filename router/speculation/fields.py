"""Typed readers of untrusted JSON fields, for the statistics parsers.

A reader returns None when the field is absent (or null) and raises ``BadField`` with a
closed-vocabulary reason when it is there but unusable; the parser entry points turn that
into ``Malformed``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from router.speculation.record import MalformedReason

Payload = Mapping[str, Any]
# For isinstance: JSON objects are dicts, and a dict matches the first entry at C speed;
# ``isinstance(x, Mapping)`` alone runs the ABC check, a Python-level call, every time
# (measured: a visible share of reading each stream's statistics).
MAPPING = (dict, Mapping)


class BadField(Exception):
    """Raised inside a parser on a malformed field; turned into ``Malformed`` at the top."""

    def __init__(self, reason: MalformedReason, field: str | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


# --- field readers -------------------------------------------------------------------


def section(obj: Payload, name: str) -> Payload | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, MAPPING):
        raise BadField("not_object", name)
    return value


def count(obj: Payload, name: str) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        raise BadField("bad_type", name)
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise BadField("bad_type", name)
        value = int(value)
    if not isinstance(value, int):
        raise BadField("bad_type", name)
    if value < 0:
        raise BadField("negative", name)
    return value


def first_count(obj: Payload, *names: str) -> int | None:
    for name in names:
        value = count(obj, name)
        if value is not None:
            return value
    return None


def ratio(obj: Payload, name: str) -> float | None:
    """An optional reported rate: anything unusable is dropped, the counts decide."""
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def histogram(value: Any) -> dict[int, int] | None:
    """``{accepted_count: rounds}`` from a dict (keys maybe strings) or a list; None if bad."""
    if isinstance(value, MAPPING):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return None
    hist: dict[int, int] = {}
    for key, rounds in items:
        try:
            j = int(key)
        except (TypeError, ValueError, OverflowError):
            return None
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0 or j < 0:
            return None
        if j > 4096:  # no speculative decoder drafts this many tokens a round
            return None
        hist[j] = hist.get(j, 0) + rounds
    return hist


def per_position_from(hist: Mapping[int, int]) -> tuple[int, ...]:
    """Accepted tokens at each draft position: a round that accepted j covers positions < j."""
    longest = max((j for j, n in hist.items() if n), default=0)
    return tuple(sum(n for j, n in hist.items() if j > pos) for pos in range(longest))
