"""``speclane bench lanes``: the ratios against the goals, and the table."""

from __future__ import annotations

from typing import Any

from router.bench.common.stats import fmt, ratio, table

# shared: the router's default shared_threads (auto: router.worker.engines.shared.threads_for);
# shared-1thread: one generation thread taking turns between the lanes.
SHARED_ONE_THREAD = "shared-1thread"
TARGETS = ("shared", SHARED_ONE_THREAD, "separate", "mlx_lm.server")


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    shared, one_thread, separate, mlx = (results.get(n, {}) for n in TARGETS)

    def pss(r: dict[str, Any]) -> float | None:
        return (r.get("memory") or {}).get("pss_bytes")

    def agg(r: dict[str, Any]) -> float | None:
        return (r.get("mixed") or {}).get("aggregate_tok_s")

    turns = shared.get("turn2plus_ttft_s") or {}
    memory = ratio(pss(shared), pss(mlx))
    alternating = ratio(turns.get("alternating"), turns.get("one_lane"))
    throughput = ratio(agg(shared), agg(separate))
    return {
        "shared_memory_vs_mlx_lm": memory,
        "separate_memory_vs_mlx_lm": ratio(pss(separate), pss(mlx)),
        "shared_alternating_vs_one_lane_ttft": alternating,
        "shared_vs_separate_aggregate_tok_s": throughput,
        "shared_1thread_vs_separate_aggregate_tok_s": ratio(agg(one_thread), agg(separate)),
        "goals_met": {
            "shared_memory<=1.1x": None if memory is None else memory <= 1.1,
            "alternating_ttft<=1.1x": None if alternating is None else alternating <= 1.1,
            "shared_throughput>=0.85x": None if throughput is None else throughput >= 0.85,
        },
    }


def _num(value: Any, scale: float = 1.0) -> str:
    return fmt(value / scale if isinstance(value, int | float) else None)


def render(report: dict[str, Any]) -> str:
    rt = report["ratios"]
    lines = table(
        ["target", "PSS MiB", "processes", "interactive TTFT s", "interactive tok/s",
         "batch aggregate tok/s", "turn 2+ TTFT s alternating", "one lane"],
        [[name, _num(m["pss_bytes"], 1 << 20), m["processes"], _num(x["interactive_ttft_s"]),
          _num(x["interactive_tok_s"]), _num(x["aggregate_tok_s"]), _num(t["alternating"]),
          _num(t["one_lane"])]
         for name, r in report["results"].items()
         for m, x, t in [(r["memory"], r["mixed"], r["turn2plus_ttft_s"])]],
        "lrrrrrrr",
    )  # fmt: skip
    goals = (
        f"shared memory / mlx_lm.server {_num(rt['shared_memory_vs_mlx_lm'])} (goal "
        f"<= 1.1); separate {_num(rt['separate_memory_vs_mlx_lm'])}; shared alternating / "
        f"one-lane turn 2+ TTFT {_num(rt['shared_alternating_vs_one_lane_ttft'])} (goal "
        f"<= 1.1); shared / separate aggregate tok/s "
        f"{_num(rt['shared_vs_separate_aggregate_tok_s'])} (goal >= 0.85; one thread taking "
        f"turns: {_num(rt.get('shared_1thread_vs_separate_aggregate_tok_s'))})"
    )
    return "\n".join([*lines, "", goals])
