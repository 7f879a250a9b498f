"""A scripted OpenAI-compatible upstream for the real client programs, and speclane before it.

The upstream is a real aiohttp server on 127.0.0.1, port 0. Each chat request is answered by
a ``Script``: a function of the request body that returns text or a tool call; the answer is
streamed (role chunk, content or tool-call chunks, finish chunk, usage when asked, ``[DONE]``)
or sent whole, as the request asks. Every request body is kept, so a test can check what the
program sent (a tool's result, the history of an earlier turn).

``agent_turn`` is the script the tool-using agents get: a request whose last message is not a
tool result is answered with one call of the program's file-reading tool (found in the
request's ``tools`` by name, its path argument filled from the schema); a request that ends
with the tool's result is answered with text quoting that result. Requests without tools
(titles, summaries, quota checks) get a short text.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from tests.conftest import RunningRouter, router_settings, run_router

MODEL = "agent-model"
READ_TOOLS = ("Read", "read_file", "ReadFile", "read")
PATH_KEYS = ("file_path", "absolute_path", "path", "filePath")
PROGRAM_TIMEOUT = 240.0


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]


Reply = str | Call
Script = Callable[[dict[str, Any]], Reply]


def last_tool_result(body: dict[str, Any]) -> str | None:
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    if last.get("role") != "tool":
        return None
    content = last.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def read_call(body: dict[str, Any], path: Path) -> Call:
    tools = {
        t["function"]["name"]: t["function"]
        for t in body.get("tools") or []
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    }
    name = next((n for n in READ_TOOLS if n in tools), None)
    if name is None:
        raise AssertionError(f"no file-reading tool among {sorted(tools)}")
    properties = (tools[name].get("parameters") or {}).get("properties") or {}
    key = next((k for k in PATH_KEYS if k in properties), None)
    if key is None:
        raise AssertionError(f"{name} has no path parameter among {sorted(properties)}")
    return Call(name, {key: str(path)})


def agent_turn(path: Path, answer: str) -> Script:
    """Read ``path`` with the program's tool, then say ``answer`` and the file's first line."""

    def script(body: dict[str, Any]) -> Reply:
        if not body.get("tools"):
            return "Reading a file"
        result = last_tool_result(body)
        if result is None:
            return read_call(body, path)
        first = next((line for line in result.splitlines() if "SECRET" in line), result[:80])
        return f"{answer} The file says: {first.strip()}"

    return script


class ScriptedUpstream:
    name = "scripted"  # the backend's name in speclane's configuration

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chats(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r.get("messages")]

    async def start(self) -> None:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "test"}],
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.requests.append(body)
        reply = self.script(body)
        ident = f"chatcmpl-{next(self._ids)}"
        usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
        if isinstance(reply, Call):
            call = {
                "id": f"call_{ident}",
                "type": "function",
                "function": {
                    "name": reply.name,
                    "arguments": orjson.dumps(reply.arguments).decode(),
                },
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": reply}, "stop"
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": 0,
                    "model": MODEL,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(
            delta: dict[str, Any] | None, reason: str | None = None, **extra: Any
        ) -> None:
            choices = (
                [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": reason}]
            )
            chunk = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": 0,
                "model": MODEL,
                "choices": choices,
                **extra,
            }
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")

        await send({"role": "assistant", "content": ""})
        if isinstance(reply, Call):
            arguments = message["tool_calls"][0]["function"]["arguments"]
            await send(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": message["tool_calls"][0]["id"],
                            "type": "function",
                            "function": {"name": reply.name, "arguments": ""},
                        }
                    ]
                }
            )
            await send({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]})
        else:
            for word in reply.split(" "):
                await send({"content": word + " "})
        await send({}, finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            await send(None, usage=usage)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@asynccontextmanager
async def speclane_before(script: Script) -> AsyncIterator[tuple[RunningRouter, ScriptedUpstream]]:
    """speclane (no lanes) in front of a scripted upstream, both on loopback ports."""
    upstream = ScriptedUpstream(script)
    await upstream.start()
    settings = router_settings(upstream)  # type: ignore[arg-type]
    try:
        async with run_router(settings) as router:
            yield router, upstream
    finally:
        await upstream.stop()


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-3000:]}"


def program_env(env: dict[str, str]) -> dict[str, str]:
    """This environment (PATH...) without the developer's own client settings, plus ``env``."""
    kept = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE", "QWEN", "AIDER"))
    }
    return {**kept, **env}


async def run_program(
    argv: list[str], *, cwd: Path, env: dict[str, str], limit: float = PROGRAM_TIMEOUT
) -> Ran:
    """Run a client program to its end (no stdin); kill it if it outlives ``limit`` seconds."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=program_env(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), limit)
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)  # the program and whatever it started
        out, err = await proc.communicate()
        return Ran(
            -9,
            out.decode(errors="replace"),
            err.decode(errors="replace") + f"\n[killed after {limit:.0f} s]",
        )
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))
