"""Capture what the real agent programs send, for the prompt-normalisation fixtures.

A dev script, not a test: ``PYTHONPATH=$PWD .venv/bin/python -m tests.clients.capture_prompts
[OUT] [PROGRAM ...]`` runs Claude Code (two conversations, different first messages), Qwen
Code (a tool loop, then a second turn with ``--continue``) and Codex (``codex exec``: a shell
call, then ``codex exec resume --last``), or only the PROGRAMs named (``claude``, ``qwen``,
``codex``), against speclane (no lanes) before the scripted upstream of the clients tier,
records every generation request's body as the program sent it (before speclane translates
it), trims what belongs to this machine (temporary paths, the host, the OS) and writes them
to ``tests/fixtures/agent-prompts/``. The tests of ``router/proxy/normalise.py`` and
``speclane bench prefill`` read those files; run this again when a program's pin changes.
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
from tests.clients.scripted import (
    MODEL,
    Call,
    Reply,
    Script,
    ScriptedUpstream,
    agent_turn,
    last_tool_result,
    run_program,
)
from tests.clients.test_claude_code import claude_env
from tests.clients.test_qwen_code import qwen_env
from tests.conftest import RunningRouter, router_settings, run_router

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "agent-prompts"
GENERATION_PATHS = ("/v1/messages", "/v1/chat/completions", "/v1/responses")
PROGRAMS = ("claude", "qwen", "codex")
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


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
    # Codex's names this installation (a UUID), in two spellings
    text = re.sub(r"(installation[-_]id[^0-9a-f]{1,12})[0-9a-f-]{36}", r"\g<1>" + ZERO_UUID, text)
    return json.loads(text)


def shell_turn(command: str, answer: str) -> Script:
    """Codex has no file-reading tool: run ``command`` with its shell tool, then say
    ``answer`` and the output's secret line."""

    def script(body: dict[str, Any]) -> Reply:
        result = last_tool_result(body)
        if result is None:
            return Call("exec_command", {"cmd": command})
        first = next((line for line in result.splitlines() if "SECRET" in line), result[:80])
        return f"{answer} The file says: {first.strip()}"

    return script


def by_program(reading: Script, shell: Script) -> Script:
    """``shell`` for a program whose tools are a shell's (Codex), else ``reading``."""

    def script(body: dict[str, Any]) -> Reply:
        names = {(t.get("function") or {}).get("name") for t in body.get("tools") or []}
        return shell(body) if "exec_command" in names else reading(body)

    return script


def codex_flags(base_url: str) -> list[str]:
    """A custom provider speaking the Responses API to speclane (docs/clients/codex.md)."""
    provider = (
        f'model_providers.speclane={{name="speclane", base_url="{base_url}", '
        'wire_api="responses", request_max_retries=0, stream_max_retries=0}'
    )
    return [
        *("-c", "model_provider=speclane", "-c", provider, "-m", MODEL),
        *("--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"),
    ]


async def capture(out: Path, programs: tuple[str, ...] = PROGRAMS) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="speclane-capture-"))
    replacements = [
        (str(tmp), "/home/user/work"),
        (socket.gethostname(), "host"),
        (platform.release(), "6.0.0"),
    ]
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - a dev script, once
    project, home = tmp / "project", tmp / "home"
    project.mkdir()
    home.mkdir()
    notes = project / "notes.txt"
    notes.write_text("first line\nSECRET-LINE: the answer is forty-two\n")
    bodies: list[dict[str, Any]] = []
    upstream = ScriptedUpstream(
        by_program(agent_turn(notes, "ANSWER."), shell_turn("cat notes.txt", "ANSWER."))
    )
    await upstream.start()
    try:
        async with run_router(router_settings(upstream), recording(bodies)) as router:  # type: ignore[arg-type]
            if "claude" in programs:
                await capture_claude(router, home, project, bodies, out, replacements)
            if "qwen" in programs:
                await capture_qwen(router, home, project, bodies, out, replacements)
            if "codex" in programs:
                await capture_codex(router, home, project, bodies, out, replacements)
    finally:
        await upstream.stop()


async def capture_claude(
    router: RunningRouter,
    home: Path,
    project: Path,
    bodies: list[dict[str, Any]],
    out: Path,
    replacements: list[tuple[str, str]],
) -> None:
    claude = require("claude")
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


async def capture_qwen(
    router: RunningRouter,
    home: Path,
    project: Path,
    bodies: list[dict[str, Any]],
    out: Path,
    replacements: list[tuple[str, str]],
) -> None:
    qwen = require("qwen")
    options = [
        *("--auth-type", "openai", "--openai-base-url", router.base_url),
        *("--openai-api-key", "sk-speclane-test", "--model", MODEL),
        *("--approval-mode", "default"),
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


async def capture_codex(
    router: RunningRouter,
    home: Path,
    project: Path,
    bodies: list[dict[str, Any]],
    out: Path,
    replacements: list[tuple[str, str]],
) -> None:
    codex = require("codex")
    codex_home = home / "codex"
    codex_home.mkdir()
    env = {"CODEX_HOME": str(codex_home), "NO_COLOR": "1", "HOME": str(home)}
    flags = codex_flags(router.base_url)
    for name, extra, prompt in (
        ("codex-turn-1", [], "What does notes.txt say?"),
        ("codex-turn-2", ["resume", "--last"], "And once more?"),
    ):
        bodies.clear()
        ran = await run_program([str(codex), "exec", *flags, *extra, prompt], cwd=project, env=env)
        assert ran.code == 0, str(ran)
        save(out / f"{name}.json", bodies, replacements)


def save(path: Path, bodies: list[dict[str, Any]], replacements: list[tuple[str, str]]) -> None:
    kept = [trimmed(b, replacements) for b in bodies]
    path.write_text(json.dumps(kept, indent=1, ensure_ascii=False) + "\n")
    print(f"{path}: {len(kept)} request(s)", file=sys.stderr)


def main() -> None:
    args = sys.argv[1:]
    named = tuple(a for a in args if a in PROGRAMS)
    places = [a for a in args if a not in PROGRAMS]
    asyncio.run(capture(Path(places[0]) if places else OUT, named or PROGRAMS))


if __name__ == "__main__":
    main()
