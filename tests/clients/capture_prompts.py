"""Capture what the real agent programs send, for the prompt-normalisation fixtures.

A dev script, not a test: ``PYTHONPATH=$PWD .venv/bin/python -m tests.clients.capture_prompts``
runs Claude Code (two conversations, different first messages) and Qwen Code (a tool loop,
then a second turn with ``--continue``) against speclane (no lanes) before the scripted
upstream of the clients tier, records every generation request's body as the program sent it
(before speclane translates it), trims what belongs to this machine (temporary paths, the
host, the OS) and writes them to ``tests/fixtures/agent-prompts/``. The tests of
``router/proxy/normalise.py`` read those files; run this again when a program's pin changes.
"""

from __future__ import annotations

import asyncio
import json
import platform
import re
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from router.app import Wired
from tests.clients.programs import require
from tests.clients.scripted import MODEL, ScriptedUpstream, agent_turn, run_program
from tests.clients.test_claude_code import claude_env
from tests.clients.test_qwen_code import qwen_env
from tests.conftest import router_settings, run_router

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "agent-prompts"
GENERATION_PATHS = ("/v1/messages", "/v1/chat/completions")


def recording(bodies: list[dict[str, Any]]) -> Callable[[Wired], None]:
    """A setup hook for ``run_router``: a middleware that keeps each generation body."""

    @web.middleware
    async def keep(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.method == "POST" and request.path in GENERATION_PATHS:
            bodies.append(json.loads(await request.read()))  # aiohttp keeps the bytes
        return await handler(request)

    def setup(wired: Wired) -> None:
        wired.app.middlewares.insert(0, keep)

    return setup


def trimmed(value: Any, replacements: list[tuple[str, str]]) -> Any:
    """``value`` with every machine-specific string replaced."""
    text = json.dumps(value, ensure_ascii=False)
    for old, new in replacements:
        text = text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])
    # Claude Code's metadata names this machine (a hash) beside the session
    text = re.sub(r'device_id\\":\\"[0-9a-f]+', 'device_id\\\\":\\\\"' + "0" * 64, text)
    return json.loads(text)


async def capture(out: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="speclane-capture-"))
    replacements = [
        (str(tmp), "/home/user/work"),
        (socket.gethostname(), "host"),
        (platform.release(), "6.0.0"),
    ]
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - a dev script, once
    claude, qwen = require("claude"), require("qwen")
    project, home = tmp / "project", tmp / "home"
    project.mkdir()
    home.mkdir()
    notes = project / "notes.txt"
    notes.write_text("first line\nSECRET-LINE: the answer is forty-two\n")
    bodies: list[dict[str, Any]] = []
    upstream = ScriptedUpstream(agent_turn(notes, "ANSWER."))
    await upstream.start()
    try:
        async with run_router(router_settings(upstream), recording(bodies)) as router:  # type: ignore[arg-type]
            env = claude_env(router.url, home)
            for name, prompt in (
                ("claude-code-conversation-1", "What does notes.txt say?"),
                ("claude-code-conversation-2", "Summarise notes.txt in one line."),
            ):
                bodies.clear()
                ran = await run_program(
                    [str(claude), "-p", prompt, "--model", MODEL, "--allowedTools=Read"],
                    cwd=project,
                    env=env,
                )
                assert ran.code == 0, str(ran)
                save(out / f"{name}.json", bodies, replacements)
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
            for name, extra, prompt in (
                ("qwen-code-turn-1", [], "What does notes.txt say?"),
                ("qwen-code-turn-2", ["--continue"], "And once more?"),
            ):
                bodies.clear()
                ran = await run_program(
                    [str(qwen), *options, *extra, prompt], cwd=project, env=qwen_env(home)
                )
                assert ran.code == 0, str(ran)
                save(out / f"{name}.json", bodies, replacements)
    finally:
        await upstream.stop()


def save(path: Path, bodies: list[dict[str, Any]], replacements: list[tuple[str, str]]) -> None:
    kept = [trimmed(b, replacements) for b in bodies]
    path.write_text(json.dumps(kept, indent=1, ensure_ascii=False) + "\n")
    print(f"{path}: {len(kept)} request(s)", file=sys.stderr)


def main() -> None:
    asyncio.run(capture(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))


if __name__ == "__main__":
    main()
