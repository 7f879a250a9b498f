"""The draft-source benchmark's figures (pure): when auto-disable has decided for a family,
each cell's summary, the report's table and the goals. ``examples/spec_families.py`` runs
it: per family, plain decoding and each draft source on the speculative lane (interleaved,
so drift weighs on all alike), then routed requests once auto-disable has decided."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from router.bench.common.stats import fmt, mean, ratio
from router.bench.sources.plan import PLAIN, PREDICTION_FAMILY


def family_rows(state: Mapping[str, Any], family: str) -> list[dict[str, Any]]:
    """The speculative lane's ``GET /admin/spec`` rows of one family's client."""
    client = f"family-{family}"
    return [
        row
        for row in state.get("workloads", [])
        if row.get("backend") == "speculative"
        and str(row.get("workload", "")).split(":")[0] == client
    ]


def row_decided(row: Mapping[str, Any]) -> bool:
    """Off, or on with a full acceptance window and enough speed samples to have judged."""
    if row.get("state") == "off":
        return True
    window, speed = row.get("window") or {}, row.get("speed") or {}
    return bool(window.get("judging")) and (
        speed.get("spec_samples", 0) >= speed.get("min_samples", 1)
        and speed.get("baseline_tps") is not None
    )


def decided(rows: Sequence[Mapping[str, Any]], source: str | None) -> bool:
    """Whether the rows of the source the router drafts this family with have decided
    (``source`` None: not known yet, then every row must have)."""
    chosen = [r for r in rows if source is None or r.get("source") == source]
    return bool(chosen) and all(row_decided(r) for r in chosen)


def settled(rows: Sequence[Mapping[str, Any]], source: str | None, lane: str | None) -> bool:
    """Whether the routed requests now measure a decision: sent to the batching lane (every
    source off), or drafting with a source that has decided and stayed on. A source that
    has just turned off has not settled: the next request drafts with the next source of
    the family's cascade, which is judged in turn. A plain request on the speculative lane
    (``source`` None: a baseline sample) says nothing."""
    if lane == "batching":
        return True
    chosen = [r for r in rows if source is not None and r.get("source") == source]
    return bool(chosen) and all(row_decided(r) and r.get("state") == "on" for r in chosen)


def summarise(runs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One cell: mean tok/s of the streams (``tps``: from sending to the last token;
    ``decode_tps``: first to last token), draft totals, lanes and sources seen."""
    runs = list(runs)
    drafted = sum((r.get("spec") or {}).get("drafted", 0) for r in runs)
    accepted = sum((r.get("spec") or {}).get("accepted", 0) for r in runs)
    forced = sum((r.get("spec") or {}).get("forced", 0) for r in runs)
    return {
        "tps": mean([r["tps"] for r in runs if r.get("tps")]),
        "decode_tps": mean([r["decode_tps"] for r in runs if r.get("decode_tps")]),
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "forced": forced,
        "lanes": sorted({str(r.get("lane")) for r in runs}),
        "sources": sorted({str((r.get("spec") or {}).get("source")) for r in runs}),
        "tokens": [r.get("tokens", 0) for r in runs],
    }


def together(runs: Sequence[Mapping[str, Any]], wall: float) -> dict[str, Any]:
    """Streams sent at once: per-stream decode speed (``summarise``) and the aggregate."""
    tokens = sum(r.get("tokens", 0) for r in runs)
    return {**summarise(runs), "wall_s": wall, "aggregate_tps": tokens / wall if wall > 0 else None}


def table(results: Mapping[str, Any]) -> str:
    """The markdown table of a run: one row per family and variant, then the routed row."""
    lines = [
        "| family | variant | acceptance | c=1 tok/s | c=1 / plain | c=2 per stream | "
        "c=2 aggregate (/ plain on batching) |",
        "|---|---|---|---|---|---|---|",
    ]
    for family, r in results.items():
        plain = r["c1"][PLAIN]["tps"]
        batch = (r.get("c2_batching") or {}).get("aggregate_tps")
        for variant, cell in r["c1"].items():
            c2 = r["c2"].get(variant) or {}
            c2_tps = c2.get("aggregate_tps")
            acc = (
                "-"
                if cell["acceptance"] is None
                else (f"{cell['acceptance']:.2f} ({cell['accepted']}/{cell['drafted']})")
            )
            lines.append(
                f"| {family} | {variant} | {acc} | {fmt(cell['tps'], '{:.1f}')} | "
                f"{fmt(ratio(cell['tps'], plain))} | {fmt(c2.get('tps'), '{:.1f}')} | "
                f"{fmt(c2_tps, '{:.1f}')} ({fmt(ratio(c2_tps, batch))}) |"
            )
        routed, routed2 = r["routed"], r.get("routed_c2") or {}
        ad = (
            ", ".join(
                f"{row.get('source')}: {row['state']} ({row['reason']})"
                for row in r.get("auto_disable", [])
            )
            or "-"
        )
        lines.append(
            f"| {family} | **routed** ({', '.join(routed['lanes'])}; "
            f"{', '.join(routed['sources'])}) | {ad} | {fmt(routed['tps'], '{:.1f}')} | "
            f"**{fmt(ratio(routed['tps'], _plain_beside_routed(r)))}** | "
            f"{fmt(routed2.get('tps'), '{:.1f}')} | "
            f"{fmt(routed2.get('aggregate_tps'), '{:.1f}')} "
            f"({fmt(ratio(routed2.get('aggregate_tps'), batch))}) |"
        )
    return "\n".join(lines)


def goals(results: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's goals as ratios of this run: prediction >= 2.0x and prompt lookup >= 1.5x
    plain on the edit families; no family routed below 0.95x plain once decided."""

    def c1(family: str, variant: str) -> float | None:
        r = results.get(family)
        if not r or variant not in r["c1"]:
            return None
        return ratio(r["c1"][variant]["tps"], r["c1"][PLAIN]["tps"])

    routed = {f: ratio(r["routed"]["tps"], _plain_beside_routed(r)) for f, r in results.items()}
    worst = min((v for v in routed.values() if v is not None), default=None)
    return {
        "prediction_on_edits": c1(PREDICTION_FAMILY, "prediction"),
        "prompt_lookup_on_edits": c1("edit", "prompt_lookup"),
        "routed_over_plain": routed,
        "met": {
            "prediction>=2.0": _at_least(c1(PREDICTION_FAMILY, "prediction"), 2.0),
            "prompt_lookup>=1.5": _at_least(c1("edit", "prompt_lookup"), 1.5),
            "routed>=0.95 everywhere": _at_least(worst, 0.95),
        },
    }


def _plain_beside_routed(r: Mapping[str, Any]) -> float | None:
    """Plain decoding measured between the routed requests (older runs: at concurrency 1)."""
    beside = (r.get("plain_beside_routed") or {}).get("tps")
    return beside or r["c1"][PLAIN]["tps"]


def _at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


def scenario_table(results: Mapping[str, Any]) -> str:
    """The markdown table of the ``--scenarios`` part (``plan.SCENARIO_VARIANTS``)."""
    lines = [
        "| scenario | variant | acceptance | forced | tok/s | / plain |",
        "|---|---|---|---|---|---|",
    ]
    for name, cells in results.items():
        plain = cells[PLAIN]["tps"]
        for variant, cell in cells.items():
            acc = (
                "-"
                if cell["acceptance"] is None
                else (f"{cell['acceptance']:.2f} ({cell['accepted']}/{cell['drafted']})")
            )
            lines.append(
                f"| {name} | {variant} | {acc} | {cell.get('forced', 0)} | "
                f"{fmt(cell['tps'], '{:.1f}')} | {fmt(ratio(cell['tps'], plain))} |"
            )
    return "\n".join(lines)


def scenario_goals(results: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's goals: a repeated prompt's answer >= 2x, constrained answers >= 1.3x."""

    def over(name: str, variant: str) -> float | None:
        cells = results.get(name)
        return ratio(cells[variant]["tps"], cells[PLAIN]["tps"]) if cells else None

    return {
        "repeat_suffix": over("repeat", "suffix"),
        "near_repeat_suffix": over("near-repeat", "suffix"),
        "tool_call_forced": over("tool-call", "forced"),
        "json_schema_forced": over("json-schema", "forced"),
        "met": {
            "repeat>=2.0": _at_least(over("repeat", "suffix"), 2.0),
            "tool_call>=1.3": _at_least(over("tool-call", "forced"), 1.3),
            "json_schema>=1.3": _at_least(over("json-schema", "forced"), 1.3),
        },
    }
