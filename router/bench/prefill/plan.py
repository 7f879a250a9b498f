"""``speclane bench prefill``: the requests, in order (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SPECLANE, MLX_LM = "speclane", "mlx_lm.server"
TARGETS = (SPECLANE, MLX_LM)
MLX_LM_MODEL = "default_model"  # what mlx_lm.server calls the model given by --model


def system_prompt(rules: int) -> str:
    """An agent's instructions and tools, in short rules (about 23 tokens a rule)."""
    head = "You are a coding agent working in a repository. Tools: read_file(path), "
    head += "write_file(path, text), run_tests(module).\n"
    return head + "".join(
        f"Rule {i}: when a file named module_{i}.py changes, run its tests and report the "
        "result in one line.\n"
        for i in range(rules)
    )


def source_file(functions: int) -> str:
    """A file the agent read in its first turn (about 14 tokens a function)."""
    return "".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(functions))


@dataclass(frozen=True)
class Step:
    name: str
    conversation: str  # turns of one conversation follow each other's answers
    user: str  # this turn's user message
    restart_before: bool = False  # the server is stopped and started again first
    continues: bool = False  # appends to the conversation's earlier turns


def steps(file_text: str) -> list[Step]:
    return [
        Step("first", "a", f"module_7.py:\n{file_text}\nWhich rule covers it?"),
        Step("next-turn", "a", "And module_8.py?", continues=True),
        Step("new-conversation", "b", "Which rules mention module_3.py?"),
        Step("after-restart", "a", "And module_9.py?", restart_before=True, continues=True),
        Step("new-conversation-after-restart", "c", "Summarise rule 5."),
    ]


def stages(all_steps: list[Step]) -> list[list[Step]]:
    """The steps cut where the server restarts: each stage runs on one server start."""
    out: list[list[Step]] = []
    for step in all_steps:
        if step.restart_before or not out:
            out.append([])
        out[-1].append(step)
    return out


def messages(system: str, history: list[tuple[str, str]], user: str) -> list[dict[str, str]]:
    """The conversation so far (user, answer pairs) and this turn."""
    out = [{"role": "system", "content": system}]
    for asked, answered in history:
        out += [{"role": "user", "content": asked}, {"role": "assistant", "content": answered}]
    return [*out, {"role": "user", "content": user}]


def body(model: str, chat: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {"model": model, "messages": chat, "max_tokens": max_tokens, "temperature": 0}


def ideal(prompt: int, previous_prompt: int | None, previous_completion: int) -> int | None:
    """What a continuing turn has that is new: its prompt less the previous turn's prompt and
    answer (None: not a continuing turn). Template tokens around the answer make it a few
    tokens low at most."""
    if previous_prompt is None:
        return None
    return max(0, prompt - previous_prompt - previous_completion)
