"""Keep-alives while the real lanes prefill a long prompt, on every door (slow, serial).

A router of its own with both real lanes and a short keep-alive tick: each door's stream of
a prompt the lanes' caches have never seen begins with that door's keep-alive, then carries
its answer to the end.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME
from tests.realmodel import Router, start_router, stop_router

pytestmark = pytest.mark.realmodel

# A tick far below any real prefill of these prompts: not a measured time.
CONFIG = "[client_limits]\nstream_keepalive = 0.05\n"


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    # its own: the session's router keeps the default tick
    r = start_router(tmp_path_factory.mktemp("keepalive"), CONFIG)
    yield r
    stop_router(r)


def long_prompt(door: str) -> str:
    """About 400 tokens, new to every cache (the door's name first): a prefill far longer
    than the 0.05 s tick, and short enough for a slow tier."""
    lines = [
        f"{door} line {i}: the {i * 7 % 13}th note of {i * 3 % 11} says {i}." for i in range(32)
    ]
    return f"{door}\n" + "\n".join(lines) + "\nWhich line mentions 42?"


def post(router: Router, path: str, body: dict[str, object]) -> bytes:
    request = urllib.request.Request(
        router.base_url.removesuffix("/v1") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "x-api-key": "local"},
    )
    with urllib.request.urlopen(request, timeout=300) as resp:
        assert resp.status == 200
        return resp.read()


@pytest.mark.parametrize(
    "path, start, end",
    [
        ("/v1/chat/completions", b": waiting ", b"data: [DONE]\n\n"),
        ("/v1/responses", b": waiting ", b"event: response.incomplete"),  # 2 tokens: cut
        ("/v1/messages", b"event: ping\n", b"event: message_stop"),
        ("/api/chat", b"{", b'"done":true'),
    ],
)
def test_a_long_prefill_streams_keep_alives_first(
    router: Router, path: str, start: bytes, end: bytes
) -> None:
    text = long_prompt(path)
    messages = [{"role": "user", "content": text}]
    body: dict[str, object] = {"model": DEFAULT_MODEL_NAME, "stream": True}
    if path == "/v1/responses":
        body |= {"input": text, "max_output_tokens": 2}
    elif path == "/api/chat":
        body |= {"messages": messages, "options": {"num_predict": 2}}
    else:
        body |= {"messages": messages, "max_tokens": 2}
    raw = post(router, path, body)
    assert raw.startswith(start), raw[:200]
    assert end in raw, raw[-600:]
    if path == "/api/chat":
        first = json.loads(raw.splitlines()[0])
        assert first["done"] is False and first["message"]["content"] == ""
