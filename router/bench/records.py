"""The raw records of a scorecard run: one per request, one per cell (pure data).

Times are seconds from ``time.perf_counter()``: ``started``/``finished`` of a cell and
``started`` of a request are relative to the start of the run, a request's other times
relative to its own start. The JSON report stores these records as they are, so every
figure of the scorecard can be recomputed from it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from router.bench.matrix import Cell


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

    @property
    def speculated(self) -> bool:
        return bool(self.num_draft_tokens)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "decode_tps": self.decode_tps}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**fields)


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

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.cell.scenario, "family": self.cell.family,
            "concurrency": self.cell.concurrency, "runs": self.runs,
            "max_tokens": self.max_tokens, "started": self.started,
            "finished": self.finished, "complete": self.complete,
            "measurements": [m.to_json() for m in self.measurements],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CellRun:
        cell = Cell(data["scenario"], data["family"], data["concurrency"])
        return cls(cell, data["runs"], data["max_tokens"], data["started"], data["finished"],
                   data["complete"], [Measurement.from_json(m) for m in data["measurements"]])
