"""Small, exact statistics and Markdown tables used by every benchmark (pure)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in [0, 100]; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are not None; None when there are none."""
    real = [v for v in values if v is not None]
    return sum(real) / len(real) if real else None


def fmt(value: float | None, pattern: str = "{:.2f}", missing: str = "-") -> str:
    """A table's cell: ``value`` in ``pattern``, or ``missing`` when there is none."""
    return missing if value is None else pattern.format(value)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either is missing or b is zero."""
    return a / b if a is not None and b else None


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """A Markdown table's lines; ``align``: one letter per column, ``r`` right-aligned."""
    rule = ["---:" if a == "r" else "---" for a in align.ljust(len(header), "l")]
    return [_row(header), _row(rule), *map(_row, rows)]


def _row(cells: Sequence[object]) -> str:
    return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"
