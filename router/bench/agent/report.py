"""What an agent benchmark run says (pure): the starvation gap, speclane's ratios to
``mlx_lm.server`` against the goals (turn 2+ TTFT at most 1.0x, aggregate throughput at least
1.0x, the short stream's largest gap under 2 s), the tables printed at the end."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from router.bench.common.stats import fmt, mean, ratio, table

GAP_GOAL = 2.0


def largest_gap(times: Sequence[float], start: float, end: float) -> float | None:
    """The longest wait between two consecutive tokens that overlaps ``[start, end]``
    (a wait that began before ``start`` or ended after ``end`` counts whole)."""
    gaps = [b - a for a, b in itertools.pairwise(times) if b >= start and a <= end]
    return max(gaps) if gaps else None


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    ours, theirs = results.get("speclane", {}), results.get("mlx_lm.server", {})

    def later_ttft(r: dict[str, Any]) -> float | None:
        return mean([row["ttft_s"] for row in r.get("turns", []) if row["turn"] >= 2])

    def throughput(r: dict[str, Any]) -> float | None:
        return (r.get("throughput") or {}).get("aggregate_tok_s")

    ttft = ratio(later_ttft(ours), later_ttft(theirs))
    tps = ratio(throughput(ours), throughput(theirs))
    gap = (ours.get("starvation") or {}).get("largest_gap_s")
    return {
        "turn2plus_ttft": ttft,
        "aggregate_throughput": tps,
        "largest_gap_s": gap,
        "goals_met": {
            "turn2plus_ttft<=1.0": None if ttft is None else ttft <= 1.0,
            "aggregate_throughput>=1.0": None if tps is None else tps >= 1.0,
            f"largest_gap<{GAP_GOAL:g}s": None if gap is None else gap < GAP_GOAL,
        },
    }


def fmt_row(row: dict[str, Any]) -> str:
    return (
        f"TTFT {fmt(row['ttft_s'])}s, decode {fmt(row['decode_tok_s'])} tok/s, "
        f"prompt {row['prompt_tokens']} (cached {row['cached_tokens']})"
        + (f", error {row['error']}" if row["error"] else "")
    )


def render(report: dict[str, Any]) -> str:
    results, rt = report["results"], report["ratios"]
    turns = table(
        ["target", "turn", "TTFT s", "decode tok/s", "prompt", "cached"],
        [[name, row["turn"], fmt(row["ttft_s"]), fmt(row["decode_tok_s"]),
          row["prompt_tokens"], row["cached_tokens"]]
         for name, r in results.items() for row in r["turns"]],
        "lrrrrr",
    )  # fmt: skip
    load = table(
        ["target", "aggregate tok/s (concurrency)", "long prompt tokens",
         "short stream tokens during its prefill", "largest gap s"],
        [[name, f"{fmt(tp['aggregate_tok_s'])} ({tp['concurrency']})",
          st["long_prompt_tokens"], st["short_tokens_during_prefill"], fmt(st["largest_gap_s"])]
         for name, r in results.items() for tp, st in [(r["throughput"], r["starvation"])]],
        "lrrrr",
    )  # fmt: skip
    goals = (
        f"turn 2+ TTFT ratio {fmt(rt['turn2plus_ttft'])} (goal <= 1.0); aggregate throughput "
        f"ratio {fmt(rt['aggregate_throughput'])} (goal >= 1.0); largest gap "
        f"{fmt(rt['largest_gap_s'])}s (goal < {GAP_GOAL:g}s)"
    )
    return "\n".join([*turns, "", *load, "", goals])
