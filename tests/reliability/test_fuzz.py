"""Property-based fuzzing of request bodies and headers against a running router.

The target is ``speclane serve`` as a subprocess (so a crash or a leak shows in its own
process), with one fake backend and a *canary*: a server the router is not configured to
use, whose address the fuzzer puts in override headers and model names. The properties:

- nothing from the router's own code is a 5xx (only an upstream's own errors may be, and
  they say ``X-Speclane-Error-Source: upstream``);
- every error the router answers is a 4xx in the OpenAI error shape; the one exception is
  a request that is not valid HTTP at all (a bare CR in a header, a header over 8 KiB),
  which aiohttp's HTTP parser refuses with a plain 400 before speclane sees it;
- a body over ``max_body_bytes`` is a 413;
- no override header or model name makes the router call anything but its configured
  backend (the canary sees nothing), and no client header reaches the upstream;
- the router is alive at the end and its memory did not grow without bound.

Examples are derandomised (the same cases every run) and bounded: the case counts are
reported in the "speclane reliability" summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from collections.abc import Iterator

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes.upstream import Behaviour, FakeUpstream
from tests.fuzzing import examples
from tests.reliability.harness import (
    TALLY,
    LoopThread,
    RawResponse,
    RouterProcess,
    assert_openai_error,
    config_text,
    http_request,
    parse_response,
    raw_http,
    sse_payloads,
)

MAX_BODY = 64 * 1024
ALICE_KEY = "sk-alice-fuzz-000001"
ADMIN_KEY = "admin-fuzz-key-000001"
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
BASE = settings(
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


def cases(count: int) -> settings:
    return settings(BASE, max_examples=examples(count))


class Target:
    # A plain class: hypothesis pretty-prints dataclasses field by field in failure reports.
    def __init__(
        self, router: RouterProcess, fake: FakeUpstream, canary: FakeUpstream, loop: LoopThread
    ) -> None:
        self.router, self.fake, self.canary, self.loop = router, fake, canary, loop

    @property
    def port(self) -> int:
        return self.router.port

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing case
        return f"Target(router on port {self.port}, pid {self.router.proc.pid})"

    def rss(self) -> int:
        return self.router.ps.memory_info().rss


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp("fuzz")
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "alice.toml").write_text(
        f'require_api_key = true\n[match]\napi_keys = ["{ALICE_KEY}"]\nclient_header = ["alice"]\n'
    )
    with LoopThread() as loop:
        fake = FakeUpstream(name="fake", behaviour=Behaviour(chunks=2))
        canary = FakeUpstream(name="canary")
        loop.run(fake.start())
        loop.run(canary.start())
        config = tmp / "speclane.toml"
        config.write_text(
            config_text(
                policies_dir=str(policies),
                max_body_bytes=MAX_BODY,
                admin_key=ADMIN_KEY,
                log_level="error",
                health_interval=600,
                client_limits={"body_timeout": 2},
                retry={"attempts": 2, "backoff_initial": 0.001, "backoff_max": 0.01},
                backends=[{"name": "fake", "base_url": fake.base_url, "read_timeout": 10}],
            )
        )
        router = loop.run(RouterProcess.start(config, "--no-lanes"))
        t = Target(router, fake, canary, loop)
        try:
            for _ in range(20):  # warm up, then take the memory baseline
                assert (
                    raw_http(t.port, http_request("POST", ENDPOINTS[0], orjson.dumps(CHAT))).status
                    == 200
                )
            baseline = t.rss()
            yield t
            end_rss = t.rss()
            assert t.router.proc.returncode is None, "the router died during fuzzing"
            growth = (end_rss - baseline) / 2**20
            TALLY.memory.update(
                router_rss_start_mb=round(baseline / 2**20, 1),
                router_rss_end_mb=round(end_rss / 2**20, 1),
                growth_mb=round(growth, 1),
            )
            assert growth < 20, f"router RSS grew by {growth:.1f} MiB during fuzzing"
        finally:
            loop.run(router.stop())
            err = "".join(router.stderr)
            TALLY.memory.update(tracebacks=err.count("Traceback"))
            assert "Traceback" not in err, err[-4000:]
            loop.run(fake.stop())
            loop.run(canary.stop())


CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


def send(t: Target, family: str, request: bytes, *, http_layer_ok: bool = False) -> RawResponse:
    """Send one case and check the properties every answer must have."""
    return judge(family, request, raw_http(t.port, request), http_layer_ok=http_layer_ok)


def judge(
    family: str, request: bytes, resp: RawResponse, *, http_layer_ok: bool = False
) -> RawResponse:
    TALLY.fuzz[family] += 1
    TALLY.fuzz_sides["client"] += 1
    TALLY.fuzz_status[resp.status] += 1
    source = resp.header("X-Speclane-Error-Source")
    if resp.status >= 500 and source != "upstream":
        TALLY.fuzz_router_5xx += 1
        raise AssertionError(
            f"router 5xx: {resp.status} {resp.body[:500]!r}\nfor request {request[:600]!r}"
        )
    if request.startswith(b"HEAD "):
        pass  # no body to judge
    elif resp.status >= 400:
        if source is None:
            # Refused by aiohttp before speclane's code: an ``Expect`` it does not know on a
            # path that does not exist (plain-text 417); all else is in the OpenAI shape.
            assert http_layer_ok and resp.status in (400, 417), (
                resp.status,
                resp.body[:300],
                request[:300],
            )
        else:
            assert_openai_error(orjson.loads(resp.body))
    elif resp.status == 200:
        ctype = resp.header("Content-Type") or ""
        if ctype.startswith("text/event-stream"):
            assert sse_payloads(resp.body)[-1] == b"[DONE]"
        elif ctype.startswith("application/json"):
            orjson.loads(resp.body)
    assert not any(k.lower().startswith("x-injected") for k, _ in resp.headers), resp.headers
    return resp


# --- strategies --------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
models = st.one_of(
    st.just("fake-model"),
    st.sampled_from(
        ["fake-model@interactive", "fake-model@nope", "", " ", "a" * 600, "fake-model\x00"]
    ),
    json_values,
)
messages = st.one_of(
    st.lists(
        st.fixed_dictionaries(
            {"role": st.one_of(st.sampled_from(["user", "system", "assistant"]), json_values)},
            optional={"content": st.one_of(st.text(max_size=200), json_values)},
        ),
        max_size=4,
    ),
    json_values,
)
absurd_numbers = st.one_of(
    st.integers(),
    st.integers(min_value=2**63 - 5, max_value=2**64 + 5),
    st.sampled_from([0, -1, 2**31, 2**63 - 1, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(max_size=5),
    st.none(),
)
request_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": models,
        "messages": messages,
        "prompt": st.one_of(st.text(max_size=100), json_values),
        "input": json_values,
        "stream": st.one_of(st.booleans(), json_values),
        "stream_options": json_values,
        "max_tokens": absurd_numbers,
        "max_completion_tokens": absurd_numbers,
        "n": absurd_numbers,
        "temperature": absurd_numbers,
        "top_p": absurd_numbers,
        "seed": absurd_numbers,
        "num_draft_tokens": absurd_numbers,
        "user": json_values,
    },
)


valid_options = {
    "stream": st.booleans(),
    "max_tokens": st.integers(1, 1000),
    "temperature": st.floats(0, 2),
    "n": st.integers(1, 3),
    "user": st.text(max_size=20),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "seed": absurd_numbers,
    "metadata": json_values,
    "logit_bias": json_values,
}
valid_by_endpoint = {
    ENDPOINTS[0]: st.fixed_dictionaries(
        {
            "model": st.just("fake-model"),
            "messages": st.lists(
                st.fixed_dictionaries(
                    {
                        "role": st.sampled_from(["user", "system", "assistant"]),
                        "content": st.one_of(
                            st.text(max_size=200),
                            st.lists(
                                st.fixed_dictionaries(
                                    {"type": st.just("text"), "text": st.text(max_size=50)}
                                ),
                                max_size=3,
                            ),
                        ),
                    }
                ),
                min_size=1,
                max_size=3,
            ),
        },
        optional=valid_options,
    ),
    ENDPOINTS[1]: st.fixed_dictionaries(
        {
            "model": st.just("fake-model"),
            "prompt": st.one_of(st.text(max_size=200), st.lists(st.text(max_size=20), max_size=3)),
        },
        optional=valid_options,
    ),
    ENDPOINTS[2]: st.fixed_dictionaries(
        {
            "model": st.just("fake-model"),
            "input": st.one_of(
                st.text(max_size=200), st.lists(st.text(max_size=20), min_size=1, max_size=3)
            ),
        }
    ),
}


@cases(300)
@given(data=st.data(), endpoint=st.sampled_from(ENDPOINTS))
def test_fuzz_json_bodies(target: Target, data: st.DataObject, endpoint: str) -> None:
    """Half well-formed requests with odd extras (these reach the backend), half anything."""
    body = data.draw(st.one_of(valid_by_endpoint[endpoint], request_bodies))
    # The standard library writes integers beyond 64 bits (orjson refuses to).
    raw = json.dumps(body, ensure_ascii=data.draw(st.booleans())).encode()
    send(target, "json_bodies", http_request("POST", endpoint, raw))


@cases(150)
@given(
    number=st.sampled_from(
        [
            "1e999",
            "-1e999",
            "1" * 400,
            "-" + "9" * 400,
            "1e-999",
            "0.0000000000000000000001",
            "9223372036854775808",
            "18446744073709551616",
            "NaN",
            "Infinity",
            "-0",
            "1.5",
            "0x10",
            "true",
            "null",
            '"5"',
            "[]",
            "{}",
        ]
    ),
    field=st.sampled_from(
        ["max_tokens", "max_completion_tokens", "n", "temperature", "top_p", "num_draft_tokens"]
    ),
    stream=st.booleans(),
)
def test_fuzz_absurd_numbers(target: Target, number: str, field: str, stream: bool) -> None:
    body = (
        b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], '
        b'"stream": '
        + (b"true" if stream else b"false")
        + b', "'
        + field.encode()
        + b'": '
        + number.encode()
        + b"}"
    )
    resp = send(target, "absurd_numbers", http_request("POST", ENDPOINTS[0], body))
    assert resp.status in (200, 400)


def nested(depth: int, kind: str) -> bytes:
    open_, close = (b"[", b"]") if kind == "list" else (b'{"a":', b"}")
    inner = open_ * depth + b"1" + close * depth
    return b'{"model": "fake-model", "messages": [{"role": "user", "content": ' + inner + b"}]}"


invalid_utf8 = st.binary(min_size=1, max_size=20).filter(lambda b: not _is_utf8(b))


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


raw_bodies = st.one_of(
    st.binary(max_size=2000),
    st.text(max_size=500).map(str.encode),
    invalid_utf8.map(
        lambda b: (
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "' + b + b'"}]}'
        )
    ),
    invalid_utf8.map(lambda b: b'{"model": "' + b + b'", "messages": []}'),
    st.tuples(st.integers(min_value=1, max_value=5000), st.sampled_from(["list", "dict"])).map(
        lambda t: nested(*t)
    ),
    st.sampled_from(
        [
            b"",
            b" ",
            b"null",
            b"[]",
            b'"x"',
            b"{",
            b"{}" * 1000,
            b"\xef\xbb\xbf{}",
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "\\ud800"}]}',
            b'{"model": "fake-model", "model": 5}',
            b"\x00" * 100,
        ]
    ),
)


@cases(200)
@given(
    body=raw_bodies,
    endpoint=st.sampled_from(ENDPOINTS),
    ctype=st.sampled_from(
        [
            b"application/json",
            b"text/plain",
            b"application/x-www-form-urlencoded",
            b"multipart/form-data; boundary=x",
            b"",
        ]
    ),
)
def test_fuzz_raw_bodies(target: Target, body: bytes, endpoint: str, ctype: bytes) -> None:
    headers = [(b"Content-Type", ctype)] if ctype else []
    send(target, "raw_bodies", http_request("POST", endpoint, body, headers))


header_names = st.sampled_from(
    [
        b"X-Speclane-Lane",
        b"X-Speclane-Preset",
        b"X-Speclane-Client",
        b"Authorization",
        b"User-Agent",
        b"Content-Type",
        b"X-Speclane-Priority",
    ]
)
injections = st.sampled_from(
    [
        b"speculative\r\nX-Injected: yes",
        b"batching\nX-Injected: yes",
        b"x\rX-Injected: yes",
        b"Bearer " + ALICE_KEY.encode() + b"\r\nX-Injected: 1",
        b"\x00",
        b"\xff\xfe\xfd",
        b"alice",
        b"ALICE",
        b"Bearer",
        b"Bearer ",
        b"Basic YWxpY2U6eA==",
        b"bearer " + b"k" * 5000,
        b"a" * 9000,
        b"../../admin",
        b"fake",
        b"FAKE",
        b"canary",
        b"auto",
        b"  auto  ",
    ]
)


def canary_urls(t: Target) -> list[bytes]:
    host = f"127.0.0.1:{t.canary.port}"
    return [
        f"http://{host}/v1".encode(),
        f"http://{host}".encode(),
        host.encode(),
        f"//{host}/v1".encode(),
        f"fake@{host}".encode(),
        f"http://fake@{host}/v1".encode(),
    ]


@cases(260)
@given(
    data=st.data(),
    name=header_names,
    extra=st.lists(st.tuples(header_names, st.binary(max_size=60)), max_size=3),
)
def test_fuzz_headers(
    target: Target, data: st.DataObject, name: bytes, extra: list[tuple[bytes, bytes]]
) -> None:
    value = data.draw(
        st.one_of(
            injections,
            st.sampled_from(canary_urls(target)),
            st.binary(max_size=80),
            st.text(max_size=80).map(str.encode),
        )
    )
    body = orjson.dumps({**CHAT, "stream": data.draw(st.booleans())})
    send(
        target,
        "headers",
        http_request("POST", ENDPOINTS[0], body, [(name, value), *extra]),
        http_layer_ok=True,
    )


@cases(30)
@given(
    model=st.sampled_from(
        [
            "canary",
            "http://127.0.0.1:{port}/v1",
            "127.0.0.1:{port}",
            "fake-model@http://127.0.0.1:{port}/v1",
            "fake/../canary",
        ]
    ),
    lane=st.sampled_from(["", "fake", "canary", "http://127.0.0.1:{port}/v1"]),
)
def test_fuzz_no_request_reaches_an_unconfigured_address(
    target: Target, model: str, lane: str
) -> None:
    port = target.canary.port
    headers = [(b"X-Speclane-Lane", lane.format(port=port).encode())] if lane else []
    body = orjson.dumps({**CHAT, "model": model.format(port=port)})
    resp = send(target, "canary", http_request("POST", ENDPOINTS[0], body, headers))
    assert resp.status in (400, 404)
    assert not target.canary.requests


@cases(40)
@given(
    extra=st.integers(min_value=1, max_value=4 * MAX_BODY),
    chunked=st.booleans(),
    garbage=st.booleans(),
    endpoint=st.sampled_from(ENDPOINTS),
)
def test_fuzz_oversized_bodies_are_413(
    target: Target, extra: int, chunked: bool, garbage: bool, endpoint: str
) -> None:
    size = MAX_BODY + extra
    if garbage:
        body = os.urandom(size)
    else:
        body = orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * size}]})
    if chunked:
        lines = [
            f"POST {endpoint} HTTP/1.1".encode(),
            b"Host: 127.0.0.1",
            b"Connection: close",
            b"Transfer-Encoding: chunked",
            b"Content-Type: application/json",
        ]
        request = b"\r\n".join(lines) + b"\r\n\r\n" + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        request = http_request("POST", endpoint, body)
    resp = send(target, "oversized", request)
    assert resp.status == 413
    assert assert_openai_error(orjson.loads(resp.body))["code"] == "body_too_large"


@cases(100)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
    path=st.one_of(
        st.sampled_from(
            [
                "/v1/chat/completions",
                "/v1/models",
                "/admin/lanes",
                "/admin/spec",
                "/admin/reload",
                "/metrics",
                "/healthz",
                "/readyz",
                "/v1/",
                "/v1/chat/completions/",
                "//v1/models",
                "/v1/../admin/lanes",
                "/%2e%2e/admin/lanes",
                "/v1/chat/completions?x=%ff",
            ]
        ),
        st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40).map(
            lambda p: "/" + p
        ),
    ),
)
def test_fuzz_methods_and_paths(target: Target, method: str, path: str) -> None:
    resp = send(target, "paths", http_request(method, path, b""), http_layer_ok=True)
    if path.startswith("/admin"):
        assert resp.status in (400, 401, 404, 405)  # no admin key was sent


# --- seeded mutation fuzzing: many cases, cheaply -------------------------------------------
#
# Hypothesis shrinks and explores; it also costs tens of milliseconds a case. These families
# take valid requests and break them a few ways at a time with a fixed seed (the same cases
# every run), and send them on several connections at once: thousands of cases in seconds.

MUTATION_CASES = examples(4200)
MUTATION_CONCURRENCY = 12
VALID_BODIES = [
    (ENDPOINTS[0], {**CHAT, "max_tokens": 16}),
    (ENDPOINTS[0], {**CHAT, "stream": True, "stream_options": {"include_usage": True}}),
    (
        ENDPOINTS[0],
        {
            **CHAT,
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
                    },
                }
            ],
        },
    ),
    (ENDPOINTS[1], {"model": "fake-model", "prompt": "once upon", "max_tokens": 8}),
    (ENDPOINTS[2], {"model": "fake-model", "input": ["a", "b"]}),
]
FRAGMENTS = [
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b'"',
    b"\\",
    b"\\u",
    b"\\ud800",
    b"null",
    b"true",
    b"1e999",
    b"-0",
    b"9" * 40,
    b"\x00",
    b"\xff",
    b"\xc3\x28",
    b"\xef\xbb\xbf",
    b"\r\n",
    b"\n\n",
    b" " * 100,
    b'"max_tokens": 1000000',
    b'"n": 99999',
    b'"model": 5',
    b'"stream": "yes"',
    b'"messages": []',
    b"[" * 300,
    b"]" * 300,
]
HEADER_POOL = [
    (b"X-Speclane-Lane", [b"speculative", b"batching", b"fake", b"canary", b"\xff", b"a" * 300]),
    (b"X-Speclane-Preset", [b"interactive", b"throughput", b"nope", b"\x00x", b""]),
    (b"X-Speclane-Client", [b"alice", b"ALICE", b"default", b"nobody", b"\xff\xfe", b" "]),
    (
        b"Authorization",
        [
            b"Bearer " + ALICE_KEY.encode(),
            b"Bearer \xff\xfe",
            b"Bearer",
            b"Basic eDp5",
            b"Bearer " + b"k" * 4000,
            b"bearer  sk-x ",
            b"Bearer sk-\x80",
        ],
    ),
    (b"User-Agent", [b"alice-tool/1", b"curl/8", b"\xff" * 10, b"x" * 2000]),
    (
        b"Content-Type",
        [
            b"application/json",
            b"text/plain",
            b"application/json; charset=latin-1",
            b"multipart/form-data; boundary=x",
            b"\xff",
        ],
    ),
    (
        b"Content-Encoding",
        [b"gzip", b"deflate", b"br", b"identity", b"gzip, gzip", b"zstd", b"x-unknown"],
    ),
    (b"Expect", [b"100-continue", b"nonsense"]),
    (b"Accept-Encoding", [b"gzip", b"*", b"\xff"]),
    (b"Connection", [b"keep-alive", b"upgrade", b"close, x"]),
    (b"Upgrade", [b"websocket", b"h2c"]),
]


def gzip_bomb() -> bytes:
    import gzip

    return gzip.compress(b"\x00" * (8 * MAX_BODY), compresslevel=9)


def mutate_body(rng: random.Random, raw: bytes) -> tuple[str, bytes]:
    kind = rng.choice(["flip", "cut", "insert", "duplicate", "swap", "garbage"])
    data = bytearray(raw)
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(data))
            data[i] = rng.randrange(256)
    elif kind == "cut":
        del data[rng.randrange(len(data)) :]
    elif kind == "insert":
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(data) + 1)
            data[i:i] = rng.choice(FRAGMENTS)
    elif kind == "duplicate":  # a key again, with another value: a smuggling attempt
        extra = rng.choice(
            [
                b'"max_tokens": 1000000',
                b'"max_tokens": 1',
                b'"model": "canary"',
                b'"stream": true',
                b'"n": 100',
                b'"max_completion_tokens": 999999',
                b'"messages": 5',
            ]
        )
        i = data.index(b"{") + 1
        data[i:i] = extra + b","
        data[-1:] = b"," + extra + b"}"
    elif kind == "swap":
        obj = orjson.loads(raw)
        key = rng.choice(list(obj))
        obj[key] = rng.choice(
            [None, True, 0, -1, 2**63 - 1, 1.5, "", "x" * 1000, [], {}, [dict(obj)]]
        )
        data = bytearray(orjson.dumps(obj))
    elif kind == "garbage":
        data = bytearray(rng.randbytes(rng.randint(0, 3000)))
    return kind, bytes(data)


def mutation_request(rng: random.Random) -> tuple[str, bytes]:
    """One case: (family, the exact bytes on the wire)."""
    endpoint, body = rng.choice(VALID_BODIES)
    raw = orjson.dumps(body)
    family = "mut_headers"
    headers: list[tuple[bytes, bytes]] = [(b"Content-Type", b"application/json")]
    roll = rng.random()
    if roll < 0.45:
        kind, raw = mutate_body(rng, raw)
        family = "mut_body_" + kind
    if roll >= 0.3:
        for name, values in rng.sample(HEADER_POOL, rng.randint(1, 4)):
            headers.append((name, rng.choice(values)))
    encoding = next((v for k, v in headers if k == b"Content-Encoding"), None)
    if encoding == b"gzip" and rng.random() < 0.5:
        import gzip

        if rng.random() < 0.2:
            raw, family = gzip_bomb(), "mut_gzip_bomb"
        else:
            raw, family = gzip.compress(raw), "mut_gzip"
    method, path = "POST", endpoint
    if rng.random() < 0.05:
        method = rng.choice(["GET", "PUT", "PATCH", "DELETE", "OPTIONS", "POST", "TRACE"])
        path = rng.choice(
            [
                *ENDPOINTS,
                "/v1/models",
                "/admin/reload",
                "/metrics",
                "/v1/chat",
                "/v1/chat/completions?stream=true",
                "/%ff",
                "/v1//chat/completions",
            ]
        )
        family = "mut_request_line"
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    if rng.random() < 0.03:  # framing lies: a body shorter than announced, or chunked
        family = "mut_framing"
        if rng.random() < 0.5:
            lines.append(b"Content-Length: %d" % (len(raw) + rng.randint(1, 50)))
        else:
            lines.append(b"Transfer-Encoding: chunked")
            raw = b"%x\r\n%s\r\n" % (len(raw), raw) + rng.choice(
                [b"0\r\n\r\n", b"zz\r\n", b"0\r\nX: y\r\n\r\n"]
            )
    else:
        lines.append(b"Content-Length: %d" % len(raw))
    lines += [k + b": " + v for k, v in headers]
    return family, b"\r\n".join(lines) + b"\r\n\r\n" + raw


async def exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(request)
            await writer.drain()
        data = bytearray()
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(30):
                while chunk := await reader.read(65536):
                    data += chunk
        return bytes(data)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def test_fuzz_mutated_requests(target: Target) -> None:
    rng = random.Random(20261123)
    cases = [mutation_request(rng) for _ in range(MUTATION_CASES)]

    async def run_all() -> list[bytes]:
        gate = asyncio.Semaphore(MUTATION_CONCURRENCY)

        async def one(request: bytes) -> bytes:
            async with gate:
                return await exchange(target.port, request)

        return await asyncio.gather(*(one(req) for _, req in cases))

    answers = target.loop.run(run_all(), timeout=600)
    failures = []
    for (family, request), answer in zip(cases, answers, strict=True):
        if not answer:  # closed without a word: only a request the parser could not frame
            TALLY.fuzz[family] += 1
            TALLY.fuzz_sides["client"] += 1
            TALLY.fuzz_status[0] += 1
            if family not in ("mut_framing", "mut_request_line"):
                failures.append(f"no answer for {request[:300]!r}")
            continue
        while answer.startswith(b"HTTP/1.1 100 "):  # interim: Expect: 100-continue
            answer = answer.partition(b"\r\n\r\n")[2]
        try:
            resp = judge(
                family, request, parse_response(answer), http_layer_ok=family == "mut_request_line"
            )
            if family == "mut_gzip_bomb":  # 8x the body limit once inflated: never served
                assert 400 <= resp.status < 500, resp.status
        except AssertionError as e:
            failures.append(str(e)[:600])
    assert not failures, f"{len(failures)} failing cases; first ones:\n" + "\n".join(failures[:5])


def test_fuzz_left_no_trace_upstream(target: Target) -> None:
    """Runs after the fuzz tests (file order): nothing reached the canary, and no client
    header was passed on to the configured backend."""
    assert not target.canary.requests
    assert target.fake.requests, "no valid request got through: the fuzzing tested nothing"
    forwarded = {k.lower() for q in target.fake.requests for k in q.headers}
    assert not forwarded & {
        "x-injected",
        "x-speclane-lane",
        "x-speclane-client",
        "x-speclane-preset",
        "authorization",
        "user-agent",
    }
    assert target.router.proc.returncode is None
