"""The sessions of ``speclane bench session`` (pure): what an editing agent sends, turn by
turn. Each target answers with its own words; its answers go back into its own history, as
an agent's would, so a target whose output differs is still measured on its own session
(and the run says the outputs differ).

- ``whole``: aider's "whole" edit format: the file in the first message, four asks each
  answered with the whole file changed a little, one short question, the first ask again
  (an agent's retry).
- ``mixed``: the same file edited in other formats: a search/replace block, a unified diff,
  a question, the file written out whole, the first ask again.
- ``chat``: questions with nothing to copy: where no draft can pay, speculation must cost
  nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

FILE_NAME = "inventory.py"
FILE = '''"""A small inventory of items and their prices."""

from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 0


@dataclass
class Inventory:
    items: dict[str, Item] = field(default_factory=dict)

    def add_item(self, name: str, price: float, quantity: int = 1) -> Item:
        item = self.items.get(name)
        if item is None:
            item = self.items[name] = Item(name, price, 0)
        item.quantity += quantity
        return item

    def remove_item(self, name: str, quantity: int = 1) -> bool:
        item = self.items.get(name)
        if item is None or item.quantity < quantity:
            return False
        item.quantity -= quantity
        if item.quantity == 0:
            del self.items[name]
        return True

    def total(self) -> float:
        return sum(i.price * i.quantity for i in self.items.values())

    def names(self) -> list[str]:
        return sorted(self.items)


def cheapest(inventory: Inventory) -> Item | None:
    return min(inventory.items.values(), key=lambda i: i.price, default=None)
'''

WHOLE_SYSTEM = (
    "Act as an expert software developer. Take requests for changes to the supplied code. "
    "To suggest changes to a file you MUST return the entire content of the updated file, "
    "in a fenced code block with the file name on the line before it."
)
EDIT_SYSTEM = (
    "Act as an expert software developer. Take requests for changes to the supplied code. "
    "Answer in the format the user asks for: a SEARCH/REPLACE block, a unified diff or the "
    "whole file."
)
CHAT_SYSTEM = "You are a helpful assistant. Answer clearly."


@dataclass(frozen=True)
class Turn:
    ask: str
    kind: str  # what the answer is: whole, search_replace, diff, question, retry, chat


@dataclass(frozen=True)
class Session:
    name: str
    system: str
    turns: tuple[Turn, ...]


def _with_file(ask: str) -> str:
    return f"{FILE_NAME}\n```python\n{FILE}```\n\n{ask}"


RENAME = "Rename the method `total` to `total_value`. Return the whole file."

SESSIONS: dict[str, Session] = {
    "whole": Session(
        "whole",
        WHOLE_SYSTEM,
        (
            Turn(_with_file(RENAME), "whole"),
            Turn("Add a docstring to `add_item`. Return the whole file.", "whole"),
            Turn("Make `names` return the names in reverse order. Return the whole file.", "whole"),
            Turn("Question: what does `remove_item` return when the item is missing?", "question"),
            Turn("Change the default quantity of `Item` to 1. Return the whole file.", "whole"),
            Turn(RENAME, "retry"),
        ),
    ),
    "mixed": Session(
        "mixed",
        EDIT_SYSTEM,
        (
            Turn(
                _with_file(
                    "Rename the method `total` to `total_value`. Answer with one "
                    "SEARCH/REPLACE block: the file name, then <<<<<<< SEARCH, the lines "
                    "to replace, =======, the new lines, >>>>>>> REPLACE."
                ),
                "search_replace",
            ),
            Turn(
                "Add a docstring to `cheapest`. Answer with a unified diff of "
                f"{FILE_NAME} (--- a/{FILE_NAME}, +++ b/{FILE_NAME}, @@ hunks).",
                "diff",
            ),
            Turn("Question: which method removes items, and when does it fail?", "question"),
            Turn(
                "Now write out the whole updated file with both changes applied.",
                "whole",
            ),
            Turn(
                "Rename the method `total` to `total_value` again, as a SEARCH/REPLACE block.",
                "retry",
            ),
        ),
    ),
    "chat": Session(
        "chat",
        CHAT_SYSTEM,
        (
            Turn("Explain what a hash map is, in a short paragraph.", "chat"),
            Turn("Give three tips for naming variables well.", "chat"),
            Turn("Why do programmers write tests? Answer briefly.", "chat"),
        ),
    ),
}


def for_agent(session: Session, agent: int) -> Session:
    """Agent ``agent``'s copy of ``session`` when several run at once (``--agents``): its own
    file, the same edits. Agent 0 keeps the file as it is; another renames its module and
    classes, so no agent's prompt, cache or earlier answers are another's."""
    if agent == 0:
        return session

    def own(text: str) -> str:
        return (
            text.replace("Inventory", f"Inventory{agent}")
            .replace("inventory", f"inventory{agent}")
            .replace("Item", f"Item{agent}")
        )

    turns = tuple(Turn(own(t.ask), t.kind) for t in session.turns)
    return Session(f"{session.name}-{agent}", session.system, turns)
