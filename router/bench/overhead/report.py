"""What the overhead benchmark's rows say: what each proxy adds over direct, speclane's
figures against its two targets, the tables printed at the end (pure)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from router.bench.common.stats import fmt, ratio, table

LAYOUTS = ("shared", "own-core")
ROLES = ("upstream", "proxy", "loadgen")
TTFT_TARGET_MS = 1.0  # added TTFT p50 at concurrency 1
THROUGHPUT_TARGET = 0.8  # relayed chunks/s at 64 streams, as a share of direct
LATENCIES = ("ttft_p50_ms", "ttft_p99_ms", "total_p50_ms", "total_p99_ms")


def added_over_direct(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def cell(row: dict[str, Any]) -> tuple[object, ...]:
        return row.get("cpus", LAYOUTS[0]), row["concurrency"], row.get("tokens")

    direct = {cell(r): r for r in rows if r["target"] == "direct"}
    return [
        {
            "target": r["target"],
            "cpus": r.get("cpus", LAYOUTS[0]),
            "concurrency": r["concurrency"],
            "tokens": r.get("tokens"),
            **{f"added_{k}": _diff(r[k], d[k]) for k in LATENCIES},
            "chunks_vs_direct": ratio(r["chunks_per_s"], d["chunks_per_s"]),
            "plain_vs_direct": ratio(r["plain_requests_per_s"], d["plain_requests_per_s"]),
            "proxy_cpu_us_per_stream": r.get("cpu_us_per_stream", {}).get("proxy"),
        }
        for r in rows
        if r["target"] != "direct" and (d := direct.get(cell(r))) is not None
    ]


def _diff(a: object, b: object) -> float | None:
    return a - b if isinstance(a, int | float) and isinstance(b, int | float) else None


def render(result: dict[str, Any]) -> str:
    """The measured rows, what each proxy adds, then speclane against its targets."""

    def where(r: dict[str, Any]) -> list[object]:
        return [r["target"], r.get("cpus", "-"), r["concurrency"], r.get("tokens", "-")]

    def cpu(r: dict[str, Any]) -> str:
        per = r.get("cpu_us_per_stream") or {}
        return " / ".join(fmt(per.get(role), "{:.0f}") for role in ROLES)

    rows = table(
        ["target", "cores", "conc", "tokens", "TTFT p50 ms", "TTFT p99 ms", "total p50 ms",
         "total p99 ms", "chunks/s", "non-stream req/s",
         "CPU µs/stream upstream / proxy / loadgen", "errors"],
        [[*where(r), *(fmt(r[k]) for k in LATENCIES), fmt(r["chunks_per_s"], "{:.0f}"),
          fmt(r["plain_requests_per_s"], "{:.0f}"), cpu(r), r["errors"]]
         for r in result["rows"]],
    )  # fmt: skip
    added = table(
        ["proxy", "cores", "conc", "tokens", "added TTFT p50 ms", "added TTFT p99 ms",
         "added total p50 ms", "added total p99 ms", "chunks/s vs direct", "req/s vs direct",
         "proxy CPU µs/stream"],
        [[*where(a), *(fmt(a[f"added_{k}"]) for k in LATENCIES), fmt(a["chunks_vs_direct"]),
          fmt(a["plain_vs_direct"]), fmt(a.get("proxy_cpu_us_per_stream"), "{:.0f}")]
         for a in result["added"]],
    )  # fmt: skip
    return "\n".join([*rows, "", *added, "", *map(_target_line, result["targets"])])


# speclane's two targets: (concurrency, figure of the added row, what it is, goal, met)
GOALS: tuple[tuple[int, str, str, str, Callable[[float], bool]], ...] = (
    (1, "added_ttft_p50_ms", "added TTFT p50 at concurrency 1", f"< {TTFT_TARGET_MS:g} ms",
     lambda v: v < TTFT_TARGET_MS),
    (64, "chunks_vs_direct", "relayed chunks/s at 64 streams vs direct",
     f">= {THROUGHPUT_TARGET:g}x", lambda v: v >= THROUGHPUT_TARGET),
)  # fmt: skip


def judge_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """speclane's figures against the targets, one entry per core layout and stream length."""
    return [
        {
            "target": what,
            "tokens": a["tokens"],
            "cpus": a.get("cpus", LAYOUTS[0]),
            "value": (v := a[figure]),
            "goal": goal,
            "met": isinstance(v, int | float) and met(v),
        }
        for a in result["added"]
        if a["target"] == "speclane"
        for level, figure, what, goal, met in GOALS
        if a["concurrency"] == level
    ]


def _target_line(e: dict[str, Any]) -> str:
    v, unit = e["value"], " ms" if "TTFT" in str(e["target"]) else "x"
    shown = f"{v:.2f}{unit}" if isinstance(v, int | float) else "-"
    return (
        f"[{e.get('cpus', LAYOUTS[0])} cores] {e['target']}, {e['tokens']}-token streams: "
        f"{shown} (target {e['goal']}): {'met' if e['met'] else 'NOT met'}"
    )
