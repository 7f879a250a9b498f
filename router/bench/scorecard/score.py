"""Gates, readiness score, crossover and verdict of a scorecard run (pure). Every comparison
is computed once (``Figures``) and judged twice: pass or fail by the gates, points by the
score. The rule strings built here are what the scorecard prints."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.bench.common.stats import fmt, ratio
from router.bench.scorecard.records import CellRun, Summary, levels, pooled, shared_pair, summarize


@dataclass(frozen=True)
class Thresholds:
    min_speedup: float = 1.10  # interactive gate: spec-on decode tok/s / spec-off, at least
    full_speedup: float = 1.50  # the speed-up that earns every score point
    ttft_tolerance: float = 0.25  # interactive gate: spec-on TTFT at most 25 % above spec-off
    throughput_tolerance: float = 0.05  # auto at least 95 % of batching at the target level
    # The router's own spec.on_threshold: below it the auto-disable keeps speculation off.
    acceptance_floor: float = 0.45
    max_error_rate: float = 0.01
    crossover_margin: float = 0.05  # "pays": at least 5 % more aggregate tok/s
    target_concurrency: int | None = None  # None: the highest level measured


@dataclass(frozen=True)
class Gate:
    key: str
    title: str
    rule: str
    figure: str
    passed: bool | None  # None: not measured


@dataclass(frozen=True)
class ScorePart:
    key: str
    title: str
    weight: int
    rule: str
    figure: str
    points: float


@dataclass(frozen=True)
class Level:
    """Does spec-on beat the better of spec-off and batching at one level?"""

    concurrency: int
    spec_tps: float | None = None
    alternative: str | None = None
    alternative_tps: float | None = None
    pays: bool | None = None
    ratio: float | None = None  # spec_tps / alternative_tps


@dataclass(frozen=True)
class FamilyAcceptance:
    family: str
    drafted: int
    accepted: int
    acceptance: float | None
    passed: bool | None


@dataclass(frozen=True)
class Evaluation:
    """The judgement of a run; its fields (``dataclasses.asdict``) are its JSON."""

    score: int
    verdict: str
    recommendation: str
    stop_at_concurrency: int | None  # the lowest concurrency at which speculation stops paying
    gates: tuple[Gate, ...]
    score_parts: tuple[ScorePart, ...]
    levels: tuple[Level, ...]
    acceptance_by_family: tuple[FamilyAcceptance, ...]
    acceptance: float | None  # over every spec-on request
    thresholds: Thresholds

    def gate(self, key: str) -> Gate:
        return next(g for g in self.gates if g.key == key)


@dataclass(frozen=True)
class Figures:
    """What the gates and the score both judge: spec-on against spec-off at the lowest level
    (the interactive one), ``mine`` (auto when measured, else spec-on) against batching at the
    target level, each pair on the prompt families both sides measured."""

    spec: Summary | None  # every spec-on request
    everything: Summary
    low: int
    target: int | None
    mine: str
    on: Summary | None
    off: Summary | None
    ours: Summary | None
    batching: Summary | None
    active: float | None  # the share of successful spec-on requests that ran with a draft
    speedup: float | None  # decode tok/s, on / off
    ttft: float | None  # on / off
    throughput: float | None  # aggregate tok/s, ours / batching


def figures(runs: Sequence[CellRun], t: Thresholds) -> Figures:
    measured = levels(runs)
    low = measured[0] if measured else 1
    target = t.target_concurrency or (measured[-1] if measured else None)
    mine = "auto" if any(r.cell.scenario == "auto" for r in runs) else "spec-on"
    spec = pooled(runs, "spec-on")
    everything = summarize((m for r in runs for m in r.measurements), sum(r.seconds for r in runs))
    on, off = shared_pair(runs, "spec-on", "spec-off", low)
    ours, batching = shared_pair(runs, mine, "batching", target) if target else (None, None)
    active = spec.speculated / spec.ok if spec and spec.ok else None
    speedup, ttft = _compare(on, off, "decode_tps_avg"), _compare(on, off, "ttft_avg_ms")
    throughput = _compare(ours, batching, "agg_tps")
    return Figures(
        spec,
        everything,
        low,
        target,
        mine,
        on,
        off,
        ours,
        batching,
        active,
        speedup,
        ttft,
        throughput,
    )


def _compare(a: Summary | None, b: Summary | None, figure: str) -> float | None:
    return ratio(getattr(a, figure, None), getattr(b, figure, None))


def evaluate(
    runs: Sequence[CellRun], t: Thresholds = Thresholds(), complete: bool = True
) -> Evaluation:
    f = figures(runs, t)
    crossover = tuple(_level(runs, c, t) for c in levels(runs))
    stop_at = next((lv.concurrency for lv in crossover if lv.pays is False), None)
    gates = _gates(f, t)
    parts = _score_parts(f, crossover, t)
    passed = {g.key: g.passed for g in gates}
    # Where it stops paying; when the crossover does not say, a failed throughput gate does.
    stop = stop_at if stop_at is not None else (f.target if passed["throughput"] is False else None)
    verdict = _verdict(passed, stop, max(levels(runs), default=None))
    if not complete:  # "NOT READY: x" -> "NOT READY (partial run): x"
        head, colon, tail = verdict[0].partition(":")
        verdict = (f"{head} (partial run){colon}{tail}", verdict[1])
    score = round(sum(p.points for p in parts))
    by_family = _acceptance_by_family(runs, t)
    acceptance = f.spec.acceptance if f.spec else None
    return Evaluation(score, *verdict, stop_at, gates, parts, crossover, by_family, acceptance, t)


def _gates(f: Figures, t: Thresholds) -> tuple[Gate, ...]:
    """Each gate: (figure, passed) when measured, else the reason it is not."""
    spec, every, on, off, rate = f.spec, f.everything, f.on, f.off, f.everything.error_rate
    speedup, ttft, throughput = f.speedup, f.ttft, f.throughput
    rows: list[tuple[str, str, str, str, tuple[str, bool] | None]] = [
        ("active", "Speculation active",
         "every successful spec-on request ran with a draft "
         "(`usage.speclane_spec.num_draft_tokens` > 0)",
         "no successful spec-on request",
         (f"{spec.speculated}/{spec.ok} spec-on requests speculated", spec.speculated == spec.ok)
         if spec and spec.ok else None),
        ("errors", "Errors", f"failed requests at most {t.max_error_rate:.0%} of all",
         "no request finished",
         (f"{every.errors} of {every.requests} requests failed ({rate:.1%})",
          rate <= t.max_error_rate) if rate is not None else None),
        ("acceptance", "Acceptance floor (model pair)",
         f"accepted / drafted draft tokens over every spec-on request at least "
         f"{t.acceptance_floor:.2f} (the router's own re-enable threshold)",
         "no drafted tokens reported",
         (f"{spec.acceptance:.2f} ({spec.accepted}/{spec.drafted} drafted tokens)",
          spec.acceptance >= t.acceptance_floor)
         if spec and spec.acceptance is not None else None),
        ("interactive", f"Interactive (c={f.low}): TTFT and decode speed",
         f"at concurrency {f.low}, spec-on vs spec-off on the same prompts: decode tok/s "
         f"at least {t.min_speedup:.2f}x and TTFT at most {1 + t.ttft_tolerance:.2f}x "
         "(speculation cannot make the first token earlier: it goes out before any draft)",
         "spec-on or spec-off not measured",
         (f"decode {off.decode_tps_avg:.1f} → {on.decode_tps_avg:.1f} tok/s ({speedup:.2f}x); "
          f"TTFT {off.ttft_avg_ms:.0f} → {on.ttft_avg_ms:.0f} ms ({ttft:.2f}x)",
          speedup >= t.min_speedup and ttft <= 1 + t.ttft_tolerance)
         if on and off and speedup is not None and ttft is not None else None),
        ("throughput", f"No throughput regression (c={f.target})",
         f"at the target concurrency, {f.mine} aggregate tok/s at least "
         f"{1 - t.throughput_tolerance:.2f}x the batching lane's on the same prompts",
         "nothing measured" if f.target is None else f"{f.mine} or batching not measured",
         (f"{f.mine} {f.ours.agg_tps:.1f} vs batching {f.batching.agg_tps:.1f} tok/s "
          f"({throughput:.2f}x)", throughput >= 1 - t.throughput_tolerance)
         if f.ours and f.batching and throughput is not None else None),
    ]  # fmt: skip
    return tuple(
        Gate(key, title, rule, *(judged or (missing, None)))
        for key, title, rule, missing, judged in rows
    )


def _score_parts(f: Figures, crossover: tuple[Level, ...], t: Thresholds) -> tuple[ScorePart, ...]:
    """Each part: ``weight`` x a share in [0, 1] of its figure; 0 when not measured."""
    tol, floor = t.ttft_tolerance, 1 - t.throughput_tolerance
    acceptance = f.spec.acceptance if f.spec else None
    table: list[tuple[str, str, int, str, float | None, str, Callable[[float], float]]] = [
        ("active", "Speculation active", 10,
         "10 x share of spec-on requests that ran with a draft", f.active, "{:.0%}", lambda v: v),
        ("errors", "Reliability", 10, "10 x (1 - error rate / 10 %), at least 0",
         f.everything.error_rate, "{:.1%} errors", lambda v: 1 - v / 0.10),
        ("acceptance", "Acceptance", 20,
         f"20 x acceptance / {t.acceptance_floor:.2f}, at most 20", acceptance, "{:.2f}",
         lambda v: v / t.acceptance_floor),
        ("speedup", f"Decode speed-up (c={f.low})", 25,
         f"25 x (speed-up - 1) / {t.full_speedup - 1:.2f}, between 0 and 25", f.speedup,
         "{:.2f}x", lambda v: (v - 1) / (t.full_speedup - 1)),
        ("ttft", f"TTFT (c={f.low})", 10,
         f"10 up to {1 + tol:.2f}x spec-off's TTFT, falling linearly to 0 at {1 + 2 * tol:.2f}x",
         f.ttft, "{:.2f}x", lambda v: (1 + 2 * tol - v) / tol),
        ("throughput", f"Throughput (c={f.target})", 15,
         f"15 from {floor:.2f}x batching's aggregate tok/s up, falling linearly to 0 at 0.50x",
         f.throughput, "{:.2f}x", lambda v: (v - 0.5) / (floor - 0.5)),
    ]  # fmt: skip
    parts = [
        ScorePart(key, title, weight, rule, fmt(value, pattern, "n/a"), points)
        for key, title, weight, rule, value, pattern, share in table
        for points in [0.0 if value is None else weight * max(0.0, min(1.0, share(value)))]
    ]
    judged = [lv for lv in crossover if lv.pays is not None]
    paying = sum(1 for lv in judged if lv.pays)
    figure, points = (
        (f"{paying}/{len(judged)} levels", 10 * paying / len(judged)) if judged else ("n/a", 0.0)
    )
    rule = "10 x share of measured levels at which speculation pays"
    parts.append(ScorePart("range", "Concurrency range", 10, rule, figure, points))
    return tuple(parts)


def _level(runs: Sequence[CellRun], c: int, t: Thresholds) -> Level:
    """spec-on against the alternative hardest to beat at level ``c``, on shared prompts."""
    candidates = []
    for alt in ("spec-off", "batching"):
        on, other = shared_pair(runs, "spec-on", alt, c)
        if on and other and on.agg_tps is not None and other.agg_tps is not None:
            pays = on.agg_tps >= (1 + t.crossover_margin) * other.agg_tps
            rate = ratio(on.agg_tps, other.agg_tps)
            candidates.append(Level(c, on.agg_tps, alt, other.agg_tps, pays, rate))
    # Hardest: one that does not pay first, then the lowest ratio (the first of equals).
    return min(
        candidates,
        key=lambda lv: (lv.pays is not False, lv.ratio if lv.ratio is not None else float("inf")),
        default=Level(c),
    )


def _verdict(passed: dict[str, bool | None], stop: int | None, top: int | None) -> tuple[str, str]:
    """``stop``: the level at which speculation stops paying; ``top``: the highest measured."""
    if passed["active"] is None or passed["interactive"] is None:
        return "INCONCLUSIVE", "Not enough was measured to judge speculation; run the whole matrix."
    if not passed["active"]:
        return (
            "NOT READY: speculation is not running",
            "Spec-on requests came back without draft statistics: check that the "
            "speculative lane has a draft model and that nothing switched it off.",
        )
    if not passed["errors"]:
        return (
            "NOT READY: requests failed",
            "Fix the failing requests first (see the errors column), then run again.",
        )
    if not passed["interactive"] or not passed["acceptance"]:
        return (
            "NOT READY: keep speculation off for this model pair here",
            "Speculation does not pay for these clients on this machine: turn it off "
            "(`[lanes.speculative] enabled = false`, or leave it to the router's "
            "auto-disable, which measures the same thing per workload).",
        )
    if stop is not None and stop > 1:
        return (
            f"READY FOR INTERACTIVE USE: below concurrency {stop}",
            f"Enable speculation for interactive clients and stop using it from "
            f"{stop} concurrent requests: `[routing] spec_busy_at = {stop - 1}`, "
            f"`spec_free_at = {max(0, stop - 2)}`.",
        )
    if stop is not None:
        return (
            "NOT READY: speculation does not pay even alone",
            "Keep speculation off (`[lanes.speculative] enabled = false`).",
        )
    return (
        "READY: enable speculation",
        f"Speculation pays at every level measured (up to c={top}); the router's "
        "defaults keep it for one request at a time and move the rest to batching.",
    )


def _acceptance_by_family(runs: Sequence[CellRun], t: Thresholds) -> tuple[FamilyAcceptance, ...]:
    out = []
    for family in dict.fromkeys(r.cell.family for r in runs if r.cell.scenario == "spec-on"):
        s = pooled(runs, "spec-on", families=[family])
        assert s is not None
        passed = None if s.acceptance is None else s.acceptance >= t.acceptance_floor
        out.append(FamilyAcceptance(family, s.drafted, s.accepted, s.acceptance, passed))
    return tuple(out)
