"""Gates, readiness score, crossover and verdict of a scorecard run (pure).

Comparisons are made on the same prompts: only families measured for both sides at the
level compared. The rules are stated in the scorecard itself (``report.py`` renders the
``rule`` strings built here), so a reader never has to read this file to trust a figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from router.bench.common.stats import ratio
from router.bench.scorecard.records import (
    CellRun,
    Summary,
    common_families,
    levels,
    pooled,
    summarize,
)


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
    """Does the speculative lane beat the non-speculative alternatives at one level?"""

    concurrency: int
    spec_tps: float | None
    alternative: str | None  # the better of spec-off and batching
    alternative_tps: float | None
    pays: bool | None

    @property
    def ratio(self) -> float | None:
        if self.spec_tps is None or not self.alternative_tps:
            return None
        return self.spec_tps / self.alternative_tps


@dataclass(frozen=True)
class FamilyAcceptance:
    family: str
    drafted: int
    accepted: int
    acceptance: float | None
    passed: bool | None


@dataclass(frozen=True)
class Evaluation:
    score: int
    verdict: str
    recommendation: str
    stop_at: int | None  # the lowest concurrency at which speculation stops paying
    gates: tuple[Gate, ...]
    parts: tuple[ScorePart, ...]
    levels: tuple[Level, ...]
    acceptance: tuple[FamilyAcceptance, ...]
    pooled_acceptance: float | None
    thresholds: Thresholds = field(default_factory=Thresholds)

    def gate(self, key: str) -> Gate:
        return next(g for g in self.gates if g.key == key)

    def to_json(self) -> dict[str, Any]:
        return {
            "score": self.score, "verdict": self.verdict,
            "recommendation": self.recommendation, "stop_at_concurrency": self.stop_at,
            "gates": [asdict(g) for g in self.gates],
            "score_parts": [asdict(p) for p in self.parts],
            "levels": [{**asdict(lv), "ratio": lv.ratio} for lv in self.levels],
            "acceptance_by_family": [asdict(a) for a in self.acceptance],
            "acceptance": self.pooled_acceptance,
            "thresholds": asdict(self.thresholds),
        }


def evaluate(runs: Sequence[CellRun], t: Thresholds = Thresholds(),
             complete: bool = True) -> Evaluation:
    measured = levels(runs)
    spec = pooled(runs, "spec-on")
    everything = _all(runs)
    low = measured[0] if measured else 1
    target = _target(t, measured)
    crossover = tuple(_level(runs, c, t) for c in measured)
    stop_at = next((lv.concurrency for lv in crossover if lv.pays is False), None)
    acceptance = _acceptance_by_family(runs, t)
    gates = (
        _active_gate(spec),
        _reliability_gate(everything, t),
        _acceptance_gate(spec, t),
        _interactive_gate(runs, low, t),
        _throughput_gate(runs, target, t),
    )
    parts = _score_parts(runs, spec, everything, low, target, crossover, t)
    score = round(sum(p.points for p in parts))
    verdict, recommendation = _verdict(gates, stop_at, crossover, target, complete)
    return Evaluation(score, verdict, recommendation, stop_at, gates, parts, crossover,
                      acceptance, spec.acceptance if spec else None, t)


# --- gates ---------------------------------------------------------------------------


def _active_gate(spec: Summary | None) -> Gate:
    rule = ("every successful spec-on request ran with a draft "
            "(`usage.speclane_spec.num_draft_tokens` > 0)")
    if spec is None or not spec.ok:
        return Gate("active", "Speculation active", rule, "no successful spec-on request", None)
    return Gate("active", "Speculation active", rule,
                f"{spec.speculated}/{spec.ok} spec-on requests speculated",
                spec.speculated == spec.ok)


def _reliability_gate(everything: Summary, t: Thresholds) -> Gate:
    rule = f"failed requests at most {t.max_error_rate:.0%} of all"
    if not everything.requests:
        return Gate("errors", "Errors", rule, "no request finished", None)
    rate = everything.error_rate or 0.0
    return Gate("errors", "Errors", rule,
                f"{everything.errors} of {everything.requests} requests failed ({rate:.1%})",
                rate <= t.max_error_rate)


def _acceptance_gate(spec: Summary | None, t: Thresholds) -> Gate:
    rule = (f"accepted / drafted draft tokens over every spec-on request at least "
            f"{t.acceptance_floor:.2f} (the router's own re-enable threshold)")
    if spec is None or spec.acceptance is None:
        return Gate("acceptance", "Acceptance floor (model pair)", rule,
                    "no drafted tokens reported", None)
    return Gate("acceptance", "Acceptance floor (model pair)", rule,
                f"{spec.acceptance:.2f} ({spec.accepted}/{spec.drafted} drafted tokens)",
                spec.acceptance >= t.acceptance_floor)


def _interactive_gate(runs: Sequence[CellRun], low: int, t: Thresholds) -> Gate:
    title = f"Interactive (c={low}): TTFT and decode speed"
    rule = (f"at concurrency {low}, spec-on vs spec-off on the same prompts: decode tok/s "
            f"at least {t.min_speedup:.2f}x and TTFT at most {1 + t.ttft_tolerance:.2f}x "
            "(speculation cannot make the first token earlier: its first round drafts and "
            "verifies before anything is sent)")
    on, off = _pair(runs, "spec-on", "spec-off", low)
    if on is None or off is None or None in (on.decode_tps_avg, off.decode_tps_avg,
                                             on.ttft_avg_ms, off.ttft_avg_ms):
        return Gate("interactive", title, rule, "spec-on or spec-off not measured", None)
    speedup = ratio(on.decode_tps_avg, off.decode_tps_avg)
    ttft = ratio(on.ttft_avg_ms, off.ttft_avg_ms)
    assert speedup is not None and ttft is not None
    figure = (f"decode {off.decode_tps_avg:.1f} → {on.decode_tps_avg:.1f} tok/s "
              f"({speedup:.2f}x); TTFT {off.ttft_avg_ms:.0f} → {on.ttft_avg_ms:.0f} ms "
              f"({ttft:.2f}x)")
    return Gate("interactive", title, rule, figure,
                speedup >= t.min_speedup and ttft <= 1 + t.ttft_tolerance)


def _throughput_gate(runs: Sequence[CellRun], target: int | None, t: Thresholds) -> Gate:
    title = f"No throughput regression (c={target})"
    mine = "auto" if any(r.cell.scenario == "auto" for r in runs) else "spec-on"
    rule = (f"at the target concurrency, {mine} aggregate tok/s at least "
            f"{1 - t.throughput_tolerance:.2f}x the batching lane's on the same prompts")
    if target is None:
        return Gate("throughput", title, rule, "nothing measured", None)
    ours, base = _pair(runs, mine, "batching", target)
    ratio_ = ratio(ours.agg_tps if ours else None, base.agg_tps if base else None)
    if ours is None or base is None or ratio_ is None:
        return Gate("throughput", title, rule, f"{mine} or batching not measured", None)
    figure = f"{mine} {ours.agg_tps:.1f} vs batching {base.agg_tps:.1f} tok/s ({ratio_:.2f}x)"
    return Gate("throughput", title, rule, figure, ratio_ >= 1 - t.throughput_tolerance)


# --- crossover -----------------------------------------------------------------------


def _level(runs: Sequence[CellRun], c: int, t: Thresholds) -> Level:
    best: Level | None = None  # the alternative hardest to beat, on shared prompts
    for alt in ("spec-off", "batching"):
        on, other = _pair(runs, "spec-on", alt, c)
        if on is None or other is None or on.agg_tps is None or other.agg_tps is None:
            continue
        level = Level(c, on.agg_tps, alt, other.agg_tps,
                      on.agg_tps >= (1 + t.crossover_margin) * other.agg_tps)
        if best is None or _harder(level, best):
            best = level
    return best or Level(c, None, None, None, None)


def _harder(a: Level, b: Level) -> bool:
    if a.pays != b.pays:
        return a.pays is False
    return (a.ratio if a.ratio is not None else float("inf")) < (
        b.ratio if b.ratio is not None else float("inf"))


# --- score ---------------------------------------------------------------------------


def _score_parts(runs: Sequence[CellRun], spec: Summary | None, everything: Summary,
                 low: int, target: int | None, crossover: tuple[Level, ...],
                 t: Thresholds) -> tuple[ScorePart, ...]:
    parts = []
    active = spec.speculated / spec.ok if spec and spec.ok else None
    parts.append(ScorePart("active", "Speculation active", 10,
                           "10 x share of spec-on requests that ran with a draft",
                           _fmt(active, "{:.0%}"), 10 * (active or 0.0)))
    rate = everything.error_rate
    parts.append(ScorePart("errors", "Reliability", 10,
                           "10 x (1 - error rate / 10 %), at least 0",
                           _fmt(rate, "{:.1%} errors"),
                           0.0 if rate is None else 10 * _clamp(1 - rate / 0.10)))
    acc = spec.acceptance if spec else None
    parts.append(ScorePart("acceptance", "Acceptance", 20,
                           f"20 x acceptance / {t.acceptance_floor:.2f}, at most 20",
                           _fmt(acc, "{:.2f}"),
                           0.0 if acc is None else 20 * _clamp(acc / t.acceptance_floor)))
    on, off = _pair(runs, "spec-on", "spec-off", low)
    speedup = ratio(on.decode_tps_avg if on else None, off.decode_tps_avg if off else None)
    parts.append(ScorePart(
        "speedup", f"Decode speed-up (c={low})", 25,
        f"25 x (speed-up - 1) / {t.full_speedup - 1:.2f}, between 0 and 25",
        _fmt(speedup, "{:.2f}x"),
        0.0 if speedup is None else 25 * _clamp((speedup - 1) / (t.full_speedup - 1))))
    ttft = ratio(on.ttft_avg_ms if on else None, off.ttft_avg_ms if off else None)
    tol = t.ttft_tolerance
    parts.append(ScorePart(
        "ttft", f"TTFT (c={low})", 10,
        f"10 up to {1 + tol:.2f}x spec-off's TTFT, falling linearly to 0 at {1 + 2 * tol:.2f}x",
        _fmt(ttft, "{:.2f}x"),
        0.0 if ttft is None else 10 * _clamp((1 + 2 * tol - ttft) / tol)))
    throughput = _throughput_ratio(runs, target)
    floor = 1 - t.throughput_tolerance
    parts.append(ScorePart(
        "throughput", f"Throughput (c={target})", 15,
        f"15 from {floor:.2f}x batching's aggregate tok/s up, falling linearly to 0 at 0.50x",
        _fmt(throughput, "{:.2f}x"),
        0.0 if throughput is None else 15 * _clamp((throughput - 0.5) / (floor - 0.5))))
    judged = [lv for lv in crossover if lv.pays is not None]
    paying = sum(1 for lv in judged if lv.pays)
    parts.append(ScorePart(
        "range", "Concurrency range", 10,
        "10 x share of measured levels at which speculation pays",
        f"{paying}/{len(judged)} levels" if judged else "n/a",
        10 * paying / len(judged) if judged else 0.0))
    return tuple(parts)


def _throughput_ratio(runs: Sequence[CellRun], target: int | None) -> float | None:
    if target is None:
        return None
    mine = "auto" if any(r.cell.scenario == "auto" for r in runs) else "spec-on"
    ours, base = _pair(runs, mine, "batching", target)
    return ratio(ours.agg_tps if ours else None, base.agg_tps if base else None)


# --- verdict -------------------------------------------------------------------------


def _verdict(gates: tuple[Gate, ...], stop_at: int | None, crossover: tuple[Level, ...],
             target: int | None, complete: bool) -> tuple[str, str]:
    g = {gate.key: gate for gate in gates}
    partial = "" if complete else " (partial run)"
    if g["active"].passed is None or g["interactive"].passed is None:
        return (f"INCONCLUSIVE{partial}",
                "Not enough was measured to judge speculation; run the whole matrix.")
    if not g["active"].passed:
        return (f"NOT READY{partial}: speculation is not running",
                "Spec-on requests came back without draft statistics: check that the "
                "speculative lane has a draft model and that nothing switched it off.")
    if not g["errors"].passed:
        return (f"NOT READY{partial}: requests failed",
                "Fix the failing requests first (see the errors column), then run again.")
    if not g["interactive"].passed or not g["acceptance"].passed:
        return (f"NOT READY{partial}: keep speculation off for this model pair here",
                "Speculation does not pay for these clients on this machine: turn it off "
                "(`[lanes.speculative] enabled = false`, or leave it to the router's "
                "auto-disable, which measures the same thing per workload).")
    top = max((lv.concurrency for lv in crossover), default=None)
    stop = stop_at if stop_at is not None else (
        target if g["throughput"].passed is False else None)
    if stop is not None and stop > 1:
        return (f"READY FOR INTERACTIVE USE{partial}: below concurrency {stop}",
                f"Enable speculation for interactive clients and stop using it from "
                f"{stop} concurrent requests: `[routing] spec_busy_at = {stop - 1}`, "
                f"`spec_free_at = {max(0, stop - 2)}`.")
    if stop is not None:
        return (f"NOT READY{partial}: speculation does not pay even alone",
                "Keep speculation off (`[lanes.speculative] enabled = false`).")
    return (f"READY{partial}: enable speculation",
            f"Speculation pays at every level measured (up to c={top}); the router's "
            "defaults keep it for one request at a time and move the rest to batching.")


# --- helpers -------------------------------------------------------------------------


def _acceptance_by_family(runs: Sequence[CellRun],
                          t: Thresholds) -> tuple[FamilyAcceptance, ...]:
    out = []
    for family in dict.fromkeys(r.cell.family for r in runs if r.cell.scenario == "spec-on"):
        s = pooled(runs, "spec-on", families=[family])
        assert s is not None
        acc = s.acceptance
        out.append(FamilyAcceptance(family, s.drafted, s.accepted, acc,
                                    None if acc is None else acc >= t.acceptance_floor))
    return tuple(out)


def _pair(runs: Sequence[CellRun], a: str, b: str,
          c: int) -> tuple[Summary | None, Summary | None]:
    families = common_families(runs, (a, b), c)
    if not families:
        return None, None
    return (pooled(runs, a, concurrency=c, families=families),
            pooled(runs, b, concurrency=c, families=families))


def _all(runs: Sequence[CellRun]) -> Summary:
    return summarize((m for r in runs for m in r.measurements), sum(r.seconds for r in runs))


def _target(t: Thresholds, measured: tuple[int, ...]) -> int | None:
    if t.target_concurrency is not None:
        return t.target_concurrency
    return measured[-1] if measured else None


def _clamp(x: float, low: float = 0.0, high: float = 1.0) -> float:
    return max(low, min(high, x))


def _fmt(value: float | None, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)
