"""Late system messages through every door, in front of a backend whose chat template refuses
them (a fake that answers like mlx_lm.server with a Qwen template: 404 "System message must
be at the beginning."). Folded for the kinds that render a template, forwarded as sent for
kind ``openai``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import ollama
import openai
import pytest

from tests.conftest import RunningRouter, router_settings, run_router
from tests.fakes.upstream import SYSTEM_FIRST_MESSAGE, FakeUpstream, fake_upstream

MODEL = "fake-model"
NOTE = "<system>\nContext: today is Tuesday.\n</system>"
FOLDED = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": f"Hello\n\n{NOTE}"},
]


@asynccontextmanager
async def guarded(kind: str, **backend: Any) -> AsyncIterator[tuple[FakeUpstream, RunningRouter]]:
    """A router in front of one guarded fake of ``kind``."""
    async with fake_upstream(name="guarded", system_first=True) as fake:
        spec = {
            "name": fake.name,
            "kind": kind,
            "base_url": fake.base_url,
            "read_timeout": 5,
            "connect_timeout": 2,
            **backend,
        }
        async with run_router(router_settings(backends=[spec])) as r:
            yield fake, r


def sent(fake: FakeUpstream) -> list[dict[str, Any]]:
    assert len(fake.requests) == 1
    messages: list[dict[str, Any]] = fake.requests[0].body["messages"]
    return messages


KINDS = ["mlx_lm", "lmstudio", "llamacpp", "ollama", "vllm_mlx", "vllm", "sglang"]
LATE = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello"},
    {"role": "system", "content": "Context: today is Tuesday."},
]


@pytest.mark.parametrize("kind", KINDS)
async def test_openai_chat_folds_for_every_templating_kind(kind: str) -> None:
    async with guarded(kind) as (fake, r):
        answer = await r.client().chat.completions.create(model=MODEL, messages=LATE)  # type: ignore[arg-type]
    assert answer.choices[0].message.content
    assert sent(fake) == FOLDED


async def test_openai_chat_stream_folds() -> None:
    async with guarded("mlx_lm") as (fake, r):
        stream = await r.client().chat.completions.create(
            model=MODEL,
            messages=LATE,  # type: ignore[arg-type]
            stream=True,
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text and sent(fake) == FOLDED


async def test_kind_openai_forwards_them_as_sent() -> None:
    """Nothing changes for a hosted API: it gets the messages as the client sent them (here
    the guarded fake refuses them, as the template would)."""
    async with guarded("openai") as (fake, r):
        with pytest.raises(openai.NotFoundError) as refused:
            await r.client().chat.completions.create(model=MODEL, messages=LATE)  # type: ignore[arg-type]
    assert SYSTEM_FIRST_MESSAGE in str(refused.value)
    assert sent(fake) == LATE


async def test_the_setting_wins_over_the_kind() -> None:
    async with guarded("mlx_lm", system_messages="as_is") as (fake, r):
        with pytest.raises(openai.NotFoundError):
            await r.client().chat.completions.create(model=MODEL, messages=LATE)  # type: ignore[arg-type]
    assert sent(fake) == LATE
    async with guarded("openai", system_messages="fold") as (fake, r):
        await r.client().chat.completions.create(model=MODEL, messages=LATE)  # type: ignore[arg-type]
    assert sent(fake) == FOLDED


async def test_a_conversation_without_late_ones_is_forwarded_as_sent() -> None:
    plain = LATE[:2]
    async with guarded("mlx_lm") as (fake, r):
        await r.client().chat.completions.create(model=MODEL, messages=plain)  # type: ignore[arg-type]
    assert sent(fake) == plain


async def test_responses_door_folds() -> None:
    async with guarded("lmstudio") as (fake, r):
        response = await r.client().responses.create(
            model=MODEL,
            instructions="Be brief.",
            input=[
                {"role": "user", "content": "Hello"},
                {"role": "developer", "content": "Context: today is Tuesday."},
            ],
        )
    assert response.status == "completed" and response.output_text
    assert sent(fake) == FOLDED


async def test_anthropic_door_folds_claude_codes_mid_conversation_system_messages() -> None:
    async with guarded("llamacpp") as (fake, r):
        client = anthropic.AsyncAnthropic(
            base_url=r.url, api_key="test-key", max_retries=0, timeout=30
        )
        async with client:
            message = await client.messages.create(
                model=MODEL,
                max_tokens=16,
                system="Be brief.",
                messages=[
                    {"role": "user", "content": "Hello"},
                    {"role": "system", "content": "Context: today is Tuesday."},  # type: ignore[typeddict-item]
                ],
                extra_headers={"anthropic-beta": "mid-conversation-system-2026-04-07"},
            )
    assert message.stop_reason and message.content
    assert sent(fake) == FOLDED


async def test_ollama_door_folds() -> None:
    async with guarded("ollama") as (fake, r):
        answer = await ollama.AsyncClient(host=r.url, timeout=30).chat(
            model=MODEL, messages=LATE, stream=False
        )
    assert answer.message.content
    assert sent(fake) == FOLDED
