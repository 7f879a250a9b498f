"""Codex, the real program (``codex exec``, npm ``@openai/codex``, pinned), against
``speclane serve --no-lanes`` in front of a scripted loopback upstream: one turn in which
the model runs a shell command and reads its output, then a second turn of the same session
(``codex exec resume --last``); and ``codex exec --oss`` through the Ollama door.

The pinned package is installed once into a cache directory (``tests.clients.programs``);
the tests skip, saying why, only when the npm registry cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.frontdoors import responses_compact
from tests.clients.programs import require
from tests.fakes.upstream import Behaviour, FakeUpstream, fake_upstream
from tests.reliability.harness import RouterProcess, clean_env, config_text

MODEL = "fake-model"
COMMAND = "echo speclane-$((6*7))-ok"  # its output differs from its text: the shell ran
MARKER = "speclane-42-ok"
FIRST_ANSWER = "The command printed the marker."
SECOND_ANSWER = "Second turn answered."
RUN_TIMEOUT = 240.0

pytestmark = pytest.mark.clients


@pytest.fixture(scope="module")
def codex() -> Path:
    return require("codex")


# --- the scripted upstream --------------------------------------------------------------------


def _chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return (
        b"data: "
        + orjson.dumps(
            {
                "id": "chatcmpl-codex",
                "object": "chat.completion.chunk",
                "model": MODEL,
                "choices": choices,
                **extra,
            }
        )
        + b"\n\n"
    )


def _end(finish: str) -> bytes:
    usage = {
        "prompt_tokens": 900,
        "completion_tokens": 12,
        "total_tokens": 912,
        "prompt_tokens_details": {"cached_tokens": 800},
    }
    return _chunk({}, finish) + _chunk(None, usage=usage) + b"data: [DONE]\n\n"


def shell_call(command: str) -> Behaviour:
    args = orjson.dumps({"cmd": command}).decode()
    body = _chunk({"role": "assistant", "content": ""}) + _chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_codex1",
                    "type": "function",
                    "function": {"name": "exec_command", "arguments": ""},
                }
            ]
        }
    )
    for i in range(0, len(args), 9):
        body += _chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[i : i + 9]}}]})
    return Behaviour(raw_body=body + _end("tool_calls"))


def text(answer: str) -> Behaviour:
    body = _chunk({"role": "assistant", "content": ""})
    for word in answer.split(" "):
        body += _chunk({"content": word + " "})
    return Behaviour(raw_body=body + _end("stop"))


@contextlib.asynccontextmanager
async def speclane_in_front_of(fake: FakeUpstream, tmp_path: Path) -> AsyncIterator[RouterProcess]:
    config = tmp_path / "speclane.toml"
    config.write_text(
        config_text(
            [{"name": "scripted", "kind": "openai", "base_url": fake.base_url, "read_timeout": 60}],
            health_interval=60,
        )
    )
    router = await RouterProcess.start(config, "--no-lanes")
    try:
        yield router
    finally:
        await router.stop()


async def run_codex(
    codex: Path, home: Path, workdir: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(codex),
        *args,
        cwd=workdir,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(CODEX_HOME=str(home), NO_COLOR="1", **(env or {})),
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        raise AssertionError(f"codex {args[:2]} did not finish in {RUN_TIMEOUT:g}s") from None
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


def provider_flags(base_url: str) -> list[str]:
    """A custom provider speaking the Responses API to speclane (what docs/clients/codex.md
    shows as config.toml)."""
    return [
        "-c",
        "model_provider=speclane",
        "-c",
        (
            'model_providers.speclane={name="speclane", base_url="'
            + base_url
            + '", wire_api="responses", request_max_retries=0, stream_max_retries=0}'
        ),
        "-m",
        MODEL,
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
    ]


def inputs_of(fake: FakeUpstream, i: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = fake.requests[i].body["messages"]
    return messages


async def test_codex_exec_runs_a_tool_then_a_second_turn(codex: Path, tmp_path: Path) -> None:
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    async with (
        fake_upstream(models=(MODEL,)) as fake,
        speclane_in_front_of(fake, tmp_path) as router,
    ):
        fake.then(shell_call(COMMAND), text(FIRST_ANSWER), text(SECOND_ANSWER))
        flags = provider_flags(router.base_url)
        code, out, err = await run_codex(
            codex, home, work, "exec", *flags, "Run the marker command and tell me what it printed."
        )
        assert code == 0, f"codex exec failed ({code}):\n{out}\n{err}"
        code2, out2, err2 = await run_codex(
            codex, home, work, "exec", *flags, "resume", "--last", "And now the second question."
        )
        assert code2 == 0, f"codex exec resume failed ({code2}):\n{out2}\n{err2}"
    assert FIRST_ANSWER in out, out + err
    assert SECOND_ANSWER in out2, out2 + err2
    assert len(fake.requests) == 3
    first = fake.requests[0].body
    assert any(t["function"]["name"] == "exec_command" for t in first["tools"])
    assert first["stream"] is True and first["prompt_cache_key"]
    # The tool ran on this machine and its output reached the model as a tool message.
    tool_messages = [m for m in inputs_of(fake, 1) if m["role"] == "tool"]
    assert tool_messages and tool_messages[0]["tool_call_id"] == "call_codex1"
    assert MARKER in tool_messages[0]["content"]
    # The second turn carries the first one: the call, its output, the answer, the new ask.
    second = inputs_of(fake, 2)
    assert any(m.get("tool_calls") for m in second)
    assert any(FIRST_ANSWER in (m.get("content") or "") for m in second if m["role"] == "assistant")
    assert "second question" in second[-1]["content"]
    assert second[: len(inputs_of(fake, 1))] == inputs_of(fake, 1)  # a stable prefix: cacheable


async def test_codex_oss_through_the_ollama_door(codex: Path, tmp_path: Path) -> None:
    """``codex exec --oss`` checks /api/version (0.13.4 or newer), lists /v1/models and then
    speaks the Responses API on the same port."""
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    async with (
        fake_upstream(models=(MODEL,)) as fake,
        speclane_in_front_of(fake, tmp_path) as router,
    ):
        fake.then(text(FIRST_ANSWER))
        code, out, err = await run_codex(
            codex,
            home,
            work,
            "exec",
            "--oss",
            "--local-provider",
            "ollama",
            "-m",
            MODEL,
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "Say hello.",
            env={"CODEX_OSS_BASE_URL": router.base_url},
        )
    assert code == 0, f"codex exec --oss failed ({code}):\n{out}\n{err}"
    assert FIRST_ANSWER in out
    assert len(fake.requests) == 1 and fake.requests[0].body["model"] == MODEL


async def test_codex_oss_with_a_model_speclane_does_not_serve(codex: Path, tmp_path: Path) -> None:
    """Codex pulls a model missing from the list; speclane's answer says what it serves."""
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    async with (
        fake_upstream(models=(MODEL,)) as fake,
        speclane_in_front_of(fake, tmp_path) as router,
    ):
        code, out, err = await run_codex(
            codex,
            home,
            work,
            "exec",
            "--oss",
            "--local-provider",
            "ollama",
            "-m",
            "gpt-oss:20b",
            "--skip-git-repo-check",
            "Say hello.",
            env={"CODEX_OSS_BASE_URL": router.base_url},
        )
    assert code != 0
    assert "does not download models" in out + err and MODEL in out + err
    assert not fake.requests


SUMMARY = "SUMMARY: the marker command ran and printed its marker."


async def compacting_run(
    codex: Path, tmp_path: Path, provider_name: str
) -> tuple[FakeUpstream, list[str], str]:
    """One ``codex exec`` that compacts after its tool call: past
    ``model_auto_compact_token_limit`` (the scripted usage reports 912 tokens an answer).
    Returns the upstream, each request's last message and Codex's output."""
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    async with (
        fake_upstream(models=(MODEL,)) as fake,
        speclane_in_front_of(fake, tmp_path) as router,
    ):
        fake.then(shell_call(COMMAND), text(SUMMARY), text(FIRST_ANSWER))
        provider = (
            f'model_providers.speclane={{name="{provider_name}", base_url="{router.base_url}", '
            'wire_api="responses", request_max_retries=0, stream_max_retries=0}'
        )
        flags = [*provider_flags(router.base_url), "-c", provider]
        flags += ["-c", "model_auto_compact_token_limit=300"]
        code, out, err = await run_codex(
            codex, home, work, "exec", *flags, "Run the marker command."
        )
    assert code == 0, f"codex exec failed ({code}):\n{out}\n{err}"
    assert "context compacted" in out + err and FIRST_ANSWER in out, out + err
    assert all(r.path == "/v1/chat/completions" for r in fake.requests)
    asks = [str(inputs_of(fake, i)[-1]["content"]) for i in range(len(fake.requests))]
    return fake, asks, out + err


async def test_codex_compacts_its_context_through_speclane(codex: Path, tmp_path: Path) -> None:
    """With a custom provider Codex compacts locally, through the same ``/v1/responses``
    (no ``/responses/compact``): a summarization turn of its own, then the conversation goes
    on from the summary."""
    fake, asks, _ = await compacting_run(codex, tmp_path, "speclane")
    compacting = [i for i, ask in enumerate(asks) if "COMPACTION" in ask]
    assert compacting and compacting[0] + 1 < len(asks), asks
    # The turn after it starts from the summary, not from the whole conversation.
    carried = " ".join(str(m.get("content")) for m in inputs_of(fake, compacting[0] + 1))
    assert SUMMARY in carried and MARKER not in carried


async def test_codex_remote_compaction_through_speclane(codex: Path, tmp_path: Path) -> None:
    """A provider named "OpenAI" makes Codex compact remotely: a ``compaction_trigger`` item
    at the end of a ``/v1/responses`` input, expecting one compaction item back, sent back
    in later requests in place of the conversation."""
    fake, asks, output = await compacting_run(codex, tmp_path, "OpenAI")
    assert "compact task" not in output  # no "Error running remote compact task"
    compacting = [i for i, ask in enumerate(asks) if ask == responses_compact.PROMPT]
    assert len(compacting) == 1, asks
    carried = inputs_of(fake, compacting[0] + 1)
    assert any(m["content"] == responses_compact.PREAMBLE + SUMMARY for m in carried), carried
    assert MARKER not in " ".join(str(m.get("content")) for m in carried)
