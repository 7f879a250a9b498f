"""Fuzzing the front doors over HTTP: the Anthropic door (``/v1/messages``), the Ollama door
(``/api/chat``, ``/api/generate``), ``/v1/messages/count_tokens``, and streamed tool calls
that an upstream sends malformed or cut, through every door (OpenAI chat, Anthropic, Ollama,
OpenAI Responses).

One router runs in a thread of this process, in front of a scripted lane (both lanes are
the same loopback server: it answers generation, ``/tokenize`` and the model list). Each
surface gets ``FUZZ_CASES`` generated cases (Hypothesis, derandomised: the same cases every
run) sent over one keep-alive connection. The properties, for every case:

- no 5xx that is the router's own fault: a 5xx must say ``X-Speclane-Error-Source:
  upstream`` (the scripted lane failed, and the answer says so);
- the answer is in the caller's API shape: an Anthropic message or error object, SSE
  events whose ``data`` is JSON of the event's type; an Ollama object, or NDJSON lines of
  objects; an OpenAI body, or SSE ``data:`` JSON events and ``[DONE]``; a stream that
  fails ends with that API's error event, never silently;
- nothing the router logs carries a traceback.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.app import wire
from tests.conftest import add_fake_lane, router_settings
from tests.fakes.loopback import LoopbackServer
from tests.fuzzing import examples
from tests.reliability.harness import LoopThread, sse_payloads

FUZZ_CASES = int(os.environ.get("SPECLANE_FUZZ_CASES", examples(10000)))
MODEL = "fake-model"
FUZZ = settings(
    max_examples=FUZZ_CASES,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
)
MODELS_ANSWER = orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


# --- the scripted lane ------------------------------------------------------------------------


def http_answer(
    body: bytes,
    status: int = 200,
    ctype: str = "application/json",
    framing: str = "length",
    close: bool = False,
) -> bytes:
    """A whole HTTP/1.1 answer; ``framing``: length, chunked or close (body until EOF, and
    the connection closes, as with ``close``; else it is kept for the next request)."""
    head = [f"HTTP/1.1 {status} X", f"Content-Type: {ctype}"]
    if close or framing == "close":
        head.append("Connection: close")
    if framing == "length":
        head.append(f"Content-Length: {len(body)}")
    elif framing == "chunked":
        head.append("Transfer-Encoding: chunked")
        body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def keeps_alive(answer: bytes) -> bool:
    """Whether a scripted answer is a whole, framed answer that keeps its connection."""
    head, sep, _ = answer.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    framed = any(x.startswith((b"content-length:", b"transfer-encoding:")) for x in lines)
    return bool(sep) and framed and b"connection: close" not in lines


def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return (
        b"data: "
        + orjson.dumps(
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": MODEL,
                "choices": choices,
                **extra,
            }
        )
        + b"\n\n"
    )


STREAM = (
    chunk({"role": "assistant", "content": ""})
    + chunk({"content": "Hello"})
    + chunk({}, "stop")
    + chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4})
    + b"data: [DONE]\n\n"
)
BODY = orjson.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Hello"},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)
TEXT_STREAM = (
    b'data: {"id":"t","object":"text_completion","created":0,"model":"fake-model",'
    b'"choices":[{"index":0,"text":"Hi","finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
TEXT_BODY = orjson.dumps(
    {
        "id": "t",
        "object": "text_completion",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "text": "Hi", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)


@dataclass
class ScriptedLane(LoopbackServer):
    """Answers each request with ``script`` when set, else a well-formed answer for what was
    asked (a stream when the request streams); ``/tokenize`` answers ``tokenize``."""

    name: str = "fuzz"
    models: tuple[str, ...] = (MODEL,)
    script: bytes | None = None
    tokenize: bytes = field(default_factory=lambda: http_answer(b'{"count": 5}'))
    requests: int = 0

    async def _serve(self, reader: Any, writer: Any) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                answer = self.answer(head, body)
                writer.write(answer)
                await writer.drain()
                if not keeps_alive(answer):
                    return
        except (OSError, EOFError, ValueError):
            pass
        finally:
            writer.close()

    def answer(self, head: bytes, body: bytes) -> bytes:
        if head.startswith(b"GET /v1/models"):
            return http_answer(MODELS_ANSWER)
        self.requests += 1
        if b"/tokenize" in head.split(b"\r\n", 1)[0]:
            return self.tokenize
        if self.script is not None:
            return self.script
        streams = b'"stream":true' in body.replace(b" ", b"")
        if head.startswith(b"POST /v1/completions"):
            return (
                http_answer(TEXT_STREAM, ctype="text/event-stream")
                if streams
                else http_answer(TEXT_BODY)
            )
        return http_answer(STREAM, ctype="text/event-stream") if streams else http_answer(BODY)


# --- the router, and what it logs -------------------------------------------------------------


class Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or "Traceback" in record.getMessage():
            self.records.append(record)


class Doors:
    def __init__(self, port: int, lane: ScriptedLane) -> None:
        self.port, self.lane = port, lane
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.sent = 0
        self.cases: Counter[str] = Counter()  # surface -> cases checked

    def __repr__(self) -> str:
        return f"Doors(router on port {self.port})"

    def post(
        self, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        return self.send("POST", path, body, headers)

    def send(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        self.sent += 1
        for attempt in (1, 2):
            try:
                self.conn.request(
                    method,
                    path,
                    body=body,
                    headers={"Content-Type": "application/json", **(headers or {})},
                )
                resp = self.conn.getresponse()
                data = resp.read()
                if resp.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except (http.client.HTTPException, OSError):
                self.conn.close()  # the router closed a kept-alive connection: once more
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def doors() -> Iterator[Doors]:
    tracebacks = Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    # As serve --log-level error: the access log's 5xx warnings of thousands of failing
    # upstreams would cost more than the cases; errors (and tracebacks) are still seen.
    speclane = logging.getLogger("speclane")
    level, speclane.level = speclane.level, logging.ERROR
    with LoopThread() as loop:
        lane = ScriptedLane()
        loop.run(lane.listen())
        settings_ = router_settings(
            health_interval=600,
            log_level="error",
            retry={"attempts": 1, "backoff_initial": 0.001, "backoff_max": 0.001},
            cooldown={"allowed_fails": 1, "seconds": 0},
            max_body_bytes=256 * 1024,
        )
        wired = wire(settings_)
        add_fake_lane(wired, "speculative", lane)  # type: ignore[arg-type]
        add_fake_lane(wired, "batching", lane)  # type: ignore[arg-type]
        runner = web.AppRunner(
            wired.app, handler_cancellation=True, access_log=None, shutdown_timeout=2
        )
        loop.run(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run(site.start())
        d = Doors(runner.addresses[0][1], lane)
        try:
            yield d
        finally:
            d.conn.close()
            loop.run(runner.cleanup())
            logging.getLogger().removeHandler(tracebacks)
            speclane.setLevel(level)
    found = [logging.Formatter().format(r) for r in tracebacks.records]
    assert not found, "\n\n".join(found[:3])


# --- what each API's answers look like ---------------------------------------------------------


def not_a_router_fault(status: int, headers: dict[str, str], data: bytes) -> None:
    if status >= 500:
        assert headers.get("x-speclane-error-source") == "upstream", (status, data[:300])


def anthropic_answer(
    status: int, headers: dict[str, str], data: bytes, counting: bool = False
) -> None:
    not_a_router_fault(status, headers, data)
    if status == 200 and headers.get("content-type", "").startswith("text/event-stream"):
        events = typed_events(data)
        # (an upstream that fails before its first event: the error event alone)
        assert events and events[0][0] in ("message_start", "error"), data[:300]
        assert events[-1][0] in ("message_stop", "error"), data[-300:]
        return
    body = orjson.loads(data)
    if status == 200:
        if counting:
            assert isinstance(body["input_tokens"], int)
        else:
            assert body["type"] == "message" and isinstance(body["content"], list), body
        return
    assert body["type"] == "error" and isinstance(body["error"]["message"], str), body
    assert isinstance(body["error"]["type"], str)


def typed_events(data: bytes) -> list[tuple[str, Any]]:
    """SSE events that name their type twice (Anthropic, OpenAI Responses): ``event: X``
    and ``data: {"type": "X", ...}``."""
    events = []
    for block in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(b": ", 1) for line in block.split(b"\n"))
        name = lines[b"event"].decode()
        payload = orjson.loads(lines[b"data"])
        assert payload["type"] == name, block
        events.append((name, payload))
    return events


def ollama_answer(status: int, headers: dict[str, str], data: bytes) -> None:
    not_a_router_fault(status, headers, data)
    if status == 200 and headers.get("content-type", "").startswith("application/x-ndjson"):
        lines = [orjson.loads(line) for line in data.split(b"\n") if line.strip()]
        assert lines and all(isinstance(x, dict) for x in lines), data[:300]
        assert lines[-1].get("done") is True or "error" in lines[-1], data[-300:]
        return
    body = orjson.loads(data)
    assert isinstance(body, dict), body
    if status == 200:
        assert body.get("done") is True, body
    else:
        assert isinstance(body["error"], str), body


def responses_answer(status: int, headers: dict[str, str], data: bytes) -> None:
    not_a_router_fault(status, headers, data)
    if status == 200 and headers.get("content-type", "").startswith("text/event-stream"):
        events = typed_events(data)
        assert events and events[0][0] == "response.created", data[:300]
        assert events[-1][0] in ("response.completed", "response.incomplete", "response.failed"), (
            data[-300:]
        )
        return
    body = orjson.loads(data)
    if status == 200:
        assert body["object"] == "response" and isinstance(body["output"], list), body
    else:
        assert isinstance(body["error"]["message"], str), body


def openai_answer(status: int, headers: dict[str, str], data: bytes) -> None:
    not_a_router_fault(status, headers, data)
    if status == 200 and headers.get("content-type", "").startswith("text/event-stream"):
        # The OpenAI door relays an upstream's events as they come (junk included, and a
        # little of what follows an upstream's own [DONE]); what it owes the client is an
        # end: [DONE], after an error event if the stream failed. Clients stop at the first.
        # (An upstream's last "data: [DONE]" without its blank line is passed on as it came:
        # the official clients take it at the end of the body.)
        payloads = sse_payloads(data + b"\n\n")
        assert b"[DONE]" in payloads, data[-300:]
        return
    body = orjson.loads(data)
    if status == 200:
        assert body["choices"], body
    else:
        assert isinstance(body["error"]["message"], str), body


# --- generated cases ---------------------------------------------------------------------------
# Hypothesis draws a seed per example (it costs ~1 ms an example here, too slow for 10,000
# HTTP cases a surface); each seed makes BATCH cases with the generators below, and a failing
# case is printed whole. The generators mostly keep the shape each door expects and put
# anything (any JSON, odd strings) in any field, so validation is exercised deep down.

BATCH = 50
KEYS = [
    "model",
    "max_tokens",
    "messages",
    "role",
    "content",
    "type",
    "text",
    "tool_use_id",
    "id",
    "name",
    "input",
    "tools",
    "tool_choice",
    "system",
    "stop_sequences",
    "options",
    "format",
    "tool_calls",
    "function",
    "arguments",
    "images",
    "stream",
    "source",
    "prompt",
    "raw",
    "suffix",
    "num_predict",
    "input_schema",
    "parameters",
    "template",
    "think",
    "keep_alive",
    "cache_control",
    "is_error",
    "temperature",
    "stop",
    "seed",
    "top_k",
    "metadata",
    "description",
    "properties",
    "index",
    "data",
    "media_type",
]
WORDS = [
    "user",
    "assistant",
    "system",
    "tool",
    "text",
    "tool_use",
    "tool_result",
    "image",
    "thinking",
    "auto",
    "any",
    "none",
    "json",
    "function",
    "object",
    "string",
    MODEL,
    "",
    "\x00",
    "\u2028",
    '{"a":',
    "base64",
    "é" * 3,
    "\ud7ff",
    "a" * 300,
    "get_weather",
    "\r\n",
    "<|im_end|>",
    "null",
]


def anything(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.15:
        return [anything(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 3 and roll < 0.3:
        return {rng.choice(KEYS): anything(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return rng.choice(
        [
            None,
            True,
            False,
            0,
            -1,
            1,
            2**31,
            2**64 - 1,
            -(2**63),
            0.5,
            1e308,
            -0.0,
            rng.choice(WORDS),
            rng.choice(WORDS),
            rng.randint(-5, 100),
        ]
    )


def maybe(rng: random.Random, good: Any) -> Any:
    """``good`` (a value, or a function making one) three times in four, else anything."""
    if rng.random() < 0.75:
        return good() if callable(good) else good
    return anything(rng)


def some(rng: random.Random, make: Any, most: int = 3) -> list[Any]:
    return [make() for _ in range(rng.randint(0, most))]


def optional(rng: random.Random, body: dict[str, Any], fields: dict[str, Any]) -> None:
    for key, value in fields.items():
        if rng.random() < 0.3:
            body[key] = maybe(rng, value)


def text(rng: random.Random) -> str:
    return rng.choice(WORDS) + rng.choice(["", " hi", " weather in Paris?"])


def anthropic_block(rng: random.Random) -> Any:
    kind = rng.choice(["text", "tool_use", "tool_result", "image", "thinking"])
    if kind == "text":
        return {"type": "text", "text": maybe(rng, lambda: text(rng))}
    if kind == "tool_use":
        return {
            "type": "tool_use",
            "id": maybe(rng, "tu_1"),
            "name": maybe(rng, "get_weather"),
            "input": maybe(rng, lambda: {"city": maybe(rng, "Paris")}),
        }
    if kind == "tool_result":
        block = {
            "type": "tool_result",
            "tool_use_id": maybe(rng, "tu_1"),
            "content": maybe(
                rng, lambda: rng.choice([text(rng), some(rng, lambda: anthropic_block(rng), 2)])
            ),
        }
        optional(rng, block, {"is_error": True})
        return block
    if kind == "image":
        return {
            "type": "image",
            "source": maybe(rng, {"type": "base64", "media_type": "image/png", "data": "AAAA"}),
        }
    return {"type": "thinking", "thinking": maybe(rng, "hmm"), "signature": anything(rng)}


def anthropic_request(rng: random.Random, counting: bool = False) -> dict[str, Any]:
    def message() -> dict[str, Any]:
        return {
            "role": maybe(rng, lambda: rng.choice(["user", "assistant"])),
            "content": maybe(
                rng,
                lambda: rng.choice(
                    [text(rng), some(rng, lambda: maybe(rng, lambda: anthropic_block(rng)))]
                ),
            ),
        }

    body: dict[str, Any] = {
        "model": maybe(rng, MODEL),
        "messages": maybe(rng, lambda: [maybe(rng, message) for _ in range(rng.randint(1, 3))]),
    }
    if not counting or rng.random() < 0.2:
        body["max_tokens"] = maybe(rng, lambda: rng.randint(1, 64))
    tool = {
        "name": "get_weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    optional(
        rng,
        body,
        {
            "system": lambda: rng.choice([text(rng), [{"type": "text", "text": text(rng)}]]),
            "stream": lambda: rng.random() < 0.5,
            "tools": lambda: [
                maybe(
                    rng,
                    {
                        **tool,
                        "name": maybe(rng, "get_weather"),
                        "input_schema": maybe(rng, tool["input_schema"]),
                    },
                )
                for _ in range(rng.randint(0, 2))
            ],
            "tool_choice": lambda: rng.choice(
                [
                    {"type": "auto"},
                    {"type": "any"},
                    {"type": "none"},
                    {"type": "tool", "name": maybe(rng, "get_weather")},
                ]
            ),
            "stop_sequences": lambda: some(rng, lambda: text(rng)),
            "temperature": lambda: rng.random(),
            "metadata": {"user_id": "u"},
            "thinking": {"type": "enabled", "budget_tokens": 10},
        },
    )
    return body


def ollama_common(rng: random.Random, body: dict[str, Any]) -> None:
    options = {
        "num_predict": lambda: rng.randint(-2, 64),
        "temperature": lambda: rng.random(),
        "top_k": lambda: rng.randint(0, 50),
        "seed": lambda: rng.randint(0, 9),
        "stop": lambda: some(rng, lambda: text(rng)),
        "num_ctx": 4096,
        "min_p": 0.1,
        "repeat_penalty": 1.1,
        "top_p": 0.9,
    }
    optional(
        rng,
        body,
        {
            "stream": lambda: rng.random() < 0.5,
            "keep_alive": "5m",
            "think": False,
            "options": lambda: {k: maybe(rng, v) for k, v in options.items() if rng.random() < 0.4},
            "format": lambda: rng.choice(
                ["json", {"type": "object", "properties": {"a": {"type": "string"}}}, "yaml"]
            ),
        },
    )


def ollama_chat(rng: random.Random) -> dict[str, Any]:
    def message() -> dict[str, Any]:
        m: dict[str, Any] = {
            "role": maybe(rng, lambda: rng.choice(["user", "assistant", "system", "tool"])),
            "content": maybe(rng, lambda: text(rng)),
        }
        optional(
            rng,
            m,
            {
                "tool_calls": lambda: [
                    maybe(
                        rng,
                        lambda: {
                            "function": maybe(
                                rng,
                                lambda: {
                                    "name": maybe(rng, "get_weather"),
                                    "arguments": maybe(rng, lambda: {"city": anything(rng)}),
                                },
                            )
                        },
                    )
                    for _ in range(rng.randint(0, 2))
                ],
                "images": ["AAAA"],
                "tool_name": "get_weather",
            },
        )
        return m

    body: dict[str, Any] = {
        "model": maybe(rng, MODEL),
        "messages": maybe(rng, lambda: [maybe(rng, message) for _ in range(rng.randint(1, 3))]),
    }
    ollama_common(rng, body)
    optional(
        rng,
        body,
        {
            "tools": lambda: [
                maybe(
                    rng,
                    lambda: {
                        "type": "function",
                        "function": maybe(
                            rng,
                            lambda: {
                                "name": maybe(rng, "get_weather"),
                                "parameters": maybe(rng, {"type": "object"}),
                            },
                        ),
                    },
                )
                for _ in range(rng.randint(0, 2))
            ]
        },
    )
    return body


def ollama_generate(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {"model": maybe(rng, MODEL), "prompt": maybe(rng, lambda: text(rng))}
    if rng.random() < 0.05:
        del body["prompt"]  # a load request
    ollama_common(rng, body)
    optional(
        rng,
        body,
        {
            "system": lambda: text(rng),
            "raw": lambda: rng.random() < 0.5,
            "suffix": lambda: text(rng),
            "template": "{{ .Prompt }}",
            "images": ["AAAA"],
            "context": [1, 2, 3],
        },
    )
    return body


def encoded(rng: random.Random, body: Any) -> bytes:
    """The body as JSON, now and then not an object, cut, or not JSON at all."""
    roll = rng.random()
    if roll < 0.85:
        return orjson.dumps(body)
    if roll < 0.9:
        return orjson.dumps(anything(rng))
    if roll < 0.95:
        raw = orjson.dumps(body)
        return raw[: rng.randint(0, len(raw))]
    return rng.randbytes(rng.randint(0, 40))


def cases(seed: int) -> Iterator[random.Random]:
    for i in range(BATCH):
        yield random.Random(seed * BATCH + i)


SEEDS = settings(FUZZ, max_examples=max(1, FUZZ_CASES // BATCH))


def fuzz(doors: Doors, surface: str, one_case: Callable[[random.Random], None]) -> None:
    """``FUZZ_CASES`` cases of ``one_case``, ``BATCH`` per Hypothesis seed, all counted."""

    @SEEDS
    @given(seed=st.integers(0, 2**32))
    def run(seed: int) -> None:
        for rng in cases(seed):
            one_case(rng)
            doors.cases[surface] += 1

    doors.lane.script = None
    try:
        run()
    finally:
        doors.lane.script = None
        doors.lane.tokenize = http_answer(b'{"count": 5}')
    assert doors.cases[surface] >= FUZZ_CASES


def test_fuzz_the_anthropic_door(doors: Doors) -> None:
    def one(rng: random.Random) -> None:
        raw = encoded(rng, anthropic_request(rng))
        with case(raw):
            anthropic_answer(*doors.post("/v1/messages", raw))

    fuzz(doors, "anthropic", one)


def test_fuzz_count_tokens(doors: Doors) -> None:
    def one(rng: random.Random) -> None:
        raw = encoded(rng, anthropic_request(rng, counting=True))
        # The lane's count is fuzzed too, now and then: it is an upstream answer like any.
        doors.lane.tokenize = (
            http_answer(b'{"count": 5}')
            if rng.random() < 0.8
            else rng.choice(
                [
                    http_answer(b'{"count": "x"}'),
                    http_answer(b"{}"),
                    http_answer(b"[1]"),
                    http_answer(b'{"count": 5'),
                    http_answer(b"", status=500),
                    http_answer(b'{"error": "no"}', status=400),
                    b"HTTP/1.1 200 OK\r\n",
                    b"garbage",
                    http_answer(b'{"count": 5}', close=True)[:-3],
                ]
            )
        )
        with case(raw, doors.lane.tokenize):
            anthropic_answer(*doors.post("/v1/messages/count_tokens", raw), counting=True)

    fuzz(doors, "count_tokens", one)


def test_fuzz_the_ollama_door(doors: Doors) -> None:
    def one(rng: random.Random) -> None:
        chat = rng.random() < 0.5
        raw = encoded(rng, ollama_chat(rng) if chat else ollama_generate(rng))
        with case(raw):
            ollama_answer(*doors.post("/api/chat" if chat else "/api/generate", raw))

    fuzz(doors, "ollama", one)


@contextlib.contextmanager
def case(*parts: bytes) -> Iterator[None]:
    """A failing case is printed whole (Hypothesis only knows its seed)."""
    try:
        yield
    except Exception as e:
        raise AssertionError(f"case {parts!r}: {e!r}") from e


# --- streamed tool calls from a misbehaving upstream ---------------------------------------------

ARG_PIECES = [
    '{"city"',
    ': "Par',
    'is"',
    ', "days": 2',
    "}",
    "{",
    "",
    '"',
    "\\u00",
    "\x00",
    "]",
    "null",
    "é",
    "\\ud800",
]


def call_delta(rng: random.Random) -> Any:
    delta: dict[str, Any] = {"index": maybe(rng, lambda: rng.randint(0, 2))}
    optional(
        rng,
        delta,
        {
            "id": "call_1",
            "type": "function",
            "function": lambda: {
                k: maybe(rng, v)
                for k, v in (
                    ("name", lambda: rng.choice(["get_weather", ""])),
                    ("arguments", lambda: rng.choice(ARG_PIECES)),
                )
                if rng.random() < 0.7
            },
        },
    )
    return maybe(rng, delta)


def tool_stream(rng: random.Random) -> bytes:
    """An upstream's streamed answer with tool calls: well-formed pieces, odd ones, and
    anything, then maybe cut anywhere (the connection closes there)."""
    events = [chunk({"role": "assistant", "content": ""})]
    for _ in range(rng.randint(0, 3)):
        calls = some(rng, lambda: call_delta(rng), 2)
        calls += [
            {"index": 0, "function": {"arguments": rng.choice(ARG_PIECES)}}
            for _ in range(rng.randint(0, 5))
        ]
        events.append(chunk({"tool_calls": maybe(rng, calls)}))
    events.append(chunk({}, rng.choice(["tool_calls", "stop", "length", None, "weird"])))
    if rng.random() < 0.5:
        events.append(chunk(None, usage=maybe(rng, {"prompt_tokens": 3, "completion_tokens": 9})))
    if rng.random() < 0.2:
        events.insert(
            rng.randint(1, len(events)),
            rng.choice(
                [
                    b"data: {not json\n\n",
                    b": ping\n\n",
                    b"event: error\ndata: {}\n\n",
                    b"data:\n\n",
                    b"data: []\n\n",
                    b"data: null\n\n",
                    b"data: [DONE]\n\n",
                    b'data: {"choices":[{"index":0,"delta":{"content":"\\ud800"}}]}\n\n',
                    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
                    b'{"arguments":"\\udfff"}}]}}]}\n\n',
                ]
            ),
        )
    events.append(b"data: [DONE]\n\n")
    stream = b"".join(events)
    if rng.random() < 0.3:
        stream = stream[: rng.randint(0, len(stream))]
    framing = rng.choice(["close", "chunked", "length", "length-lie"])
    if framing == "length-lie":  # says more than it sends: the upstream dies mid-body
        return http_answer(stream, ctype="text/event-stream", close=True)[:-1]
    return http_answer(stream, ctype="text/event-stream", framing=framing)


def tool_body(rng: random.Random) -> bytes:
    """A non-streamed answer with tool calls, odd or cut, or an error status."""
    calls = maybe(
        rng,
        lambda: [
            maybe(
                rng,
                lambda: {
                    "id": maybe(rng, "call_1"),
                    "type": maybe(rng, "function"),
                    "function": maybe(
                        rng,
                        lambda: {
                            "name": maybe(rng, "get_weather"),
                            "arguments": maybe(
                                rng,
                                lambda: rng.choice(
                                    ['{"city": "Paris"}', '{"city": ', "", "[]", "null"]
                                ),
                            ),
                        },
                    ),
                },
            )
            for _ in range(rng.randint(0, 2))
        ],
    )
    body = orjson.dumps(
        {
            "id": "c1",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": maybe(rng, "tool_calls"),
                    "message": {
                        "role": "assistant",
                        "content": maybe(rng, None),
                        "tool_calls": calls,
                    },
                }
            ],
        }
    )
    if rng.random() < 0.25:
        body = body[: rng.randint(0, len(body))]
    status = rng.choice([200] * 6 + [400, 429, 500, 503])
    return http_answer(body, status=status)


TOOLS_OPENAI = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
TOOLS_ANTHROPIC = [
    {
        "name": "get_weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
ASK = [{"role": "user", "content": "weather in Paris?"}]
DOORS = {
    "openai": (
        "/v1/chat/completions",
        {"model": MODEL, "messages": ASK, "tools": TOOLS_OPENAI},
        openai_answer,
    ),
    "anthropic": (
        "/v1/messages",
        {"model": MODEL, "max_tokens": 32, "messages": ASK, "tools": TOOLS_ANTHROPIC},
        anthropic_answer,
    ),
    "ollama": (
        "/api/chat",
        {"model": MODEL, "messages": ASK, "tools": TOOLS_OPENAI},
        ollama_answer,
    ),
    "responses": (
        "/v1/responses",
        {
            "model": MODEL,
            "input": "weather in Paris?",
            "tools": [{"type": "function", **TOOLS_OPENAI[0]["function"]}],
        },
        responses_answer,
    ),
}


def test_fuzz_streamed_tool_calls_through_every_door(doors: Doors) -> None:
    def one(rng: random.Random) -> None:
        door = rng.choice(sorted(DOORS))
        path, request, check = DOORS[door]
        stream = rng.random() < 0.7
        doors.lane.script = tool_stream(rng) if stream else tool_body(rng)
        with case(door.encode(), doors.lane.script):
            check(*doors.post(path, orjson.dumps({**request, "stream": stream})))

    fuzz(doors, "tool_calls", one)


# --- what the fuzz found ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "count",
    [
        b'{"count": "x"}',
        b'{"count": -1}',
        b'{"count": true}',
        b'{"count": null}',
        b'{"count": 1.5}',
        b"[5]",
    ],
)
def test_a_lane_count_that_is_not_a_count_is_an_upstream_error(doors: Doors, count: bytes) -> None:
    """It was passed on: ``{"input_tokens": "x"}`` with a 200."""
    doors.lane.tokenize = http_answer(count)
    try:
        status, headers, data = doors.post(
            "/v1/messages/count_tokens",
            orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
        )
    finally:
        doors.lane.tokenize = http_answer(b'{"count": 5}')
    assert status == 500 and headers["x-speclane-error-source"] == "upstream", data  # 502 as
    assert "upstream_bad_json" in orjson.loads(data)["error"]["message"]  # Anthropic says it
