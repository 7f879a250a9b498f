"""Synthetic records with exactly known figures, for the pure modules' tests."""

from __future__ import annotations

from router.bench.scorecard.plan import Cell
from router.bench.scorecard.records import CellRun, Measurement


def req(
    scenario: str = "spec-on",
    family: str = "chat",
    c: int = 1,
    *,
    ttft: float = 0.1,
    tokens: int = 11,
    tps: float = 10.0,
    drafted: int | None = None,
    accepted: int | None = None,
    lane: str | None = None,
    decision: str | None = None,
    ok: bool = True,
    error: str | None = None,
    cancelled: bool = False,
    e2e: float | None = None,
) -> Measurement:
    """A request whose first token came at ``ttft`` and whose ``tokens`` tokens decoded at
    exactly ``tps`` tokens/s after it."""
    speculating = scenario == "spec-on" if drafted is None else drafted > 0
    if drafted is None:
        drafted, accepted = (12, 6) if speculating else (0, 0)
    last = ttft + (tokens - 1) / tps
    return Measurement(
        scenario,
        family,
        c,
        stream=0,
        seq=0,
        prompt_index=0,
        ok=ok,
        cancelled=cancelled,
        status=200 if ok else 500,
        error=error,
        ttft=ttft if ok else None,
        last_token=last if ok else None,
        e2e=e2e if e2e is not None else last + 0.001,
        content_chunks=tokens,
        completion_tokens=tokens if ok else None,
        usage_reported=ok,
        drafted=drafted,
        accepted=accepted,
        steps=drafted // 3 if drafted else 0,
        num_draft_tokens=3 if speculating else 0,
        lane=lane or ("batching" if scenario == "batching" else "speculative"),
        decision=decision or "override->x",
    )


def cell(
    scenario: str,
    family: str,
    c: int,
    requests: list[Measurement],
    seconds: float,
    complete: bool = True,
) -> CellRun:
    for m in requests:
        m.scenario, m.family, m.concurrency = scenario, family, c
    return CellRun(
        Cell(scenario, family, c),
        runs=1,
        max_tokens=64,
        started=1.0,
        finished=1.0 + seconds,
        complete=complete,
        measurements=requests,
    )


def uniform(
    scenario: str,
    family: str,
    c: int,
    *,
    ttft: float,
    tps: float,
    agg: float,
    tokens: int = 11,
    n: int | None = None,
    **kw: object,
) -> CellRun:
    """A cell of ``n`` (default c) identical requests lasting exactly as long as
    ``agg`` aggregate tok/s needs."""
    n = n or c
    requests = [
        req(scenario, family, c, ttft=ttft, tokens=tokens, tps=tps, **kw)  # type: ignore[arg-type]
        for _ in range(n)
    ]
    return cell(scenario, family, c, requests, seconds=n * tokens / agg)
