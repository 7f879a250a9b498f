"""A scorecard run's result and its files: ``scorecard.json`` (every raw record, read back
by ``--render``), ``scorecard.md``, and the charts ``plot.py`` draws."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from router.bench.common.stats import table
from router.bench.scorecard.pair_rules import pair_rule_from_bench, rules_to_toml
from router.bench.scorecard.plan import SCENARIOS, Cell, MatrixSpec, Plan
from router.bench.scorecard.progress import clock
from router.bench.scorecard.prompts import FAMILIES
from router.bench.scorecard.records import CellRun, Measurement, Summary, cell_summary, pooled
from router.bench.scorecard.score import Evaluation, Thresholds, evaluate

SCHEMA = "speclane-scorecard/1"
PLAN_SPEC = ("runs", "max_tokens", "long_prompt_chars")  # what a plan may cut of the spec


@dataclass
class Result:
    requested: MatrixSpec
    plan: Plan
    thresholds: Thresholds
    environment: dict[str, Any] = field(default_factory=dict)
    warmup: list[Measurement] = field(default_factory=list)
    runs: list[CellRun] = field(default_factory=list)
    complete: bool = False
    stopped: str | None = None  # why the run ended early
    budget: float | None = None
    duration: float = 0.0

    def evaluation(self) -> Evaluation:
        return evaluate(self.runs, self.thresholds, self.complete)

    @property
    def model(self) -> str | None:
        return self.environment.get("model")

    @property
    def draft(self) -> str | None:
        return self.environment.get("draft_model")


def to_json(result: Result, evaluation: Evaluation | None = None) -> dict[str, Any]:
    ev = evaluation or result.evaluation()
    plan = result.plan
    return {
        "schema": SCHEMA,
        "complete": result.complete,
        "stopped": result.stopped,
        "duration_s": round(result.duration, 3),
        "environment": result.environment,
        "settings": {
            "requested": asdict(result.requested),
            "plan": {
                **{k: list(getattr(plan, k)) for k in ("scenarios", "families", "concurrency")},
                **{k: getattr(plan.spec, k) for k in PLAN_SPEC},
                "cells": [asdict(c) for c in plan.cells],
                "reductions": list(plan.reductions),
                "estimate_s": plan.estimate,
                "budget_s": result.budget,
            },
            "scenarios": {
                name: {"title": s.title, "how": s.how}
                for name, s in SCENARIOS.items()
                if name in plan.scenarios
            },
        },
        "warmup": [m.to_json() for m in result.warmup],
        "cells": [{**run.to_json(), "summary": cell_summary(run).to_json()} for run in result.runs],
        "evaluation": ev.to_json(),
        "pairs": [pair(result, ev)],
    }


def pair(result: Result, ev: Evaluation) -> dict[str, Any]:
    """The measured acceptance of the (target, draft) pair, for the pair allow/deny list."""
    spec, env = pooled(result.runs, "spec-on"), result.environment
    return {
        "target": result.model,
        "draft": result.draft,
        "num_draft_tokens": env.get("num_draft_tokens"),
        "acceptance": ev.pooled_acceptance,
        "drafted": spec.drafted if spec else 0,
        "accepted": spec.accepted if spec else 0,
        "acceptance_by_family": {a.family: a.acceptance for a in ev.acceptance},
        "floor": result.thresholds.acceptance_floor,
        "passed_floor": ev.gate("acceptance").passed,
        "measured_at": env.get("date"),
        "hardware": (env.get("hardware") or {}).get("mlx_device"),
    }


def from_json(data: dict[str, Any]) -> Result:
    if data.get("schema") != SCHEMA:
        raise ValueError(f"not a speclane scorecard (schema {data.get('schema')!r})")
    asked, p = data["settings"]["requested"], data["settings"]["plan"]
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in asked.items()}
    requested = MatrixSpec(**fields)
    spec = requested.with_(**{k: p[k] for k in PLAN_SPEC})
    plan = Plan(spec, tuple(Cell(**c) for c in p["cells"]), tuple(p["reductions"]), p["estimate_s"])
    return Result(
        requested,
        plan,
        Thresholds(**data["evaluation"]["thresholds"]),
        data["environment"],
        [Measurement.from_json(m) for m in data["warmup"]],
        [CellRun.from_json(c) for c in data["cells"]],
        data["complete"],
        data["stopped"],
        p["budget_s"],
        data["duration_s"],
    )


CHARTS = {
    "ttft_by_concurrency.png": "TTFT by concurrency",
    "tps_by_concurrency.png": "Tokens per second by concurrency",
    "acceptance_by_family.png": "Acceptance by prompt family",
}


def write(
    result: Result, out_dir: Path, charts: Sequence[str] = (), evaluation: Evaluation | None = None
) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    ev = evaluation or result.evaluation()
    paths = {"json": out_dir / "scorecard.json", "markdown": out_dir / "scorecard.md"}
    paths["json"].write_text(json.dumps(to_json(result, ev), indent=1) + "\n", encoding="utf-8")
    paths["markdown"].write_text(render(result, ev, charts), encoding="utf-8")
    return paths


def render(result: Result, ev: Evaluation, charts: Sequence[str] = ()) -> str:
    sections = (
        _headline(result, ev),
        _environment(result),
        _gates(ev),
        _crossover(ev),
        _acceptance(ev),
        _score(ev),
        _pair_rule(result, ev),
        _scenarios(result),
        _charts(charts),
        _errors(result.runs),
        _method(result),
    )
    out = ["# Speculative decoding readiness scorecard", ""]
    return "\n".join(out + [line for lines in sections for line in lines]).rstrip() + "\n"


def _table(heading: Sequence[str], columns: str, rows: Iterable[Sequence[object]]) -> list[str]:
    """``heading``, then a table (``columns``: the alignment letters, then ``|`` and the
    header cells)."""
    align, header = columns.split("|", 1)
    return [*heading, *table(header.split("|"), rows, align)]


def _headline(result: Result, ev: Evaluation) -> list[str]:
    lines = [
        f"**Verdict: {ev.verdict}**",
        "",
        f"Readiness score: **{ev.score}/100** (rule below).",
        "",
        f"> {ev.recommendation}",
        "",
    ]
    if not result.complete:
        lines += [
            f"_This run is partial: {result.stopped or 'stopped early'}. Figures cover "
            "the cells measured; gates with nothing to judge say so._",
            "",
        ]
    return lines


def _environment(result: Result) -> list[str]:
    env, plan = result.environment, result.plan
    ver, hw, load = (env.get(k) or {} for k in ("versions", "hardware", "load_average"))
    draft = env.get("draft_model") or "unknown"
    if env.get("num_draft_tokens"):
        draft += f" ({env['num_draft_tokens']} draft tokens per round)"
    requests = sum(len(r.measurements) for r in result.runs)
    run = (
        f"{'complete' if result.complete else 'partial'}, {clock(result.duration)}, "
        f"{len(result.runs)}/{len(plan.cells)} cells, {requests} requests"
    )
    parts = (
        hw.get("machine"),
        hw.get("cpu"),
        f"{hw.get('cpus')} CPUs",
        f"{hw.get('memory_gib')} GiB",
        f"MLX device {hw.get('mlx_device')}",
    )
    machine = ", ".join(str(x) for x in parts if x)
    if "openblas_preloaded" in hw:
        machine += ", OpenBLAS " + ("preloaded" if hw["openblas_preloaded"] else "not found")
    rows = [
        ("Model", env.get("model") or "unknown"),
        ("Draft", draft),
        ("Date (UTC)", env.get("date") or "?"),
        ("Run", run),
        ("Router", env.get("router") or "?"),
        (
            "speclane / mlx / mlx-lm",
            " / ".join(str(ver.get(k)) for k in ("speclane", "mlx", "mlx-lm")),
        ),
        ("Hardware", machine or "?"),
        ("Machine load", _load_text(load)),
    ]
    said = [
        f"{lane['lane']} lane: {lane['speculation']['reason']}"
        for lane in env.get("lanes") or ()
        if (lane.get("speculation") or {}).get("reason")
    ]
    rows += [("Router says", "; ".join(said))] if said else []
    rows += [("Note", env["note"])] if env.get("note") else []
    return [
        "## Environment",
        "",
        "| | |",
        "| --- | --- |",
        *(f"| {k} | {_cell(v)} |" for k, v in rows),
        "",
    ]


def _load_text(load: dict[str, Any]) -> str:
    start, end = load.get("start"), load.get("end")
    if not start:
        return "unknown"
    text = f"1-minute load average {start[0]} at the start"
    if end:
        text += f", {end[0]} at the end"
    return text + " (other work on the machine adds noise to every figure)"


def _gates(ev: Evaluation) -> list[str]:
    marks = {True: "✅ passed", False: "❌ failed", None: "⚪ not measured"}
    rows = [(g.title, _cell(g.rule), _cell(g.figure), marks[g.passed]) for g in ev.gates]
    return [*_table(("## Gates", ""), "llll|Gate|Rule|Figure|Result", rows), ""]


def _crossover(ev: Evaluation) -> list[str]:
    heading = (
        "## Where speculation stops paying",
        "",
        "Aggregate tokens per second of the speculative lane with speculation on, "
        "against the better of the two ways of serving the same prompts without it "
        f"(spec-off, batching), at each concurrency. It pays when it is at least "
        f"{1 + ev.thresholds.crossover_margin:.2f}x the alternative.",
        "",
    )
    pays = {True: "yes", False: "**no**", None: "n/a"}
    rows = [
        (
            lv.concurrency,
            _num(lv.spec_tps),
            lv.alternative or "n/a",
            _num(lv.alternative_tps),
            _num(lv.ratio, "{:.2f}x"),
            pays[lv.pays],
        )
        for lv in ev.levels
    ]
    lines = _table(
        heading, "rrlrrl|Concurrency|spec-on tok/s|Best alternative|Its tok/s|Ratio|Pays", rows
    )
    if ev.stop_at is not None:
        lines += ["", f"Speculation stops paying at **concurrency {ev.stop_at}**."]
    elif ev.levels:
        lines += ["", "Speculation pays at every concurrency measured."]
    return [*lines, ""]


def _acceptance(ev: Evaluation) -> list[str]:
    floor = ev.thresholds.acceptance_floor
    marks = {True: "passed", False: "**failed**", None: "n/a"}
    rows: list[tuple[object, ...]] = [
        (_family(a.family), a.drafted, a.accepted, _num(a.acceptance, "{:.2f}"), marks[a.passed])
        for a in ev.acceptance
    ]
    rows.append(("**all**", "", "", f"**{_num(ev.pooled_acceptance, '{:.2f}')}**", ""))
    columns = f"lrrrl|Family|Drafted|Accepted|Acceptance|Floor {floor:.2f}"
    lines = _table(("## Acceptance by prompt family", ""), columns, rows)
    return [*lines, ""]


def _score(ev: Evaluation) -> list[str]:
    heading = (
        f"## Readiness score: {ev.score}/100",
        "",
        "The sum of these components, rounded (the verdict comes from the gates, not from "
        "the score):",
        "",
    )
    rows = [(p.title, f"{p.points:.1f} / {p.weight}", p.figure, _cell(p.rule)) for p in ev.parts]
    return [*_table(heading, "lrll|Component|Points|Figure|Rule", rows), ""]


def _pair_rule(result: Result, ev: Evaluation) -> list[str]:
    """The measured pair as a [[gating.pairs]] rule, to record next to the configuration."""
    if result.draft is None or ev.pooled_acceptance is None:
        return []
    rule = pair_rule_from_bench(pair(result, ev), when=result.environment.get("date"))
    return [
        "## Model pair rule",
        "",
        "Paste into `speclane.toml` to record this measurement next to the pair; in strict "
        "mode a pair below `gating.acceptance_floor` is denied (`deny_below_floor`).",
        "",
        "```toml",
        rules_to_toml([rule]).rstrip(),
        "```",
        "",
    ]


SCENARIO_COLUMNS = (
    "lrrrrrrrrrrrl|Family|c|Requests|Errors|TTFT avg ms|TTFT p95 ms|Decode tok/s|"
    "Aggregate tok/s|E2E p95 ms|Drafted|Accepted|Acceptance|Lane chosen"
)


def _scenarios(result: Result) -> list[str]:
    lines = ["## Results by scenario", ""]
    for name in result.plan.scenarios:
        scenario = SCENARIOS[name]
        heading = (f"### {scenario.title} (`{name}`)", "", f"Sent with {scenario.how}.", "")
        runs = [r for r in result.runs if r.cell.scenario == name]
        lines += _table(heading, SCENARIO_COLUMNS, map(_scenario_row, runs))
        lines += [] if runs else ["| (not measured) |" + " |" * 12]
        lines.append("")
    return lines


def _scenario_row(run: CellRun) -> tuple[object, ...]:
    s, partial = cell_summary(run), "" if run.complete else " (partial)"
    return (
        f"{_family(run.cell.family)}{partial}",
        run.cell.concurrency,
        s.requests,
        s.errors,
        _num(s.ttft_avg_ms, "{:.0f}"),
        _num(s.ttft_p95_ms, "{:.0f}"),
        _num(s.decode_tps_avg),
        _num(s.agg_tps),
        _num(s.e2e_p95_ms, "{:.0f}"),
        s.drafted,
        s.accepted,
        _num(s.acceptance, "{:.2f}"),
        _lanes(s),
    )


def _lanes(s: Summary) -> str:
    if not s.lanes:
        return "n/a"
    text = ", ".join(f"{lane} {n}" for lane, n in sorted(s.lanes.items(), key=lambda kv: -kv[1]))
    if s.speculated and s.lanes.get("speculative"):
        text += f" ({s.speculated} with draft)"
    rules = {r: n for r, n in s.rules.items() if r not in ("override", "unknown")}
    if rules:
        text += "; " + ", ".join(f"{r} {n}" for r, n in sorted(rules.items()))
    return text


def _charts(charts: Sequence[str]) -> list[str]:
    images = [f"![{CHARTS.get(name, name)}]({name})" for name in charts]
    return ["## Charts", "", *images, ""] if images else []


def _errors(runs: Iterable[CellRun]) -> list[str]:
    errors = Counter(
        (r.cell.scenario, m.error)
        for r in runs
        for m in r.measurements
        if not m.ok and not m.cancelled
    )
    if not errors:
        return []
    rows = [(s, _cell(e or "unknown"), n) for (s, e), n in errors.most_common(10)]
    return [*_table(("## Errors", ""), "llr|Scenario|Error|Requests", rows), ""]


def _method(result: Result) -> list[str]:
    plan, spec = result.plan, result.plan.spec
    estimate = f"~{clock(plan.estimate)}" if plan.estimate is not None else "not estimated"
    budget = f"{clock(result.budget)}" if result.budget else "none"
    reductions = "; ".join(plan.reductions) if plan.reductions else "none"
    return [
        "## How this was measured",
        "",
        f"- Matrix: scenarios {', '.join(plan.scenarios)} x families "
        f"{', '.join(plan.families)} x concurrency {', '.join(map(str, plan.concurrency))}; "
        f"{len(plan.cells)} cells. A cell at concurrency c runs c client loops that each send "
        f"{spec.runs} request(s) back to back; every request streams at most "
        f"{spec.max_tokens} tokens, greedy (temperature 0). The long prompt is "
        f"{spec.long_prompt_chars} characters.",
        f"- Time budget {budget}, estimate {estimate} from the warm-up; reductions to fit "
        f"the budget: {reductions}.",
        f"- Warm-up: {len(result.warmup)} request(s) before measuring (not counted).",
        "- TTFT: from sending the request to the first non-empty content delta, queueing "
        "included. Decode tok/s: per request, (completion tokens - 1) / (last token time - "
        "first token time), averaged over requests. Aggregate tok/s: completion tokens of "
        "a cell / its wall time. E2E: to the end of the stream. p95: linear interpolation. "
        "Acceptance: accepted / drafted tokens from `usage.speclane_spec`.",
        "- Comparisons use only the prompt families measured for both sides at that "
        "concurrency. The raw measurement of every request is in `scorecard.json`.",
        "- Forced scenarios identify as the `speclane-bench` client; on a router the bench "
        "starts itself, that client has the speculative auto-disable off, so spec-on stays "
        "on. `auto` uses the default policy and the router's own routing and auto-disable.",
        "",
    ]


def _num(value: float | None, pattern: str = "{:.1f}") -> str:
    return "n/a" if value is None else pattern.format(value)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _family(name: str) -> str:
    family = FAMILIES.get(name)
    return family.title if family else name
