"""The last minutes of acceptance, decode speed and request rate, for the status page.

Every ``interval`` seconds a sample of a few metric totals (requests, drafted and accepted
draft tokens, the decode-speed histogram's sum and count per speculative label) is kept in
a ring of ``keep`` samples; the page's charts are the differences between neighbours. The
metrics stay the one source of truth: nothing here is counted twice.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from router.metrics import Metrics
from router.periodic import Periodic

INTERVAL = 5.0  # seconds between samples
KEEP = 73  # samples: six minutes of intervals


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # wall clock
    requests: float
    drafted: float
    accepted: float
    decode: dict[str, tuple[float, float]]  # speculative "true"/"false" -> (sum, count)


def _total(families: Iterable[Any], suffix: str = "_total") -> float:
    return sum(s.value for f in families for s in f.samples if s.name.endswith(suffix))


def _decode(metrics: Metrics) -> dict[str, tuple[float, float]]:
    sums: dict[str, list[float]] = {}
    for family in metrics.decode_tps.collect():
        for s in family.samples:
            label = s.labels.get("speculative", "false")
            pair = sums.setdefault(label, [0.0, 0.0])
            if s.name.endswith("_sum"):
                pair[0] += s.value
            elif s.name.endswith("_count"):
                pair[1] += s.value
    return {k: (v[0], v[1]) for k, v in sums.items()}


def take(metrics: Metrics, at: float) -> Sample:
    return Sample(
        at=at,
        requests=_total(metrics.requests.collect()),
        drafted=_total(metrics.spec_draft_tokens.collect()),
        accepted=_total(metrics.spec_accepted_tokens.collect()),
        decode=_decode(metrics),
    )


def points(samples: list[Sample]) -> list[dict[str, Any]]:
    """One point per interval between neighbouring samples (pure): acceptance over the
    drafts of the interval, mean decode speed of the requests that finished in it (with and
    without speculation), requests per second. None where the interval had none."""
    out = []
    for before, after in itertools.pairwise(samples):
        seconds = after.at - before.at
        drafted = after.drafted - before.drafted
        point: dict[str, Any] = {
            "at": round(after.at, 3),
            "requests_per_s": round((after.requests - before.requests) / seconds, 4)
            if seconds > 0
            else None,
            "drafted": drafted,
            "acceptance": round((after.accepted - before.accepted) / drafted, 4)
            if drafted > 0
            else None,
        }
        for label, name in (("true", "decode_tps_spec"), ("false", "decode_tps_plain")):
            s1, c1 = after.decode.get(label, (0.0, 0.0))
            s0, c0 = before.decode.get(label, (0.0, 0.0))
            point[name] = round((s1 - s0) / (c1 - c0), 3) if c1 > c0 else None
        out.append(point)
    return out


class History:
    def __init__(self, metrics: Metrics, *, interval: float = INTERVAL, keep: int = KEEP) -> None:
        self.metrics = metrics
        self.interval = interval
        self.samples: deque[Sample] = deque(maxlen=keep)

    def sample(self, at: float | None = None) -> None:
        self.samples.append(take(self.metrics, time.time() if at is None else at))

    def to_json(self) -> dict[str, Any]:
        return {"interval": self.interval, "points": points(list(self.samples))}


@asynccontextmanager
async def history_sampling(history: History) -> AsyncIterator[None]:
    sampling = Periodic("speclane-status-history", history.sample, history.interval)
    sampling.start()
    yield
    await sampling.stop()
