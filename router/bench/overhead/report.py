"""What the overhead benchmark's rows say: what each proxy adds over direct, speclane's
figures against its two targets, and the tables printed at the end (pure)."""

from __future__ import annotations

from typing import Any

from router.bench.common.stats import fmt, ratio

LAYOUTS = ("shared", "own-core")
ROLES = ("upstream", "proxy", "loadgen")
TTFT_TARGET_MS = 1.0  # added TTFT p50 at concurrency 1
THROUGHPUT_TARGET = 0.8  # relayed chunks/s at 64 streams, as a share of direct


def _cell(row: dict[str, Any]) -> tuple[object, ...]:
    return row.get("cpus", LAYOUTS[0]), row["concurrency"], row.get("tokens")


def added_over_direct(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    direct = {_cell(r): r for r in rows if r["target"] == "direct"}
    added = []
    for r in rows:
        d = direct.get(_cell(r))
        if r["target"] == "direct" or d is None:
            continue
        proxy_cpu = r.get("cpu_us_per_stream", {}).get("proxy")
        added.append(
            {
                "target": r["target"],
                "cpus": r.get("cpus", LAYOUTS[0]),
                "concurrency": r["concurrency"],
                "tokens": r.get("tokens"),
                **{
                    f"added_{k}": _diff(r[k], d[k])
                    for k in ("ttft_p50_ms", "ttft_p99_ms", "total_p50_ms", "total_p99_ms")
                },
                "chunks_vs_direct": ratio(r["chunks_per_s"], d["chunks_per_s"]),
                "plain_vs_direct": ratio(r["plain_requests_per_s"], d["plain_requests_per_s"]),
                "proxy_cpu_us_per_stream": proxy_cpu,
            }
        )
    return added


def _diff(a: object, b: object) -> float | None:
    return a - b if isinstance(a, int | float) and isinstance(b, int | float) else None


def render_table(result: dict[str, Any]) -> str:
    def cpu_cell(r: dict[str, Any]) -> str:
        per = r.get("cpu_us_per_stream") or {}
        return " / ".join(fmt(per.get(role), "{:.0f}") for role in ROLES)

    lines = [
        "| target | cores | conc | tokens | TTFT p50 ms | TTFT p99 ms | total p50 ms |"
        " total p99 ms | chunks/s | non-stream req/s | CPU µs/stream upstream / proxy /"
        " loadgen | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['target']} | {r.get('cpus', '-')} | {r['concurrency']} | "
            f"{r.get('tokens', '-')} | {fmt(r['ttft_p50_ms'])} | "
            f"{fmt(r['ttft_p99_ms'])} | {fmt(r['total_p50_ms'])} | "
            f"{fmt(r['total_p99_ms'])} | {fmt(r['chunks_per_s'], '{:.0f}')} | "
            f"{fmt(r['plain_requests_per_s'], '{:.0f}')} | "
            f"{cpu_cell(r)} | {r['errors']} |"
        )
    lines += [
        "",
        "| proxy | cores | conc | tokens | added TTFT p50 ms | added TTFT p99 ms |"
        " added total p50 ms | added total p99 ms | chunks/s vs direct | req/s vs direct |"
        " proxy CPU µs/stream |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in result["added"]:
        lines.append(
            f"| {a['target']} | {a.get('cpus', '-')} | {a['concurrency']} | "
            f"{a.get('tokens', '-')} | {fmt(a['added_ttft_p50_ms'])} | "
            f"{fmt(a['added_ttft_p99_ms'])} | {fmt(a['added_total_p50_ms'])} | "
            f"{fmt(a['added_total_p99_ms'])} | {fmt(a['chunks_vs_direct'])} | "
            f"{fmt(a['plain_vs_direct'])} | "
            f"{fmt(a.get('proxy_cpu_us_per_stream'), '{:.0f}')} |"
        )
    return "\n".join(lines)


def judge_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """speclane's figures against the two targets, one entry per core layout and stream
    length."""
    out: list[dict[str, Any]] = []
    added = [a for a in result["added"] if a["target"] == "speclane"]
    for a in added:
        where = {"tokens": a["tokens"], "cpus": a.get("cpus", LAYOUTS[0])}
        if a["concurrency"] == 1:
            v = a["added_ttft_p50_ms"]
            out.append(
                {
                    "target": "added TTFT p50 at concurrency 1",
                    **where,
                    "value": v,
                    "goal": f"< {TTFT_TARGET_MS:g} ms",
                    "met": isinstance(v, int | float) and v < TTFT_TARGET_MS,
                }
            )
        if a["concurrency"] == 64:
            v = a["chunks_vs_direct"]
            out.append(
                {
                    "target": "relayed chunks/s at 64 streams vs direct",
                    **where,
                    "value": v,
                    "goal": f">= {THROUGHPUT_TARGET:g}x",
                    "met": isinstance(v, int | float) and v >= THROUGHPUT_TARGET,
                }
            )
    return out


def render_targets(entries: list[dict[str, Any]]) -> str:
    lines = []
    for e in entries:
        v = e["value"]
        shown = (
            "-"
            if not isinstance(v, int | float)
            else (f"{v:.2f} ms" if "TTFT" in str(e["target"]) else f"{v:.2f}x")
        )
        lines.append(
            f"[{e.get('cpus', LAYOUTS[0])} cores] {e['target']}, {e['tokens']}-token "
            f"streams: {shown} (target {e['goal']}): {'met' if e['met'] else 'NOT met'}"
        )
    return "\n".join(lines)
