"""Log lines cannot be forged: whatever a client or an upstream puts in a value (CR, LF,
escape sequences, C1 controls, Unicode line separators), each request is exactly one
access-log line, in the text and the JSON formats, and nothing starts a line of its own."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import sys
from collections.abc import Iterator

import aiohttp
import orjson
import pytest

from router.observability.escape import escape_controls
from router.observability.logfmt import LOG_FORMATS, TRACE_INDENT, LogFormat, formatter
from router.proxy.accesslog import AccessRecord
from tests.conftest import router_settings, run_router
from tests.fakes.upstream import Behaviour, FakeUpstream

FORGED = "INFO speclane.access: endpoint=chat client=admin status=200 FORGED"
# Every kind of control a value can carry: a forged line after CR LF, LF, a lone CR, a
# terminal escape sequence, a C1 control (NEL), DEL, and the Unicode line separators.
HOSTILE = (
    f"\r\n{FORGED}\n{FORGED}\r{FORGED}\x1b[2J\x1b]0;title\x07\x85\x9b31m\x7f"
    f"\u2028{FORGED}\u2029{FORGED}"
)
# What a header can carry to a handler: HTTP/1.1 parsers refuse CR, LF and the other C0
# controls in a header (no client library sends them), but a UTF-8 header value can hold C1
# controls and the Unicode line separators.
HOSTILE_HEADER = "agent\u0085INFO forged\u009b2J\u2028INFO forged\u2029-end".encode()
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) [\w.]+: ")
HANG = 30.0  # a guard against hanging, not a speed claim
RAW_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


@pytest.fixture(params=LOG_FORMATS)
def captured(request: pytest.FixtureRequest) -> Iterator[tuple[LogFormat, io.StringIO]]:
    """Everything logged at INFO and above, written by speclane's own formatter."""
    fmt: LogFormat = request.param
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield fmt, out
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def records(fmt: LogFormat, text: str) -> list[str]:
    """The log's records (a text record's traceback lines are indented under it), each
    checked to be whole: none forged, none cut."""
    lines = text.split("\n")
    assert lines[-1] == ""  # the log ends with its last record's newline
    found: list[str] = []
    for line in lines[:-1]:
        assert not RAW_CONTROLS.search(line), repr(line)
        if fmt == "json":
            json.loads(line)
        elif line.startswith(TRACE_INDENT) and found:
            continue  # a traceback's line, under its record
        else:
            assert TEXT_LINE.match(line), repr(line)
        found.append(line)
    return found


def access_lines(fmt: LogFormat, lines: list[str]) -> list[str]:
    if fmt == "json":
        return [ln for ln in lines if json.loads(ln)["logger"] == "speclane.access"]
    return [ln for ln in lines if " speclane.access: " in ln]


async def raw_post(port: int, path: str, headers: bytes, body: bytes) -> int:
    """A request written byte for byte (no client library would send these headers)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (path.encode(), len(body), headers, body)
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), HANG)
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1])


async def test_each_request_is_one_access_line_whatever_its_values_hold(
    fake: FakeUpstream, captured: tuple[LogFormat, io.StringIO]
) -> None:
    fmt, out = captured
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    doors = [
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", {**chat, "stream": True}),
        ("/v1/messages", {**chat, "max_tokens": 8}),
        ("/v1/messages", {**chat, "max_tokens": 8, "stream": True}),
        ("/api/chat", {**chat, "stream": False}),
        ("/api/chat", chat),
    ]
    hostile_headers = b"".join(
        b"%s: %s\r\n" % (name, HOSTILE_HEADER)
        for name in (b"User-Agent", b"X-Speclane-Client", b"X-Speclane-Preset")
    )
    answered = 0
    async with run_router(router_settings(fake)) as r, aiohttp.ClientSession() as s:
        for path, body in doors:
            # A model name of the client's choosing (404: quoted in the error too).
            async with s.post(f"{r.url}{path}", json={**body, "model": HOSTILE}) as resp:
                assert resp.status == 404, await resp.text()
            # An upstream error message of the upstream's choosing.
            fake.behaviour = Behaviour(status=400, error_message=HOSTILE)
            async with s.post(f"{r.url}{path}", json={**body, "model": "fake-model"}) as resp:
                assert resp.status == 400, await resp.text()
            fake.behaviour = Behaviour()
            # Headers of the client's choosing: user agent, client name, preset (a 400
            # quoting it) hold every control HTTP lets through.
            status = await raw_post(
                r.port, path, hostile_headers, orjson.dumps({**body, "model": "fake-model"})
            )
            assert status == 400
            answered += 3
        # A CR or an escape sequence inside a header value is no HTTP/1.1: refused (400)
        # before any handler; what is logged about it stays inside its record too.
        for bad in (b"a\rINFO forged", b"a\x1b[2J\x1b[1;1HINFO forged"):
            assert (
                await raw_post(r.port, "/v1/chat/completions", b"User-Agent: %s\r\n" % bad, b"{}")
                == 400
            )
    lines = records(fmt, out.getvalue())
    access = access_lines(fmt, lines)
    assert len(access) == answered, "\n".join(lines)
    assert not any(ln.startswith(("INFO", "FORGED")) for ln in lines)
    # The values are there, escaped, not dropped.
    messages = access if fmt == "text" else [json.loads(ln)["message"] for ln in access]
    assert sum(escape_controls("\r\n" + FORGED) in m for m in messages) >= 2 * len(doors)
    if fmt == "json":  # the fields too
        models = [json.loads(ln).get("model") for ln in access]
        assert models.count(escape_controls(HOSTILE)) == len(doors)


@pytest.mark.parametrize("fmt", LOG_FORMATS)
def test_a_traceback_quoting_a_hostile_value_stays_inside_its_record(fmt: LogFormat) -> None:
    try:
        raise ValueError(f"bad value {HOSTILE}")
    except ValueError:
        record = logging.getLogger("speclane.test").makeRecord(
            "speclane.test", logging.ERROR, __file__, 1, "failed on %s", (HOSTILE,), sys.exc_info()
        )
    text = formatter(fmt).format(record)
    assert not RAW_CONTROLS.search(text.replace("\n", "")), repr(text)
    if fmt == "json":
        assert "\n" not in text and json.loads(text)["logger"] == "speclane.test"
    else:
        first, *rest = text.split("\n")
        assert TEXT_LINE.match(first) and rest
        assert all(ln.startswith("  ") for ln in rest), text  # nothing starts a line


def test_access_line_quotes_and_escapes_every_value_that_needs_it() -> None:
    record = AccessRecord(
        at=0,
        endpoint="chat",
        client="default",
        model='m\r\n"x"=\\y',
        stream=False,
        lane=None,
        backend=None,
        decision=None,
        status=200,
        duration_ms=1.0,
        ttft_ms=None,
        tokens=None,
        attempts=1,
        error="upstream_error: a\x1bb\u2028c",
    )
    line = record.line()
    assert "\n" not in line and "\r" not in line and not RAW_CONTROLS.search(line)
    assert 'model="m\\r\\n\\"x\\"=\\\\y"' in line
    assert 'error="upstream_error: a\\x1bb\\u2028c"' in line
