"""The agent-shaped workload of ``bench agent`` and ``bench lanes`` (pure, deterministic): a
long system prompt of rules and a few tools resent on every turn, the user's questions, and
a long log to make a prefill long."""

from __future__ import annotations

from typing import Any

NO_EOS = {"0": -100, "2": -100}  # SmolLM2's end-of-text tokens (the default model)
AGENT = "You are a coding agent working in a git repository."
RULES = (
    "Read a file before you edit it.",
    "Keep each change small and reviewable.",
    "Run the tests after every edit.",
    "Never commit secrets or credentials.",
    "Prefer the standard library to a new dependency.",
    "Explain why, not what.",
    "Ask before deleting files.",
    "Quote error messages exactly.",
)
QUESTIONS = (
    "The test suite fails in parser.py with an IndexError. What do you check first?",
    "You found an off-by-one in the loop. Describe the smallest fix.",
    "Now the tests pass. Write a one-line commit message.",
    "Which other files might have the same bug?",
    "Summarise what we did in two sentences.",
)
_TOOLS = {
    "read": ("Read a file of the workspace.", ("path",)),
    "edit": ("Replace a string in a file.", ("path", "old", "new")),
    "exec": ("Run a shell command in the workspace.", ("command",)),
}


def tools(*names: str) -> list[dict[str, Any]]:
    """OpenAI function tools, each with string arguments."""
    out = []
    for name in names:
        description, args = _TOOLS[name]
        properties = {a: {"type": "string", "description": f"the {a}"} for a in args}
        parameters = {"type": "object", "properties": properties, "required": list(args)}
        function = {"name": name, "description": description, "parameters": parameters}
        out.append({"type": "function", "function": function})
    return out


def system_prompt(approx_tokens: int, head: str, rules: tuple[str, ...] = RULES) -> str:
    """``head``, then numbered rules up to roughly ``approx_tokens`` tokens."""
    lines = [head]
    while sum(len(x) for x in lines) < approx_tokens * 4:
        i = len(lines) - 1
        lines.append(f"Rule {i + 1}: {rules[i % len(rules)]} (section {i // len(rules) + 1})")
    return "\n".join(lines)


def long_document(approx_tokens: int, topic: str) -> str:
    lines: list[str] = []
    while sum(len(x) for x in lines) < approx_tokens * 4:
        i = len(lines)
        lines.append(f"{topic} log line {i}: module {i % 17} compiled, {i * 7 % 101} warnings.")
    return "\n".join(lines)
