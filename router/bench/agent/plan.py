"""The agent benchmark's workload (pure, deterministic): a long system prompt and a few tools
resent on every turn, the user's questions, and the long document of the starvation test."""

from __future__ import annotations

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    arg: {"type": "string", "description": f"the {arg}"} for arg in args
                },
                "required": list(args),
            },
        },
    }
    for name, description, args in (
        ("read", "Read a file of the workspace.", ("path",)),
        ("edit", "Replace a string in a file.", ("path", "old", "new")),
        ("exec", "Run a shell command in the workspace.", ("command",)),
    )
]
QUESTIONS = (
    "The test suite fails in parser.py with an IndexError. What do you check first?",
    "You found an off-by-one in the loop. Describe the smallest fix.",
    "Now the tests pass. Write a one-line commit message.",
    "Which other files might have the same bug?",
    "Summarise what we did in two sentences.",
)


def system_prompt(approx_tokens: int) -> str:
    """A deterministic agent system prompt of roughly ``approx_tokens`` tokens."""
    rules = [
        "Read a file before you edit it.",
        "Keep each change small and reviewable.",
        "Run the tests after every edit.",
        "Never commit secrets or credentials.",
        "Prefer the standard library to a new dependency.",
        "Explain why, not what.",
        "Ask before deleting files.",
        "Quote error messages exactly.",
    ]
    lines = ["You are a coding agent working in a git repository. Follow these rules."]
    i = 0
    while sum(len(x) for x in lines) < approx_tokens * 4:
        lines.append(f"Rule {i + 1}: {rules[i % len(rules)]} (section {i // len(rules) + 1})")
        i += 1
    return "\n".join(lines)


def long_document(approx_tokens: int, topic: str) -> str:
    lines: list[str] = []
    i = 0
    while sum(len(x) for x in lines) < approx_tokens * 4:
        lines.append(f"{topic} log line {i}: module {i % 17} compiled, {i * 7 % 101} warnings.")
        i += 1
    return "\n".join(lines)
