"""Qwen Code (``qwen``, one-shot mode) through speclane's OpenAI door: its read_file tool
round trip, then a second turn in the same session (``--continue``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clients.programs import require
from tests.clients.scripted import MODEL, agent_turn, run_program, speclane_before

# the first run installs the program (bounded by programs.INSTALL_TIMEOUT), then two turns
pytestmark = [pytest.mark.clients, pytest.mark.timeout(900)]

SECRET = "SECRET-LINE: the answer is forty-two"


def qwen_env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "NO_COLOR": "1", "QWEN_CODE_DISABLE_TELEMETRY": "1"}


async def test_qwen_code_reads_a_file_then_continues(tmp_path: Path) -> None:
    qwen = require("qwen")
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    notes = project / "notes.txt"
    notes.write_text(f"first line\n{SECRET}\n")
    script = agent_turn(notes, "ANSWER-ONE.")
    async with speclane_before(lambda body: script(body)) as (router, upstream):
        options = [
            "--auth-type",
            "openai",
            "--openai-base-url",
            router.base_url,
            "--openai-api-key",
            "sk-speclane-test",
            "--model",
            MODEL,
            "--approval-mode",
            "default",
        ]
        first = await run_program(
            [str(qwen), *options, "What does notes.txt say?"], cwd=project, env=qwen_env(home)
        )
        assert first.code == 0, str(first)
        assert "ANSWER-ONE." in first.out and "forty-two" in first.out, str(first)
        tool_results = [
            m
            for body in upstream.chats()
            for m in body["messages"]
            if m["role"] == "tool" and "forty-two" in str(m["content"])
        ]
        assert tool_results, "the read_file tool's result never reached the upstream"

        script = agent_turn(notes, "ANSWER-TWO.")
        seen = len(upstream.chats())
        second = await run_program(
            [str(qwen), *options, "--continue", "And once more?"], cwd=project, env=qwen_env(home)
        )
        assert second.code == 0, str(second)
        assert "ANSWER-TWO." in second.out, str(second)
        history = " ".join(str(m.get("content")) for m in upstream.chats()[seen]["messages"])
        assert "What does notes.txt say?" in history and "ANSWER-ONE." in history
        # Turn 2 extends turn 1's last request: its date reminder no longer breaks the prefix
        # (router/proxy/normalise.py); the model still reads the date in the start-up context.
        before, after = upstream.chats()[seen - 1]["messages"], upstream.chats()[seen]["messages"]
        assert after[: len(before)] == before
        assert "The current date is" not in str(after)
