"""``speclane bench prefill``: the table of every request, side by side, each goal met or not
(pure)."""

from __future__ import annotations

from typing import Any

from router.bench.common.stats import fmt
from router.bench.prefill import shapes
from router.bench.prefill.plan import Goal

COLUMNS = ("prompt", "cached", "prefilled", "ideal new", "TTFT s", "goal")


def cold_ttft(results: dict[str, Any], step: str) -> float | None:
    """The time to the first token of ``step``'s prompt prefilled from nothing: a target's
    record of that step that read nothing from the cache (the first found)."""
    for records in results.get("targets", {}).values():
        for r in records:
            if r.get("step") == step and r.get("cached_tokens") == 0 and r.get("ttft_s"):
                return float(r["ttft_s"])
    return None


def verdict(r: dict[str, Any], results: dict[str, Any]) -> str:
    """``r``'s goal, and whether it was met ("" without a goal)."""
    if not isinstance(r.get("goal"), dict):
        return ""
    goal = Goal(**{k: v for k, v in r["goal"].items() if k != "text"})
    prompt, cached, ideal = (
        r.get("prompt_tokens"),
        r.get("cached_tokens"),
        r.get("ideal_new_tokens"),
    )
    if not isinstance(prompt, int) or not isinstance(cached, int) or not prompt:
        return f"{goal.text()}: not measured"
    share = cached / prompt
    if goal.kind == "near_ideal":
        if not isinstance(ideal, int):
            return f"{goal.text()}: not measured"
        over = prompt - cached - ideal
        return f"{goal.text()}: {_met(over <= goal.slack)} ({over:+,})"
    if goal.kind == "cached_share":
        return f"{goal.text()}: {_met(share >= goal.share)} ({share:.0%})"
    cold, ttft = cold_ttft(results, r["step"]), r.get("ttft_s")
    if cold is None or not isinstance(ttft, float | int):
        return f"{goal.text()}: cold TTFT not measured ({share:.0%} cached)"
    met = share >= goal.share and ttft <= goal.ttft_ratio * cold
    return f"{goal.text()}: {_met(met)} ({share:.0%}, {ttft / cold:.2f}x)"


def _met(met: bool) -> str:
    return "met" if met else "NOT met"


def rows(results: dict[str, Any]) -> list[list[str]]:
    out = []
    for target, records in results.get("targets", {}).items():
        for r in records:
            if "step" not in r:
                out.append([target, "(failed)", r.get("error") or "", "", "", "", "", ""])
                continue
            step = r["step"] + (f" ({r['before']})" if r.get("before") else "")
            cached = _int(r.get("cached_tokens"))
            if isinstance(r.get("cached_tokens"), int) and r.get("prompt_tokens"):
                cached += f" ({r['cached_tokens'] / r['prompt_tokens']:.0%})"
            out.append(
                [
                    target,
                    step if not r.get("error") else f"{step}: {r['error']}",
                    _int(r.get("prompt_tokens")),
                    cached,
                    _int(r.get("prefilled_tokens")),
                    _int(r.get("ideal_new_tokens")),
                    fmt(r.get("ttft_s")),
                    verdict(r, results),
                ]
            )
    return out


def _int(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "-"


def render(results: dict[str, Any]) -> str:
    header = ["target", "step", *COLUMNS]
    table = [header, *rows(results)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in table
    )


def markdown(results: dict[str, Any]) -> str:
    env = results.get("environment", {})
    load = env.get("load_average_before"), env.get("load_average_after")
    trim = results.get("trim") or {}
    lines = [
        "# speclane bench prefill",
        "",
        f"{results.get('date')}, commit {results.get('commit')}, model {results.get('model')}; "
        f"load average before/after {load[0]} / {load[1]} (a busy machine inflates the "
        "seconds; the token counts do not depend on it).",
        "",
        "The real programs' request bodies (`tests/fixtures/agent-prompts/`; the compaction "
        "and the sub-agents derived from them: `router/bench/prefill/shapes.py`), each "
        "trimmed the same way for both targets: the system prompt's first "
        f"{trim.get('system_chars', shapes.SYSTEM_CHARS):,} characters, every other text's "
        f"first {trim.get('text_chars', shapes.TEXT_CHARS):,}, each cut at a line's end, every "
        "line naming the date or the billing code kept; the tools "
        f"{', '.join(f'`{t}`' for t in trim.get('tools', sorted(shapes.TOOLS)))} only. "
        "speclane gets each through the program's door; mlx_lm.server the same conversation "
        "as chat messages (speclane's own translation). Ideal new: the tokens a step adds to "
        "the step it follows. Cold TTFT: the same step's from a target that read nothing "
        "from its cache.",
        "",
        "| target | step | " + " | ".join(COLUMNS) + " |",
        "|---|---|" + "---:|" * (len(COLUMNS) - 1) + "---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    return "\n".join(lines) + "\n"
