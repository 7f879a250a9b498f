"""aider through speclane's OpenAI door, in a temporary git repository.

aider has no tool calls: its "tool" is the edit it asks for in text. The first turn answers
with a SEARCH/REPLACE block that aider applies to the file; the second turn
(``--restore-chat-history``) must bring the edited file and the first turn back to the
upstream. aider names no ``max_tokens``: the lanes now answer until EOS or the end of the
context instead of cutting at 512 tokens.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.clients.programs import require
from tests.clients.scripted import MODEL, Reply, run_program, speclane_before

# the first run installs the program (bounded by programs.INSTALL_TIMEOUT), then two turns
pytestmark = [pytest.mark.clients, pytest.mark.timeout(900)]

EDIT = (
    "I will change the first line.\n\n"
    "notes.txt\n```\n<<<<<<< SEARCH\nfirst line\n=======\nEDITED-BY-THE-MODEL\n"
    ">>>>>>> REPLACE\n```\n"
)


def last_user(body: dict[str, Any]) -> str:
    users = [m for m in body["messages"] if m["role"] == "user"]
    content = users[-1]["content"] if users else ""
    return content if isinstance(content, str) else str(content)


def script(body: dict[str, Any]) -> Reply:
    if "Please edit" in last_user(body):
        return EDIT
    return "ANSWER-TWO. The first line is now edited."


def aider_argv(aider: Path, base_url: str, message: str, *extra: str) -> list[str]:
    return [
        str(aider),
        "--model",
        f"openai/{MODEL}",
        "--openai-api-base",
        base_url,
        "--openai-api-key",
        "sk-speclane-test",
        "--edit-format",
        "diff",
        "--yes-always",
        "--no-auto-commits",
        "--no-check-update",
        "--analytics-disable",
        "--no-show-model-warnings",
        "--no-show-release-notes",
        "--no-pretty",
        "--no-fancy-input",
        "--map-tokens",
        "0",
        *extra,
        "--message",
        message,
        "notes.txt",
    ]


def aider_env(home: Path) -> dict[str, str]:
    # litellm would fetch its model price list from the network at import
    return {"HOME": str(home), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TERM": "dumb"}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository holding notes.txt, committed."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.txt").write_text("first line\nsecond line\n")
    for cmd in (
        ["git", "init", "-q"],
        ["git", "add", "notes.txt"],
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"],
    ):
        subprocess.run(cmd, cwd=repo, check=True, capture_output=True)
    return repo


async def test_aider_edits_a_file_then_continues(tmp_path: Path, repo: Path) -> None:
    aider = require("aider")
    home = tmp_path / "home"
    home.mkdir()
    notes = repo / "notes.txt"
    async with speclane_before(script) as (router, upstream):
        first = await run_program(
            aider_argv(aider, router.base_url, "Please edit notes.txt"),
            cwd=repo,
            env=aider_env(home),
        )
        assert first.code == 0, str(first)
        assert notes.read_text() == "EDITED-BY-THE-MODEL\nsecond line\n", str(first)
        assert "Applied edit to notes.txt" in first.out, str(first)
        assert "max_tokens" not in upstream.chats()[0]  # aider names no limit

        seen = len(upstream.chats())
        second = await run_program(
            aider_argv(aider, router.base_url, "What changed?", "--restore-chat-history"),
            cwd=repo,
            env=aider_env(home),
        )
        assert second.code == 0, str(second)
        assert "ANSWER-TWO." in second.out, str(second)
        sent = " ".join(str(m.get("content")) for m in upstream.chats()[seen]["messages"])
        assert "EDITED-BY-THE-MODEL" in sent and "Please edit notes.txt" in sent
