"""The access log: one line per request with who/what/where/how, a 5xx names the backend
and why; the JSON log format; the --log-level and --log-format flags of serve."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import aiohttp
import openai
import pytest
from aiohttp import web

from router.observability.logfmt import JsonFormatter
from router.proxy.accesslog import AccessRecord
from router.proxy.handlers import Inbound, proxy
from router.proxy.services import Services, bind
from tests.conftest import router_settings, run_router
from tests.fakes.upstream import Behaviour, FakeUpstream
from tests.reliability.harness import RouterProcess, chat_body, config_text, eventually

CHAT = [{"role": "user", "content": "hi"}]


async def test_one_line_per_request_with_its_fields(
    fake: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="speclane.access")
    async with run_router(router_settings(fake)) as r:
        client = r.client()
        await client.chat.completions.create(model="fake-model", messages=CHAT)
        stream = await client.chat.completions.create(
            model="fake-model", messages=CHAT, stream=True
        )
        async for _ in stream:
            pass
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="missing", messages=CHAT)
        recent = list(r.services.access.recent)
    plain, streamed, missing = recent
    assert (plain.client, plain.model, plain.backend, plain.status) == (
        "default",
        "fake-model",
        "fake",
        200,
    )
    assert plain.stream is False and plain.ttft_ms is None  # TTFT: streams only
    assert plain.tokens == 5 and plain.decision and plain.attempts == 1
    assert streamed.stream is True and streamed.ttft_ms is not None
    assert missing.status == 404 and missing.backend is None
    assert missing.error and missing.error.startswith("model_not_found:")
    lines = [rec for rec in caplog.records if rec.name == "speclane.access"]
    assert len(lines) == 3
    assert all(rec.levelno == logging.INFO for rec in lines)
    first = lines[0].getMessage()
    for part in (
        "endpoint=chat",
        "client=default",
        "model=fake-model",
        "backend=fake",
        "status=200",
        "tokens=5",
        "stream=false",
        "duration_ms=",
    ):
        assert part in first, first


async def test_a_5xx_names_the_backend_and_why(
    fake: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="speclane.access")
    fake.behaviour = Behaviour(delay_headers=30)
    backend = {"name": "fake", "kind": "openai", "base_url": fake.base_url, "read_timeout": 0.2}
    async with run_router(router_settings(fake, backends=[backend])) as r:
        with pytest.raises(openai.APIStatusError):
            await r.client().chat.completions.create(model="fake-model", messages=CHAT)
    [line] = [rec for rec in caplog.records if rec.name == "speclane.access"]
    assert line.levelno == logging.WARNING
    text = line.getMessage()
    assert "status=504" in text and "backend=fake" in text
    assert "backend 'fake' did not answer within 0.2s" in text


def test_text_line_quotes_values_with_spaces() -> None:
    rec = AccessRecord(
        at=0.0,
        endpoint="chat",
        client="a b",
        model="m",
        stream=False,
        lane=None,
        backend="x",
        decision='say "hi"',
        status=200,
        duration_ms=1.25,
        ttft_ms=None,
        tokens=None,
        attempts=1,
        error=None,
    )
    assert rec.line() == (
        'endpoint=chat client="a b" model=m stream=false backend=x '
        'decision="say \\"hi\\"" status=200 duration_ms=1.2 attempts=1'
    )


def test_json_formatter_puts_fields_at_the_top_level() -> None:
    record = logging.LogRecord("speclane.access", logging.INFO, __file__, 1, "%s", ("x",), None)
    record.fields = {"client": "agent", "status": 200, "message": "not overwritten"}
    data = json.loads(JsonFormatter().format(record))
    assert data["logger"] == "speclane.access" and data["level"] == "info"
    assert data["message"] == "x" and data["client"] == "agent" and data["status"] == 200


async def test_serve_log_flags(tmp_path: Path, fake: FakeUpstream) -> None:
    (tmp_path / "policies").mkdir()
    config = tmp_path / "speclane.toml"
    config.write_text(
        config_text(
            policies_dir=str(tmp_path / "policies"),
            log_level="warning",
            backends=[{"name": "fake", "base_url": fake.base_url}],
        )
    )
    proc = await RouterProcess.start(
        config, "--no-lanes", "--log-level", "info", "--log-format", "json"
    )
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{proc.base_url}/chat/completions", json=chat_body()) as resp:
                assert resp.status == 200

        def access_lines() -> list[dict]:
            found = []
            for line in proc.stderr:
                if line.startswith("{"):
                    data = json.loads(line)
                    if data["logger"] == "speclane.access":
                        found.append(data)
            return found

        async def logged() -> bool:
            return bool(access_lines())

        await eventually(logged, 10, "the access log line")
    finally:
        await proc.stop()
    [line] = access_lines()
    assert line["client"] == "default" and line["status"] == 200 and line["backend"] == "fake"
    assert all(x.startswith("{") for x in proc.stderr if x.strip())  # every line is JSON


def test_reported_tokens_read_once_and_again_when_the_answer_read_changes() -> None:
    from router.proxy.outcome import Outcome

    streamed = Outcome(endpoint="chat", arrival=0.0, stream=True)
    assert streamed.reported_tokens() is None  # nothing read yet
    streamed.tail_events = [{"usage": {"completion_tokens": 5}}, {"choices": []}]
    assert streamed.reported_tokens() == 5  # the newest event with a count
    assert streamed.reported_tokens() == 5
    streamed.tail_events = [{"usage": {"completion_tokens": 9}}]
    assert streamed.reported_tokens() == 9  # a new tail is read again
    whole = Outcome(endpoint="chat", arrival=0.0, tail_events=[{"usage": {"completion_tokens": 1}}])
    whole.body_json = {"usage": {"completion_tokens": 3}}
    assert whole.reported_tokens() == 3  # a body, when there is one, says it


async def test_a_defect_is_booked_as_the_500_the_client_got(
    fake: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """A request that failed on a defect of speclane's (an exception of no known kind) was
    booked with status 0 while its client got a 500."""

    async def broken(services: Services, request: web.Request) -> web.StreamResponse:
        async def translate(raw: bytes) -> Inbound:
            raise RuntimeError("a defect")

        return await proxy(services, request, "chat", api="ollama", translate=translate)

    caplog.set_level(logging.INFO)
    async with (
        run_router(
            router_settings(fake),
            setup=lambda wired: wired.app.router.add_post("/api/x", bind(wired.services, broken)),
        ) as r,
        aiohttp.ClientSession() as s,
        s.post(f"{r.url}/api/x", json={"model": "fake-model"}) as resp,
    ):
        status, answer = resp.status, await resp.json()
        [record] = r.services.access.recent
    assert status == 500 and answer == {
        "error": "[internal_error] internal error in speclane (see its log)"
    }
    assert record.status == 500 and record.error and record.error.startswith("internal_error:")
    assert any("a defect" in str(rec.exc_info) for rec in caplog.records if rec.exc_info)
