"""Fuzzed upstream answers: status lines, headers, framing, encodings, and how they arrive.

A seeded generator (fast enough for thousands of cases a minute on a shared machine)
builds each answer from parts, valid and broken: versions and statuses (out of range,
non-ASCII digits, garbage), header lines (no colon, spaces, NUL, huge, duplicated),
Content-Length right, short, long or malformed, chunked framing right or broken (sizes,
extensions, missing CRLF, trailers), both lengths at once, unknown transfer codings,
gzip/deflate bodies (valid, truncated, bombs, mislabelled), JSON objects, arrays and
garbage, SSE streams whole, cut or without [DONE]; delivered at once or in pieces, then
the connection closed or kept. A real router (in this process) relays each one.

Judged on every case: the router never answers a 5xx of its own making (every 5xx says
``X-Speclane-Error-Source: upstream``), every 4xx/5xx is in the OpenAI error shape, no
traceback is logged, and the process's RSS grows by less than 20 MB.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import gzip
import logging
import os
import random
import zlib
from collections import Counter

import aiohttp
import orjson
import psutil

from tests.conftest import router_settings, run_router
from tests.fuzzing import examples
from tests.reliability.harness import TALLY, assert_openai_error, chat_body
from tests.reliability.hostile_upstream import HostileUpstream

SEED = int(os.environ.get("SPECLANE_FUZZ_SEED", "15"))
CASES = int(os.environ.get("SPECLANE_UPSTREAM_FUZZ_CASES", examples(5000)))
CLIENTS = 8
WARMUP = 300


# --- the parts of an answer ---------------------------------------------------------------


def _json_body(rng: random.Random) -> bytes:
    return rng.choice(
        [
            orjson.dumps(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "hi"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                }
            ),
            b"[1, 2, 3]",
            b"{}",
            b"",
            b"null",
            b'"text"',
            b'{"id": ',
            b"\xff\xfe garbage",
            b'{"error": {"message": "bad things", "type": "x"}}',
            b"{" * 200,
            orjson.dumps({"choices": "not a list", "usage": [1]}),
        ]
    )


def _event(text: str) -> bytes:
    return (
        b"data: "
        + orjson.dumps(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
            }
        )
        + b"\n\n"
    )


def _sse_body(rng: random.Random) -> bytes:
    events = [_event(f"t{i}") for i in range(rng.randint(0, 6))]
    tail = rng.choice(
        [
            b"data: [DONE]\n\n",
            b"",
            b"data: [DONE]",
            b"data: {oops}\n\n",
            b": ping\n\n",
            b"data: [DONE]\n\ndata: [DONE]\n\n",
        ]
    )
    body = b"".join(events) + tail
    if rng.random() < 0.2:
        body = body.replace(b"\n", b"\r\n")
    if rng.random() < 0.1:
        body = rng.choice([b"not sse at all", b'{"id": 1}', b"\x00\x01\x02", b"event: x\n"])
    return body


def _encode(rng: random.Random, body: bytes, bomb: bytes) -> tuple[bytes, bytes | None]:
    """(the body on the wire, its Content-Encoding value or None)."""
    kind = rng.choice(["identity"] * 6 + ["gzip", "deflate", "bomb", "truncated", "lie", "br"])
    if kind == "identity":
        return body, None
    if kind == "gzip":
        return gzip.compress(body), b"gzip"
    if kind == "deflate":
        return zlib.compress(body), b"deflate"
    if kind == "bomb":
        return bomb, b"gzip"
    if kind == "truncated":
        data = gzip.compress(body)
        return data[: max(1, len(data) // 2)], b"gzip"
    if kind == "lie":
        return body, b"gzip"  # says gzip, is not
    return body, b"br"


def _chunked(rng: random.Random, body: bytes) -> bytes:
    out = []
    pos = 0
    while pos < len(body):
        n = rng.randint(1, 64)
        piece = body[pos : pos + n]
        pos += n
        size = b"%x" % len(piece)
        fault = rng.random()
        if fault < 0.02:
            size = rng.choice([b"0x" + size, b"-" + size, b"zz", b"", b" " + size, b"\xc2\xb2"])
        elif fault < 0.04:
            size += b";ext=" + b"a" * rng.choice([1, 100])
        out.append(size + b"\r\n" + piece + (b"\r\n" if rng.random() > 0.01 else b"XX"))
    ending = rng.choice(
        [b"0\r\n\r\n"] * 8
        + [
            b"0\r\nX-Trailer: t\r\n\r\n",
            b"",
            b"0\r\n",
            b"0\r\nbad trailer\r\n\r\n",
            b"0\r\n" + b"X-T: v\r\n" * 3000 + b"\r\n",
        ]
    )
    return b"".join(out) + ending


def _status_line(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.75:
        return b"HTTP/1.1 200 OK"
    version = rng.choice([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.2", b"HTP/1.1", b""])
    status = rng.choice(
        [
            b"200",
            b"201",
            b"204",
            b"299",
            b"301",
            b"400",
            b"404",
            b"429",
            b"500",
            b"503",
            b"099",
            b"000",
            b"9999",
            b"600",
            b"2\xc2\xb20",
            b"20",
            b"abc",
            b"-200",
            b"100",
            b"101",
            b"103",
        ]
    )
    reason = rng.choice([b" OK", b"", b" ", b" \xff\xfe", b" Some Reason"])
    return version + b" " + status + reason


def _extra_headers(rng: random.Random) -> list[bytes]:
    headers = []
    for _ in range(rng.choice([0, 0, 0, 1, 2])):
        headers.append(
            rng.choice(
                [
                    b"X-Junk: value",
                    b"no colon here",
                    b" Leading: space",
                    b"Trailing : space",
                    b"X-Nul: a\x00b",
                    b"X-Long: " + b"a" * 70_000,
                    b"X-Utf8: \xc3\xa9\xff",
                    b"Connection: close",
                    b"Connection: keep-alive",
                    b"Content-Length: 3",
                    b"Transfer-Encoding: chunked",
                    b"Transfer-Encoding: xchunked",
                    b"Transfer-Encoding: gzip, chunked",
                    b"Content-Type: text/html",
                ]
            )
        )
    return headers


def answer(rng: random.Random, stream: bool, bomb: bytes) -> tuple[bytes, list[bytes], bool]:
    """(head + body, how it is cut into writes, close the connection after it?)"""
    raw_body = _sse_body(rng) if stream else _json_body(rng)
    body, encoding = _encode(rng, raw_body, bomb)
    ctype = b"text/event-stream" if stream else b"application/json"
    if rng.random() < 0.05:
        ctype = rng.choice([b"text/event-stream", b"application/json", b"text/plain"])
    headers = [b"Content-Type: " + ctype]
    if encoding is not None:
        headers.append(b"Content-Encoding: " + encoding)
    framing = rng.choice(
        ["length"] * 4 + ["chunked"] * 4 + ["close", "short", "long", "bad_len", "both", "interim"]
    )
    wire = body
    if framing in ("length", "interim"):
        headers.append(b"Content-Length: %d" % len(body))
    elif framing == "chunked":
        headers.append(b"Transfer-Encoding: chunked")
        wire = _chunked(rng, body)
    elif framing == "short":
        headers.append(b"Content-Length: %d" % max(0, len(body) - rng.randint(1, 10)))
    elif framing == "long":
        headers.append(b"Content-Length: %d" % (len(body) + rng.randint(1, 10)))
    elif framing == "bad_len":
        headers.append(
            b"Content-Length: "
            + rng.choice([b"-1", b"1e3", b"\xc2\xb2", b"0x10", b"", b"1, 2", b" 5"])
        )
    elif framing == "both":
        headers += [b"Content-Length: %d" % len(body), b"Transfer-Encoding: chunked"]
        wire = _chunked(rng, body)
    headers += _extra_headers(rng)
    head = _status_line(rng) + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"
    if framing == "interim":
        head = b"HTTP/1.1 100 Continue\r\n\r\n" * rng.choice([1, 2, 20]) + head
    raw = head + wire
    if rng.random() < 0.05:
        raw += rng.choice([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", b"\r\n", b"junk"])
    if rng.random() < 0.3:  # arrives in pieces
        cuts = (
            sorted(rng.sample(range(1, max(2, len(raw))), min(len(raw) - 1, 5)))
            if len(raw) > 2
            else []
        )
        pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    else:
        pieces = [raw]
    return raw, pieces, rng.random() < 0.5


def _live_rss(me: psutil.Process) -> int:
    """RSS after a collection and after giving freed heap back to the OS (glibc): what is
    still held, not what the allocator keeps cached from a burst of big answers."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return int(me.memory_info().rss)


class _Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or "Traceback" in record.getMessage():
            self.records.append(record)


async def test_fuzzed_upstream_answers() -> None:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = z.compress(b"\0" * (64 << 20)) + z.flush()  # 64 MiB of zeros, ~65 KB
    rng = random.Random(SEED)
    plans: dict[str, tuple[list[bytes], bool]] = {}

    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        case = orjson.loads(body)["messages"][0]["content"]
        pieces, close = plans.pop(case)
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        return not close

    tracebacks = _Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    statuses: Counter[int] = Counter()
    families: Counter[str] = Counter()
    router_5xx: list[tuple[int, bytes]] = []
    me = psutil.Process()
    rss: dict[str, int] = {}
    try:
        async with HostileUpstream(script) as up:
            # No cooldown: every case must reach the upstream (a 503 would judge nothing).
            settings = router_settings(
                up,
                retry={"attempts": 1},
                cooldown={"seconds": 0},
                upstream={"head_timeout": 0.5, "max_body_bytes": 8 << 20},
            )
            backends = tuple(b.model_copy(update={"read_timeout": 0.5}) for b in settings.backends)
            settings = settings.model_copy(update={"backends": backends})
            async with (
                run_router(settings) as r,
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            ):
                url = f"http://127.0.0.1:{r.port}/v1/chat/completions"
                counter = iter(range(CASES))

                async def one_client() -> None:
                    for n in counter:
                        if n == WARMUP:
                            rss["after_warmup"] = _live_rss(me)
                        stream = rng.random() < 0.5
                        _, pieces, close = answer(rng, stream, bomb)
                        case = f"case{n}"
                        plans[case] = (pieces, close)
                        families["stream" if stream else "json"] += 1
                        try:
                            async with session.post(
                                url, json=chat_body(stream=stream, content=case)
                            ) as resp:
                                raw = await resp.read()
                                status, headers = resp.status, resp.headers
                        except aiohttp.ClientPayloadError:
                            # A stream that began and was then cut: allowed (an upstream
                            # fault after the first byte), and rare.
                            families["cut_after_first_byte"] += 1
                            continue
                        statuses[status] += 1
                        if status >= 400:
                            assert_openai_error(orjson.loads(raw))
                            source = headers.get("X-Speclane-Error-Source")
                            if status >= 500 and source != "upstream":
                                router_5xx.append((status, raw[:300]))

                await asyncio.gather(*(one_client() for _ in range(CLIENTS)))
                rss["end"] = _live_rss(me)
    finally:
        logging.getLogger().removeHandler(tracebacks)
    grown = (rss["end"] - rss["after_warmup"]) / 1e6
    total = sum(statuses.values()) + families["cut_after_first_byte"]
    print(
        f"\nupstream fuzz: {total} cases (seed {SEED}; {dict(families)}); answers "
        f"{dict(sorted(statuses.items()))}; router 5xx not caused by the upstream: "
        f"{len(router_5xx)}; tracebacks logged: {len(tracebacks.records)}; "
        f"RSS +{grown:.1f} MB after warm-up"
    )
    TALLY.fuzz["upstream_answers"] += total
    for status, count in statuses.items():
        TALLY.fuzz_status[status] += count
    TALLY.fuzz_router_5xx += len(router_5xx)
    TALLY.memory["upstream_fuzz_rss_growth_mb"] = round(grown, 1)
    assert total == CASES
    assert statuses[200] >= CASES // 20  # the valid answers among them went through
    assert not router_5xx, router_5xx[:5]
    assert not tracebacks.records, [r.getMessage() for r in tracebacks.records[:5]]
    assert grown < 20, grown
