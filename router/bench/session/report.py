"""What a session benchmark run says (pure): per session and target the whole session's
time, its ratio to ``mlx_lm.server``, whether each turn's output equals plain greedy
decoding's, and the issue's goals: speclane's whole session at most 0.5x ``mlx_lm.server``,
within 10 % of the best fixed source on every session, ahead of each fixed source on
``mixed``, no turn slower than ``mlx_lm.server``'s beyond ``TURN_SLACK``, and a chat-only
session decoding at 0.95x plain or better."""

from __future__ import annotations

from typing import Any

from router.bench.common.stats import fmt, ratio, table

PLAIN = "mlx_lm.server"
AUTO = "speclane"
SESSION_GOAL = 0.5
BEST_FIXED_SLACK = 1.10
# A turn "slower than mlx_lm.server's" beyond this factor (one run has no spread of its
# own to test against: this is the noise seen between two plain runs on this machine).
TURN_SLACK = 1.10
CHAT_GOAL = 0.95
AGENTS_GOAL = 0.5  # issue #45: three editing agents at once in half mlx_lm.server's makespan


def fmt_turn(row: dict[str, Any]) -> str:
    sources = row.get("sources") or {}
    used = ", ".join(
        f"{name} {s.get('accepted', 0)}/{s.get('drafted', 0)}" for name, s in sources.items()
    )
    tail = f" [{used}]" if used else ""
    if row.get("plain_steps"):
        tail += f" plain steps {row['plain_steps']}"
    error = f" ERROR {row['error']}" if row.get("error") else ""
    if row.get("decision"):  # speclane's: the rule that placed the turn
        tail += f" ({row['decision']})"
    return (
        f"{fmt(row['seconds'])} s, {row['completion_tokens']} tokens, "
        f"ttft {fmt(row['ttft_s'])} s{tail}{error}"
    )


def _total(rows: list[dict[str, Any]]) -> float:
    return sum(r["seconds"] for r in rows)


def _rate(rows: list[dict[str, Any]]) -> float | None:
    seconds = _total(rows)
    return sum(r["completion_tokens"] for r in rows) / seconds if seconds > 0 else None


def summarise(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, targets in results.items():
        plain = targets.get(PLAIN, [])
        per_target = {}
        for target, rows in targets.items():
            matches = (
                [a["text"] == b["text"] for a, b in zip(rows, plain, strict=False)] if plain else []
            )
            per_target[target] = {
                "seconds": _total(rows),
                "vs_mlx_lm_server": ratio(_total(rows), _total(plain)) if plain else None,
                "tokens_per_s": _rate(rows),
                "outputs_equal_plain": matches,
                "errors": [r["error"] for r in rows if r.get("error")],
            }
        out[name] = {"targets": per_target, "goals": _goals(name, targets, per_target)}
    return out


def _goals(
    name: str, targets: dict[str, list[dict[str, Any]]], per: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    auto, plain = targets.get(AUTO), targets.get(PLAIN)
    if not auto or not plain:
        return {}
    fixed = {t: v["seconds"] for t, v in per.items() if t.startswith("speclane:")}
    goals: dict[str, Any] = {
        "turns_slower_than_mlx_lm_server": [
            a["turn"]
            for a, p in zip(auto, plain, strict=False)
            if a["seconds"] > p["seconds"] * TURN_SLACK
        ],
        "outputs_equal_plain": all(per[AUTO]["outputs_equal_plain"]),
    }
    goals["no_turn_slower"] = not goals["turns_slower_than_mlx_lm_server"]
    if name == "chat":
        speed = ratio(per[AUTO]["tokens_per_s"], per[PLAIN]["tokens_per_s"])
        goals["chat_speed_vs_plain"] = speed
        goals[f"chat>={CHAT_GOAL}x"] = speed is not None and speed >= CHAT_GOAL
        return goals
    share = per[AUTO]["vs_mlx_lm_server"]
    goals[f"session<={SESSION_GOAL}x"] = share is not None and share <= SESSION_GOAL
    if fixed:
        best = min(fixed.values())
        goals["best_fixed"] = min(fixed, key=lambda t: fixed[t])
        goals["vs_best_fixed"] = ratio(per[AUTO]["seconds"], best)
        goals["within_10%_of_best_fixed"] = per[AUTO]["seconds"] <= best * BEST_FIXED_SLACK
        if name == "mixed":
            goals["beats_every_fixed"] = all(per[AUTO]["seconds"] < v for v in fixed.values())
    return goals


def summarise_agents(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """``--agents``: per session and target the makespan, its ratio to ``mlx_lm.server``'s,
    each agent's total, the completion tokens, and whether every agent's every turn equals
    the same agent's under plain greedy decoding."""
    out: dict[str, Any] = {}
    for name, targets in results.items():
        plain = targets.get(PLAIN)
        per: dict[str, Any] = {}
        for target, run in targets.items():
            agents = run["agents"]
            equal = [
                all(a["text"] == b["text"] for a, b in zip(mine, ref, strict=False))
                for mine, ref in zip(agents, plain["agents"], strict=False)
            ] if plain else []  # fmt: skip
            per[target] = {
                "makespan_s": run["makespan_s"],
                "vs_mlx_lm_server": ratio(run["makespan_s"], plain["makespan_s"])
                if plain
                else None,
                "agent_seconds": [_total(rows) for rows in agents],
                "completion_tokens": sum(r["completion_tokens"] for rows in agents for r in rows),
                "agents_equal_plain": equal,
                "errors": [r["error"] for rows in agents for r in rows if r.get("error")],
            }
        goals: dict[str, Any] = {}
        if AUTO in per and plain:
            share = per[AUTO]["vs_mlx_lm_server"]
            key = "chat_no_slower" if name == "chat" else f"makespan<={AGENTS_GOAL}x"
            limit = TURN_SLACK if name == "chat" else AGENTS_GOAL
            goals[key] = share is not None and share <= limit
            goals["same_tokens"] = per[AUTO]["completion_tokens"] == per[PLAIN]["completion_tokens"]
        out[name] = {"targets": per, "goals": goals}
    return out


def render(results: dict[str, Any]) -> str:
    if results.get("settings", {}).get("agents", 1) > 1:
        return render_agents(results)
    lines = []
    for name, data in results["results"].items():
        summary = results["summary"][name]
        targets = list(data)
        turns = len(next(iter(data.values()), []))
        rows = []
        for i in range(turns):
            kind = data[targets[0]][i]["kind"]
            rows.append([f"{i + 1} {kind}", *(fmt(data[t][i]["seconds"]) for t in targets)])
        rows.append(["session", *(fmt(summary["targets"][t]["seconds"]) for t in targets)])
        rows.append(
            ["x mlx_lm.server", *(fmt(summary["targets"][t]["vs_mlx_lm_server"]) for t in targets)]
        )
        rows.append(
            [
                "= plain output",
                *(f"{sum(summary['targets'][t]['outputs_equal_plain'])}/{turns}" for t in targets),
            ]
        )
        lines.append(f"\nsession {name} (seconds per turn)")
        lines += table(["turn", *targets], rows, "l" + "r" * len(targets))
        lines.append("goals: " + ", ".join(f"{k}={v}" for k, v in summary["goals"].items()))
    return "\n".join(lines)


def render_agents(results: dict[str, Any]) -> str:
    lines = []
    for name, summary in results["summary"].items():
        targets = list(summary["targets"])
        per = summary["targets"]
        rows = [
            ["makespan s", *(fmt(per[t]["makespan_s"]) for t in targets)],
            ["x mlx_lm.server", *(fmt(per[t]["vs_mlx_lm_server"]) for t in targets)],
            ["agents s", *(" / ".join(fmt(s) for s in per[t]["agent_seconds"]) for t in targets)],
            ["tokens", *(str(per[t]["completion_tokens"]) for t in targets)],
            [
                "= plain output",
                *(f"{sum(per[t]['agents_equal_plain'])}/{len(per[t]['agent_seconds'])}"
                  for t in targets),
            ],
        ]  # fmt: skip
        agents = len(per[targets[0]]["agent_seconds"]) if targets else 0
        lines.append(f"\nsession {name}, {agents} agents at once")
        lines += table(["", *targets], rows, "l" + "r" * len(targets))
        lines.append("goals: " + ", ".join(f"{k}={v}" for k, v in summary["goals"].items()))
    return "\n".join(lines)
