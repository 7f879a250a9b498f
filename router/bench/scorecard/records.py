"""The raw records of a scorecard run, one per request and one per cell, and their figures
(pure). ``scorecard.json`` stores the records as they are, so every figure can be recomputed.
Times are ``perf_counter`` seconds: a cell's span and a request's ``started`` from the start of
the run, a request's other times from its own start. Requests stopped by the user count
neither as results nor as errors."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from router.bench.common.stats import mean, percentile
from router.bench.scorecard.plan import Cell, LaneSpeed, Speeds

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def load(cls: type[T], data: dict[str, Any]) -> T:
    """A dataclass from its JSON, ignoring keys that are not its fields (computed figures)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class Measurement:
    """One streamed request, as the client saw it."""

    scenario: str
    family: str
    concurrency: int
    stream: int  # which of the cell's concurrent client loops sent it
    seq: int  # its position in that loop
    prompt_index: int
    started: float = 0.0
    ok: bool = False
    cancelled: bool = False  # stopped by the user (Ctrl-C): neither a result nor an error
    status: int | None = None
    error: str | None = None
    ttft: float | None = None  # to the first non-empty content delta
    last_token: float | None = None  # to the last non-empty content delta
    e2e: float | None = None  # to the end of the stream
    content_chunks: int = 0
    completion_tokens: int | None = None  # usage.completion_tokens, else content_chunks
    usage_reported: bool = False
    prompt_tokens: int | None = None
    drafted: int | None = None  # usage.speclane_spec.*, None when not reported
    accepted: int | None = None
    steps: int | None = None
    num_draft_tokens: int | None = None
    lane: str | None = None  # X-Speclane-Lane of the response: the lane that answered
    decision: str | None = None  # X-Speclane-Decision

    @property
    def decode_tps(self) -> float | None:
        """(completion_tokens - 1) / (last token - first token): tokens after the first."""
        tokens = self.completion_tokens
        if not self.ok or tokens is None or tokens < 2 or self.ttft is None:
            return None
        span = (self.last_token or 0.0) - self.ttft
        return (tokens - 1) / span if span > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "decode_tps": self.decode_tps}


@dataclass
class CellRun:
    """Every request of one cell, and the cell's wall-clock span."""

    cell: Cell
    runs: int
    max_tokens: int
    started: float = 0.0
    finished: float = 0.0
    complete: bool = False  # False: stopped by the user before every request finished
    measurements: list[Measurement] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return max(0.0, self.finished - self.started)

    def summary(self) -> Summary:
        return summarize(self.measurements, self.seconds)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        measured = [m.to_json() for m in self.measurements]
        return {**data.pop("cell"), **data, "measurements": measured}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CellRun:
        spans = {k: data[k] for k in ("runs", "max_tokens", "started", "finished", "complete")}
        measured = [load(Measurement, m) for m in data["measurements"]]
        return cls(load(Cell, data), **spans, measurements=measured)


@dataclass(frozen=True)
class Summary:
    """The figures of some requests (``summarize``); its fields are its JSON."""

    requests: int  # finished: successful + errors
    errors: int
    tokens: int
    seconds: float
    ttft_avg_ms: float | None
    ttft_p95_ms: float | None
    decode_tps_avg: float | None
    agg_tps: float | None
    e2e_p95_ms: float | None
    drafted: int
    accepted: int
    acceptance: float | None  # accepted / drafted
    speculated: int  # successful requests that ran with a draft
    lanes: dict[str, int]  # lane that answered -> requests
    rules: dict[str, int]  # routing rule -> requests

    @property
    def ok(self) -> int:
        return self.requests - self.errors

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None


def summarize(measurements: Iterable[Measurement], seconds: float) -> Summary:
    done = [m for m in measurements if not m.cancelled]
    ok = [m for m in done if m.ok]
    ttfts = [m.ttft * 1000 for m in ok if m.ttft is not None]
    e2es = [m.e2e * 1000 for m in ok if m.e2e is not None]
    tokens = sum(m.completion_tokens or 0 for m in ok)
    drafted, accepted = sum(m.drafted or 0 for m in ok), sum(m.accepted or 0 for m in ok)
    return Summary(
        requests=len(done),
        errors=len(done) - len(ok),
        tokens=tokens,
        seconds=seconds,
        ttft_avg_ms=mean(ttfts),
        ttft_p95_ms=percentile(ttfts, 95),
        decode_tps_avg=mean([m.decode_tps for m in ok]),
        agg_tps=tokens / seconds if ok and seconds > 0 else None,
        e2e_p95_ms=percentile(e2es, 95),
        drafted=drafted,
        accepted=accepted,
        acceptance=accepted / drafted if drafted else None,
        speculated=sum(1 for m in ok if m.num_draft_tokens),
        lanes=dict(Counter(m.lane or "unknown" for m in ok)),
        rules=dict(Counter(rule_of(m.decision) for m in ok)),
    )


def pooled(
    runs: Sequence[CellRun],
    scenario: str,
    concurrency: int | None = None,
    families: Iterable[str] | None = None,
) -> Summary | None:
    """One summary over the cells of ``scenario`` (at ``concurrency``, of ``families``);
    None when there are none. Aggregate tok/s: all their tokens over their summed time."""
    wanted = set(families) if families is not None else None
    chosen = [
        r
        for r in runs
        if r.cell.scenario == scenario
        and (concurrency is None or r.cell.concurrency == concurrency)
        and (wanted is None or r.cell.family in wanted)
    ]
    if not chosen:
        return None
    return summarize((m for r in chosen for m in r.measurements), sum(r.seconds for r in chosen))


def shared_pair(
    runs: Sequence[CellRun], a: str, b: str, concurrency: int
) -> tuple[Summary | None, Summary | None]:
    """Scenarios ``a`` and ``b`` at a level, each pooled over the families both measured with
    a result, so that a comparison compares the same prompts."""
    measured = [
        {
            r.cell.family
            for r in runs
            if r.cell.scenario == s
            and r.cell.concurrency == concurrency
            and any(m.ok for m in r.measurements)
        }
        for s in (a, b)
    ]
    if not (families := measured[0] & measured[1]):
        return None, None
    return pooled(runs, a, concurrency, families), pooled(runs, b, concurrency, families)


def rule_of(decision: str | None) -> str:
    """The routing rule of an ``X-Speclane-Decision`` value:
    ``preset=none,spec-lane-busy->batching`` -> ``spec-lane-busy``."""
    for part in (decision or "").split(","):
        if "->" in part:
            return part.split("->", 1)[0].strip() or "unknown"
    return "unknown"


def levels(runs: Sequence[CellRun]) -> tuple[int, ...]:
    return tuple(sorted({r.cell.concurrency for r in runs}))


def speeds_from(warmups: Sequence[Measurement]) -> Speeds | None:
    """Each lane's speed from its last successful warm-up request; None when none worked."""
    by: dict[str, LaneSpeed] = {}
    long_ttft: dict[str, float] = {}
    for m in warmups:
        if m.ok and m.ttft is not None and m.family == "long":
            long_ttft[m.scenario] = m.ttft
        elif m.ok and m.ttft is not None and (tps := m.decode_tps) is not None:
            by[m.scenario] = LaneSpeed(m.ttft, tps)
    factors = [t / by[s].ttft for s, t in long_ttft.items() if s in by and by[s].ttft > 0]
    return Speeds(by, max([1.0, *factors])) if by else None
