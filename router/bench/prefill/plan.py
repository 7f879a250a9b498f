"""``speclane bench prefill``: the requests, in order, and the goals they are held to (pure).

Each step is one request of a program, through the door that program uses, in the order an
agent's day sends them: Claude Code's first session and its next turn, a second session,
a compaction, two sub-agents; Qwen Code's turn with its tool loop and the next turn; Codex's
turns; then the server restarted and a conversation's next turn; then the model unloaded
and loaded again (``mlx_lm.server`` has no unload: it is restarted) and the next turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from router.bench.prefill import shapes
from router.bench.prefill.send import Door

SPECLANE, MLX_LM = "speclane", "mlx_lm.server"
TARGETS = (SPECLANE, MLX_LM)
MLX_LM_MODEL = "default_model"  # what mlx_lm.server calls the model given by --model
Before = Literal["", "restart", "unload"]
GoalKind = Literal["cached_share", "near_ideal", "resumed"]


@dataclass(frozen=True)
class Goal:
    """``cached_share``: at least ``share`` of the prompt read from the cache; ``near_ideal``:
    prefilled at most ``slack`` tokens beyond the ideal; ``resumed``: ``share`` cached and
    the first token within ``ttft_ratio`` of the cold prefill's time (the other target's,
    which prefilled the same prompt from nothing)."""

    kind: GoalKind
    share: float = 0.0
    slack: int = 0
    ttft_ratio: float = 0.0

    def text(self) -> str:
        if self.kind == "cached_share":
            return f">= {self.share:.0%} cached"
        if self.kind == "near_ideal":
            return f"<= ideal + {self.slack}"
        return f">= {self.share:.0%} cached, TTFT <= {self.ttft_ratio:g}x cold"


SECOND_SESSION = Goal("cached_share", share=0.85)
TOOL_LOOP = Goal("near_ideal", slack=50)
APPEND_ONLY = Goal("near_ideal", slack=20)
RESUMED = Goal("resumed", share=0.80, ttft_ratio=0.2)


@dataclass(frozen=True)
class Step:
    name: str
    door: Door
    body: dict[str, Any]  # the program's body, trimmed (``shapes.trim``)
    follows: str | None = None  # the step this one extends: the ideal is what it adds
    before: Before = ""  # the server restarted, or the model unloaded and loaded, first
    goal: Goal | None = None


def steps(fixtures: Path = shapes.FIXTURES) -> list[Step]:
    claude_1 = shapes.load("claude-code-conversation-1", fixtures)
    claude_2 = shapes.load("claude-code-conversation-2", fixtures)
    qwen_1 = shapes.load("qwen-code-turn-1", fixtures)
    qwen_2 = shapes.load("qwen-code-turn-2", fixtures)
    codex = shapes.codex_turns(fixtures)
    cc_later = shapes.next_turn_anthropic(
        claude_1[1], "ANSWER. It says: first line, then the SECRET-LINE.", "And line 1?"
    )
    raw = [
        Step("claude-code: first session", "anthropic", claude_1[0]),
        Step(
            "claude-code: its tool result",
            "anthropic",
            claude_1[1],
            follows="claude-code: first session",
        ),
        Step("claude-code: a second session", "anthropic", claude_2[0], goal=SECOND_SESSION),
        Step("claude-code: after a compaction", "anthropic", shapes.compaction(claude_1[0])),
        Step(
            "claude-code: a sub-agent",
            "anthropic",
            shapes.subagent(claude_1[0], "Find where notes.txt is read.", "5ab"),
        ),
        Step(
            "claude-code: another sub-agent",
            "anthropic",
            shapes.subagent(claude_1[0], "List the files of the project.", "e21"),
            goal=SECOND_SESSION,
        ),
        Step("qwen-code: turn 1", "chat", qwen_1[0]),
        Step(
            "qwen-code: its tool loop",
            "chat",
            qwen_1[1],
            follows="qwen-code: turn 1",
            goal=TOOL_LOOP,
        ),
        Step(
            "qwen-code: turn 2",
            "chat",
            qwen_2[0],
            follows="qwen-code: its tool loop",
            goal=TOOL_LOOP,
        ),
        Step("codex: turn 1", "responses", codex[0]),
        Step(
            "codex: its tool loop", "responses", codex[1], follows="codex: turn 1", goal=APPEND_ONLY
        ),
        Step(
            "codex: turn 2", "responses", codex[2], follows="codex: its tool loop", goal=APPEND_ONLY
        ),
        Step(
            "claude-code: next turn after a restart",
            "anthropic",
            cc_later,
            follows="claude-code: its tool result",
            before="restart",
            goal=RESUMED,
        ),
        Step(
            "qwen-code: next turn after an unload",
            "chat",
            qwen_2[1],
            follows="qwen-code: turn 2",
            before="unload",
            goal=RESUMED,
        ),
    ]
    return [Step(s.name, s.door, shapes.trim(s.body), s.follows, s.before, s.goal) for s in raw]


def stages(all_steps: list[Step]) -> list[tuple[Before, list[Step]]]:
    """The steps cut where the server restarts or the model is unloaded: each stage runs on
    one server start (or one load), after what its first step says."""
    out: list[tuple[Before, list[Step]]] = []
    for step in all_steps:
        if step.before or not out:
            out.append((step.before, []))
        out[-1][1].append(step)
    return out


def ideal(prompt: int, previous_prompt: int | None) -> int | None:
    """What a step adds to the one it follows: its prompt less that one's (whose answer the
    cache holds too, and whose prompt this one repeats). None: no step followed."""
    if previous_prompt is None:
        return None
    return max(0, prompt - previous_prompt)
