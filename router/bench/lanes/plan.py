"""``speclane bench lanes``: what is sent (an agent's system prompt, tools and questions; the
mixed load's prompts)."""

from __future__ import annotations

from typing import Any

NO_EOS = {"0": -100, "2": -100}  # SmolLM2's end-of-text tokens (the default model)
QUESTIONS = (
    "The test suite fails in parser.py with an IndexError. What do you check first?",
    "You found an off-by-one in the loop. Describe the smallest fix.",
    "Now the tests pass. Write a one-line commit message.",
    "Which other files might have the same bug?",
)
TOOLS: list[dict[str, Any]] = [
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
    )
]


def system_prompt(approx_tokens: int, seed: str) -> str:
    """A deterministic agent system prompt of roughly ``approx_tokens`` tokens; ``seed``
    makes two conversations' prompts differ from their first token (no shared prefix)."""
    rules = (
        "Read a file before you edit it.",
        "Keep each change small and reviewable.",
        "Run the tests after every edit.",
        "Quote error messages exactly.",
    )
    lines = [f"[{seed}] You are a coding agent working in a git repository."]
    i = 0
    while sum(len(x) for x in lines) < approx_tokens * 4:
        lines.append(f"Rule {i + 1}: {rules[i % len(rules)]} (section {i // len(rules) + 1})")
        i += 1
    return "\n".join(lines)
