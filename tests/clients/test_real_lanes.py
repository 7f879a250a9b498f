"""The agents' real first requests on the real lanes (slow: realmodel).

Their prompts (Claude Code: system, tools, a system message after the user's turn; Qwen
Code: its system prompt and tools) are larger than the default model's 8,192-token context.
What must happen: the lane renders each with the model's chat template (system messages
folded in, no template error), counts it, and answers 400 ``context_length_exceeded``, which
the program shows.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME
from tests.clients.programs import require
from tests.clients.scripted import program_env
from tests.clients.test_claude_code import claude_env
from tests.clients.test_qwen_code import qwen_env
from tests.realmodel import Router

pytestmark = [pytest.mark.clients, pytest.mark.realmodel, pytest.mark.timeout(900)]


@pytest.fixture
def router(real_lanes_router: Router) -> Router:
    return real_lanes_router


def test_claude_codes_prompt_reaches_the_lanes_and_is_measured_against_the_context(
    router: Router, tmp_path: Path
) -> None:
    claude = require("claude")
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **claude_env(router.base_url.removesuffix("/v1"), home),
        "ANTHROPIC_SMALL_FAST_MODEL": DEFAULT_MODEL_NAME,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": DEFAULT_MODEL_NAME,
    }
    ran = subprocess.run(
        [str(claude), "-p", "Say hi", "--model", DEFAULT_MODEL_NAME],
        cwd=tmp_path,
        env=program_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    shown = ran.stdout + ran.stderr
    assert "context_length_exceeded" in shown, shown
    assert "the context is 8192" in shown, shown
    assert "chat template rejected" not in shown


def test_qwen_codes_prompt_reaches_the_lanes_and_is_measured_against_the_context(
    router: Router, tmp_path: Path
) -> None:
    qwen = require("qwen")
    home = tmp_path / "home"
    home.mkdir()
    ran = subprocess.run(
        [
            str(qwen),
            "--auth-type",
            "openai",
            "--openai-base-url",
            router.base_url,
            "--openai-api-key",
            "local",
            "--model",
            DEFAULT_MODEL_NAME,
            "Say hi",
        ],
        cwd=tmp_path,
        env=program_env(qwen_env(home)),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    shown = ran.stdout + ran.stderr
    assert ran.returncode != 0
    assert "context" in shown and "8192" in shown, shown
    assert "chat template rejected" not in shown
