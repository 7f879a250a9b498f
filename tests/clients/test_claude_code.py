"""Claude Code (``claude -p``) through speclane's Anthropic door, with its default tools.

Its default tool set makes it send a system message inside ``messages`` (the environment,
its agents and skills) and ``context_management`` with every request: the two things that
stopped it before. One turn reads a file with its Read tool, the second continues the
conversation (``--continue``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clients.programs import require
from tests.clients.scripted import MODEL, agent_turn, run_program, speclane_before

# the first run installs the program (bounded by programs.INSTALL_TIMEOUT), then two turns
pytestmark = [pytest.mark.clients, pytest.mark.timeout(900)]

SECRET = "SECRET-LINE: the password is swordfish"


def claude_env(router_url: str, home: Path) -> dict[str, str]:
    return {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": router_url,
        "ANTHROPIC_API_KEY": "sk-speclane-test",
        # side requests (titles, summaries) go to the "small fast" model: the same one here
        "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
    }


async def test_claude_code_reads_a_file_then_continues(tmp_path: Path) -> None:
    claude = require("claude")
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    notes = project / "notes.txt"
    notes.write_text(f"first line\n{SECRET}\n")
    script = agent_turn(notes, "ANSWER-ONE.")
    async with speclane_before(lambda body: script(body)) as (router, upstream):
        env = claude_env(router.url, home)
        options = ["--model", MODEL, "--allowedTools=Read"]
        first = await run_program(
            [str(claude), "-p", "What does notes.txt say?", *options], cwd=project, env=env
        )
        assert first.code == 0, str(first)
        assert "ANSWER-ONE." in first.out and "swordfish" in first.out, str(first)
        tool_results = [
            m
            for body in upstream.chats()
            for m in body["messages"]
            if m["role"] == "tool" and "swordfish" in str(m["content"])
        ]
        assert tool_results, "the Read tool's result never reached the upstream"
        # speclane's lanes fold system messages; a plain upstream gets them as sent, in place
        roles = [m["role"] for m in upstream.chats()[-1]["messages"]]
        assert roles[0] == "system" and "system" in roles[1:], roles
        # its per-conversation billing line is dropped (router/proxy/normalise.py)
        systems = [body["messages"][0]["content"] for body in upstream.chats()]
        assert not any("x-anthropic-billing-header" in text for text in systems), systems[0][:200]
        assert systems[0].startswith("You are ")

        script = agent_turn(notes, "ANSWER-TWO.")
        seen = len(upstream.chats())
        second = await run_program(
            [str(claude), "-p", "And once more?", "--continue", *options], cwd=project, env=env
        )
        assert second.code == 0, str(second)
        assert "ANSWER-TWO." in second.out, str(second)
        history = " ".join(str(m.get("content")) for m in upstream.chats()[seen]["messages"])
        assert "What does notes.txt say?" in history and "ANSWER-ONE." in history
