"""A scorecard run's result and its files: ``scorecard.json`` (every raw record, read back by
``--render``), ``scorecard.md``, and the charts ``plot.py`` draws."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from router.bench.common.stats import fmt, table
from router.bench.scorecard.pair_rules import pair_rule_from_bench, rules_to_toml
from router.bench.scorecard.plan import SCENARIOS, Cell, MatrixSpec, Plan
from router.bench.scorecard.progress import clock
from router.bench.scorecard.prompts import FAMILIES
from router.bench.scorecard.records import CellRun, Measurement, Summary, load, pooled
from router.bench.scorecard.score import Evaluation, Thresholds, evaluate

SCHEMA = "speclane-scorecard/1"
PLAN_SPEC = ("runs", "max_tokens", "long_prompt_chars")  # what a plan may cut of the spec
CHARTS = {
    "ttft_by_concurrency.png": "TTFT by concurrency",
    "tps_by_concurrency.png": "Tokens per second by concurrency",
    "acceptance_by_family.png": "Acceptance by prompt family",
}


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


def to_json(result: Result, ev: Evaluation) -> dict[str, Any]:
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
                name: {"title": SCENARIOS[name].title, "how": SCENARIOS[name].how}
                for name in plan.scenarios
            },
        },
        "warmup": [m.to_json() for m in result.warmup],
        "cells": [{**run.to_json(), "summary": asdict(run.summary())} for run in result.runs],
        "evaluation": asdict(ev),
        "pairs": [pair(result, ev)],
    }


def pair(result: Result, ev: Evaluation) -> dict[str, Any]:
    """The measured acceptance of the (target, draft) pair, for the pair allow/deny list."""
    spec, env = pooled(result.runs, "spec-on"), result.environment
    return {
        "target": env.get("model"),
        "draft": env.get("draft_model"),
        "num_draft_tokens": env.get("num_draft_tokens"),
        "acceptance": ev.acceptance,
        "drafted": spec.drafted if spec else 0,
        "accepted": spec.accepted if spec else 0,
        "acceptance_by_family": {a.family: a.acceptance for a in ev.acceptance_by_family},
        "floor": result.thresholds.acceptance_floor,
        "passed_floor": ev.gate("acceptance").passed,
        "measured_at": env.get("date"),
        "hardware": (env.get("hardware") or {}).get("mlx_device"),
    }


def from_json(data: dict[str, Any]) -> Result:
    if data.get("schema") != SCHEMA:
        raise ValueError(f"not a speclane scorecard (schema {data.get('schema')!r})")
    requested, p = load(MatrixSpec, data["settings"]["requested"]), data["settings"]["plan"]
    spec = replace(requested, **{k: p[k] for k in PLAN_SPEC})
    cells = tuple(load(Cell, c) for c in p["cells"])
    return Result(
        requested,
        Plan(spec, cells, tuple(p["reductions"]), p["estimate_s"]),
        load(Thresholds, data["evaluation"]["thresholds"]),
        data["environment"],
        [load(Measurement, m) for m in data["warmup"]],
        [CellRun.from_json(c) for c in data["cells"]],
        data["complete"],
        data["stopped"],
        p["budget_s"],
        data["duration_s"],
    )


def write(result: Result, out_dir: Path, charts: Sequence[str] = ()) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    ev = result.evaluation()
    paths = {"json": out_dir / "scorecard.json", "markdown": out_dir / "scorecard.md"}
    paths["json"].write_text(json.dumps(to_json(result, ev), indent=1) + "\n", encoding="utf-8")
    paths["markdown"].write_text(render(result, ev, charts), encoding="utf-8")
    return paths


def section(title: str, *blocks: str | list[str]) -> list[str]:
    """``title``, then each block (a paragraph, or a table's lines), each followed by a blank
    line; an empty block is left out."""
    lines = [title, ""]
    for block in filter(None, blocks):
        lines += [block, ""] if isinstance(block, str) else [*block, ""]
    return lines


def _table(columns: str, rows: Iterable[Sequence[object]]) -> list[str]:
    """``columns``: one alignment letter per column, then ``|`` and the header cells."""
    align, header = columns.split("|", 1)
    return table(header.split("|"), rows, align)


GATE_MARKS = {True: "✅ passed", False: "❌ failed", None: "⚪ not measured"}
PAYS = {True: "yes", False: "**no**", None: "n/a"}
FLOOR_MARKS = {True: "passed", False: "**failed**", None: "n/a"}


def render(result: Result, ev: Evaluation, charts: Sequence[str] = ()) -> str:
    t, stop = ev.thresholds, ev.stop_at_concurrency
    partial = f"_This run is partial: {result.stopped or 'stopped early'}. Figures cover the "
    partial += "cells measured; gates with nothing to judge say so._"
    gates = [(g.title, _cell(g.rule), _cell(g.figure), GATE_MARKS[g.passed]) for g in ev.gates]
    levels = [
        (
            lv.concurrency,
            _num(lv.spec_tps),
            lv.alternative or "n/a",
            _num(lv.alternative_tps),
            _num(lv.ratio, "{:.2f}x"),
            PAYS[lv.pays],
        )
        for lv in ev.levels
    ]
    paying = f"Speculation stops paying at **concurrency {stop}**." if stop is not None else ""
    if stop is None and ev.levels:
        paying = "Speculation pays at every concurrency measured."
    families: list[tuple[object, ...]] = [
        (
            _family(a.family),
            a.drafted,
            a.accepted,
            _num(a.acceptance, "{:.2f}"),
            FLOOR_MARKS[a.passed],
        )
        for a in ev.acceptance_by_family
    ]
    families.append(("**all**", "", "", f"**{_num(ev.acceptance, '{:.2f}')}**", ""))
    parts = [
        (p.title, f"{p.points:.1f} / {p.weight}", p.figure, _cell(p.rule)) for p in ev.score_parts
    ]
    requests = [(r.cell.scenario, m) for r in result.runs for m in r.measurements]
    errors = Counter((s, m.error) for s, m in requests if not m.ok and not m.cancelled)
    errors_table = [(s, _cell(e or "unknown"), n) for (s, e), n in errors.most_common(10)]
    lines = [
        "# Speculative decoding readiness scorecard",
        "",
        *section(
            f"**Verdict: {ev.verdict}**",
            f"Readiness score: **{ev.score}/100** (rule below).",
            f"> {ev.recommendation}",
            "" if result.complete else partial,
        ),
        *section("## Environment", _table("ll||", _environment(result))),
        *section("## Gates", _table("llll|Gate|Rule|Figure|Result", gates)),
        *section(
            "## Where speculation stops paying",
            "Aggregate tokens per second of the speculative lane with speculation on, against "
            "the better of the two ways of serving the same prompts without it (spec-off, "
            f"batching), at each concurrency. It pays when it is at least "
            f"{1 + t.crossover_margin:.2f}x the alternative.",
            _table(
                "rrlrrl|Concurrency|spec-on tok/s|Best alternative|Its tok/s|Ratio|Pays", levels
            ),
            paying,
        ),
        *section(
            "## Acceptance by prompt family",
            _table(
                f"lrrrl|Family|Drafted|Accepted|Acceptance|Floor {t.acceptance_floor:.2f}", families
            ),
        ),
        *section(
            f"## Readiness score: {ev.score}/100",
            "The sum of these components, rounded (the verdict comes from the gates, not from "
            "the score):",
            _table("lrll|Component|Points|Figure|Rule", parts),
        ),
        *_pair_rule(result, ev),
        *section("## Results by scenario"),
        *(line for name in result.plan.scenarios for line in _scenario(result, name)),
        *(section("## Charts", [f"![{CHARTS.get(c, c)}]({c})" for c in charts]) if charts else []),
        *(
            section("## Errors", _table("llr|Scenario|Error|Requests", errors_table))
            if errors
            else []
        ),
        *section("## How this was measured", _method(result)),
    ]
    return "\n".join(lines).rstrip() + "\n"


SOFTWARE = ("speclane", "mlx", "mlx-lm")


def _environment(result: Result) -> list[tuple[str, str]]:
    env, runs = result.environment, result.runs
    hw, versions = env.get("hardware") or {}, env.get("versions") or {}
    draft, tokens = env.get("draft_model") or "unknown", env.get("num_draft_tokens")
    status = "complete" if result.complete else "partial"
    run = f"{status}, {clock(result.duration)}, {len(runs)}/{len(result.plan.cells)} cells, "
    run += f"{sum(len(r.measurements) for r in runs)} requests"
    machine = [hw.get("machine"), hw.get("cpu"), f"{hw.get('cpus')} CPUs"]
    machine += [f"{hw.get('memory_gib')} GiB", f"MLX device {hw.get('mlx_device')}"]
    if "openblas_preloaded" in hw:
        machine.append("OpenBLAS " + ("preloaded" if hw["openblas_preloaded"] else "not found"))
    start, end = ((env.get("load_average") or {}).get(k) for k in ("start", "end"))
    load = f"1-minute load average {start[0]} at the start" if start else "unknown"
    load += f", {end[0]} at the end" if start and end else ""
    load += " (other work on the machine adds noise to every figure)" if start else ""
    said = [
        f"{lane['lane']} lane: {lane['speculation']['reason']}"
        for lane in env.get("lanes") or ()
        if (lane.get("speculation") or {}).get("reason")
    ]
    rows = [
        ("Model", env.get("model") or "unknown"),
        ("Draft", draft + (f" ({tokens} draft tokens per round)" if tokens else "")),
        ("Date (UTC)", env.get("date") or "?"),
        ("Run", run),
        ("Router", env.get("router") or "?"),
        ("speclane / mlx / mlx-lm", " / ".join(str(versions.get(k)) for k in SOFTWARE)),
        ("Hardware", ", ".join(str(part) for part in machine if part) or "?"),
        ("Machine load", load),
        ("Router says", "; ".join(said)),
        ("Note", env.get("note")),
    ]
    return [(name, _cell(value)) for name, value in rows if value]


def _pair_rule(result: Result, ev: Evaluation) -> list[str]:
    """The measured pair as a [[gating.pairs]] rule, to record next to the configuration."""
    if result.environment.get("draft_model") is None or ev.acceptance is None:
        return []
    rule = pair_rule_from_bench(pair(result, ev), when=result.environment.get("date"))
    return section(
        "## Model pair rule",
        "Paste into `speclane.toml` to record this measurement next to the pair; in strict "
        "mode a pair below `gating.acceptance_floor` is denied (`deny_below_floor`).",
        ["```toml", rules_to_toml([rule]).rstrip(), "```"],
    )


def _scenario(result: Result, name: str) -> list[str]:
    columns = (
        "lrrrrrrrrrrrl|Family|c|Requests|Errors|TTFT avg ms|TTFT p95 ms|Decode tok/s|"
        "Aggregate tok/s|E2E p95 ms|Drafted|Accepted|Acceptance|Lane chosen"
    )
    rows = []
    for run in (r for r in result.runs if r.cell.scenario == name):
        s, partial = run.summary(), "" if run.complete else " (partial)"
        rows.append(
            (
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
        )
    scenario = SCENARIOS[name]
    lines = _table(columns, rows) + ([] if rows else ["| (not measured) |" + " |" * 12])
    return section(f"### {scenario.title} (`{name}`)", f"Sent with {scenario.how}.", lines)


def _lanes(s: Summary) -> str:
    """Which lane answered, how many with a draft, and by which routing rule."""
    if not s.lanes:
        return "n/a"
    text = ", ".join(f"{lane} {n}" for lane, n in sorted(s.lanes.items(), key=lambda kv: -kv[1]))
    if s.speculated and s.lanes.get("speculative"):
        text += f" ({s.speculated} with draft)"
    rules = {r: n for r, n in s.rules.items() if r not in ("override", "unknown")}
    if rules:
        text += "; " + ", ".join(f"{r} {n}" for r, n in sorted(rules.items()))
    return text


def _method(result: Result) -> list[str]:
    plan, spec = result.plan, result.plan.spec
    estimate = f"~{clock(plan.estimate)}" if plan.estimate is not None else "not estimated"
    budget = f"{clock(result.budget)}" if result.budget else "none"
    return [
        f"- Matrix: scenarios {', '.join(plan.scenarios)} x families "
        f"{', '.join(plan.families)} x concurrency {', '.join(map(str, plan.concurrency))}; "
        f"{len(plan.cells)} cells. A cell at concurrency c runs c client loops that each send "
        f"{spec.runs} request(s) back to back; every request streams at most "
        f"{spec.max_tokens} tokens, greedy (temperature 0). The long prompt is "
        f"{spec.long_prompt_chars} characters.",
        f"- Time budget {budget}, estimate {estimate} from the warm-up; reductions to fit "
        f"the budget: {'; '.join(plan.reductions) or 'none'}.",
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
    ]


def _num(value: float | None, pattern: str = "{:.1f}") -> str:
    return fmt(value, pattern, "n/a")


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _family(name: str) -> str:
    family = FAMILIES.get(name)
    return family.title if family else name
