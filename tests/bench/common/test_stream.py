"""The benchmarks' streaming client against a real loopback upstream (tests/fakes)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from router.bench.common.stream import Reply, error_message, stream
from tests.fakes.upstream import Behaviour, FakeUpstream

BODY = {
    "model": "fake-model",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}


async def ask(fake: FakeUpstream, stop_after: int | None = None) -> Reply:
    reply = Reply()

    def enough(chunk: dict[str, Any]) -> bool:
        return stop_after is not None and len(reply.token_times) >= stop_after

    async with aiohttp.ClientSession() as session:
        url = f"{fake.base_url}/chat/completions"
        return await stream(session, url, BODY, {"X-Test": "1"}, reply, enough)


async def test_a_whole_stream_hands_every_piece_and_the_usage(fake: FakeUpstream) -> None:
    fake.then(Behaviour(chunks=4, usage_extra={"speclane_spec": {"drafted": 3}}))
    reply = await ask(fake)
    assert reply.done and reply.error is None and reply.status == 200
    assert reply.usage["completion_tokens"] == 4 and reply.usage["speclane_spec"] == {"drafted": 3}
    assert reply.text == "w0 w1 w2 w3 " and len(reply.token_times) == 4
    assert reply.sent <= reply.token_times[0] <= reply.token_times[-1]
    assert fake.requests[-1].headers["X-Test"] == "1"


async def test_a_stream_without_done_is_not_done(fake: FakeUpstream) -> None:
    fake.then(Behaviour(chunks=2, no_done=True))
    reply = await ask(fake)
    assert reply.text == "w0 w1 " and not reply.done and reply.error is None


async def test_errors_are_told_not_raised(fake: FakeUpstream) -> None:
    fake.then(Behaviour(status=503, error_message="busy"), Behaviour(die_after=1))
    reply = await ask(fake)
    assert reply.status == 503 and reply.error == "HTTP 503: busy"
    reply = await ask(fake)
    assert reply.text == "w0 " and not reply.done and reply.error is not None
    error_event = b'data: {"error": {"message": "lane died"}}\n\n'
    fake.then(Behaviour(raw_body=b'data: {"choices": []}\n\n' + error_event))
    assert (await ask(fake)).error == "stream error: lane died"


async def test_the_caller_can_stop_reading(fake: FakeUpstream) -> None:
    fake.then(Behaviour(chunks=50))
    reply = await ask(fake, stop_after=3)
    assert reply.text == "w0 w1 w2 " and not reply.done and reply.error is None


def test_error_messages() -> None:
    assert error_message(b'{"error": {"message": "no"}}') == "no"
    assert error_message(b"plain text\n") == "plain text"
    assert error_message(b"") == "(empty body)"


def test_reply_rates_use_usage_when_reported() -> None:
    s = Reply(
        sent=10.0,
        token_times=[11.0, 11.5, 12.0],
        usage={"completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 7}},
    )
    assert s.ttft == 1.0
    assert s.decode_rate() == pytest.approx(4.0)  # 4 tokens after the first in 1 s
    assert s.cached_tokens == 7
    assert Reply(sent=0.0).ttft is None and Reply(sent=0.0).decode_rate() is None
    assert Reply(sent=0.0, usage={"prompt_tokens_details": None}).cached_tokens is None
