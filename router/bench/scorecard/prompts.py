"""The prompt families (pure, deterministic): how well a draft guesses depends on the text,
from free prose (``chat``) and code (the draft's hardest cases) to lists (its best) and a
long document (prefill dominates, which speculation does not speed up). Request ``i`` of a
family uses prompt ``i mod len(prompts)``, so every scenario of a cell sends the same prompts
in the same order."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    title: str
    prompts: tuple[str, ...]


# Each family: its title, then one prompt per line.
_TEXTS = {
    "chat": """chat
Explain to a child why the sky is blue.
What is the capital of France? Answer in two sentences.
Give me three tips for sleeping better.
What is the difference between weather and climate?
Describe a cat to someone who has never seen one.
Why do people keep journals?""",
    "code": """code
Write a Python function that checks whether a string is a palindrome.
Write a Python function that returns the n-th Fibonacci number.
Write a JavaScript function that removes duplicates from an array.
Write a Python class for a stack with push, pop and peek.
Write a SQL query that counts orders per customer.
Write a Python function that reverses the words of a sentence.""",
    "list": """repetitive / list
Count from 1 to 40, separated by commas.
List the days of the week, one per line, and then list them again.
Write the numbers from 10 to 50 in steps of 2, separated by spaces.
List the months of the year, one per line.
Write the alphabet in capital letters, separated by commas.
Count down from 30 to 1, separated by commas.""",
    "long": """long prompt
Summarize the maintenance log above in three sentences.
Which pumps were mentioned most often in the log above? Answer briefly.
List the problems found in the log above.""",
}


def _family(text: str) -> Family:
    title, *prompts = text.splitlines()
    return Family(title, tuple(prompts))


FAMILIES = {name: _family(text) for name, text in _TEXTS.items()}

_PUMPS = ("north pump", "south pump", "intake valve", "reserve tank", "filter bank")
_FINDINGS = (
    "found the pressure slightly below the usual range and adjusted the regulator",
    "cleaned the screens and replaced one worn gasket",
    "noted a faint rattle at start-up that stopped after a few minutes",
    "checked the readings against last week's and found them stable",
    "topped up the lubricant and tightened two loose bolts",
    "saw a small leak near the outlet and scheduled a repair",
    "ran the backup generator for ten minutes without trouble",
)


def long_document(chars: int) -> str:
    """A maintenance log of about ``chars`` characters: prose that varies line to line, so
    neither the model nor the draft can coast on a repeated sentence."""
    lines = ["Maintenance log of the Harbor Street pumping station."]
    day, size = 0, len(lines[0])
    while size < chars:
        day += 1
        pump, finding = _PUMPS[(day * 3) % len(_PUMPS)], _FINDINGS[(day * 5) % len(_FINDINGS)]
        lines.append(
            f"Day {day}: a crew of {2 + day % 4} inspected the {pump}, {finding}; "
            f"the shift ended at {16 + day % 5}:{(day * 7) % 60:02d}."
        )
        size += len(lines[-1]) + 1
    return "\n".join(lines)


def prompt_for(family: str, index: int, long_prompt_chars: int) -> str:
    prompts = FAMILIES[family].prompts
    question = prompts[index % len(prompts)]
    return f"{long_document(long_prompt_chars)}\n\n{question}" if family == "long" else question
