"""Fuzzing the Responses door (``POST /v1/responses``, ``/v1/responses/compact``, ``GET`` and
``DELETE /v1/responses/{id}``, every numeric query parameter: ``NUMERIC_QUERY``) and the
Ollama model endpoints (``/api/show``, ``/api/pull``, ``/api/tags``, ``/api/ps``,
``/api/version``, ``/api/generate``, ``/api/chat``, and the ones speclane does not have,
``/api/delete``, ``/api/copy``, ``/api/create``, which must be an
Ollama-shaped 404), over HTTP, ``FUZZ_CASES`` cases a surface (10,000 by default).

The router, the scripted lane and the properties are ``test_fuzz_doors``'s: no 5xx that is
the router's own fault, every answer in its API's shape, no traceback logged. The cases here
add what broke before: JSON nested deep (up to orjson's 1,024 levels and past them) or
wide (tens of thousands of items) in any field, stored response ids (real ones, other
clients' shapes, junk), compaction items, follow-ups on stored conversations, and now and
then an upstream that misbehaves. All of it goes through HTTP (about 3 ms a case on the
2-core test machine: both surfaces fit the fast tier).
"""

from __future__ import annotations

import random
import re
import urllib.parse
from collections import deque
from typing import Any

import orjson

from router.frontdoors import responses_compact
from tests.frontdoors.test_fuzz_doors import (  # noqa: F401 (doors: the fixture)
    MODEL,
    Doors,
    anything,
    case,
    doors,
    encoded,
    fuzz,
    maybe,
    ollama_answer,
    ollama_chat,
    ollama_generate,
    optional,
    responses_answer,
    some,
    text,
    tool_body,
    tool_stream,
)

HOLE = "@@hostile@@"
HOLE_BYTES = orjson.dumps(HOLE)
# Depths around the rule (128), orjson's writing limit (254) and its reading limit (1,024).
DEPTHS = [2, 64, 126, 127, 128, 129, 200, 253, 254, 255, 260, 500, 900, 1023, 1024, 1025, 2000]


def hostile_json(rng: random.Random) -> bytes:
    """Deep or wide JSON, as bytes (orjson cannot write past 254 levels)."""
    roll = rng.random()
    if roll < 0.55:
        depth = rng.choice(DEPTHS)
        opens = [rng.choice([b"[", b'{"a":', b'{"type":', b'{"properties":']) for _ in range(depth)]
        inner = rng.choice([b"1", b'"x"', b"null", b"{}", b"[]"])
        closes = [b"]" if o == b"[" else b"}" for o in reversed(opens)]
        return b"".join(opens) + inner + b"".join(closes)
    width = rng.choice([1000, 10_000, 30_000])
    if roll < 0.7:
        return b"[" + b",".join([b"0"] * width) + b"]"
    if roll < 0.8:
        return b"[" + b",".join([b"[]"] * width) + b"]"
    if roll < 0.9:
        return b"{" + b",".join(b'"k%d":%d' % (i, i) for i in range(width)) + b"}"
    return orjson.dumps("x" * rng.choice([1000, 100_000]))


def with_hostile(rng: random.Random, body: dict[str, Any], places: list[Any]) -> bytes:
    """``body`` with deep or wide JSON put somewhere a door reads (``places``: functions
    that put ``HOLE`` into the body), now and then."""
    if rng.random() < 0.2:
        rng.choice(places)(body)
        return orjson.dumps(body).replace(HOLE_BYTES, hostile_json(rng), 1)
    return encoded(rng, body)


def nest(*path: str) -> Any:
    """A function that sets body[path[0]] = {path[1]: {... HOLE}}, lists as ``[]``."""

    def place(body: dict[str, Any]) -> None:
        value: Any = HOLE
        for key in reversed(path[1:]):
            value = [value] if key == "[]" else {key: value}
        body[path[0]] = value

    return place


def status_ok(status: int, headers: dict[str, str], data: bytes) -> None:
    if status >= 500:
        assert headers.get("x-speclane-error-source") == "upstream", (status, data[:300])


def openai_error(data: bytes) -> None:
    body = orjson.loads(data)
    assert isinstance(body["error"]["message"], str), body


def ollama_error(data: bytes) -> None:
    body = orjson.loads(data)
    assert isinstance(body, dict) and isinstance(body["error"], str), body


# --- the Responses door ------------------------------------------------------------------------

RESPONSE_PLACES = [
    nest("tools", "[]", "parameters"),
    lambda b: b.__setitem__("tools", [{"type": "function", "name": "f", "parameters": HOLE}]),
    lambda b: b.__setitem__("text", {"format": {"type": "json_schema", "schema": HOLE}}),
    lambda b: b.__setitem__("input", [{"type": "message", "role": "user", "content": HOLE}]),
    lambda b: b.__setitem__(
        "input", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": HOLE}]
    ),
    lambda b: b.__setitem__(
        "input", [{"type": "function_call_output", "call_id": "c", "output": HOLE}]
    ),
    nest("metadata"),
    nest("tool_choice"),
    nest("reasoning", "effort"),
    nest("include"),
    nest("input"),
    nest("previous_response_id"),
    lambda b: b.__setitem__("tools", [{"type": "namespace", "name": "ns", "tools": HOLE}]),
]


def compaction(rng: random.Random) -> dict[str, Any]:
    content = rng.choice(
        [
            responses_compact.encode(text(rng)),
            responses_compact.PREFIX + "!!!not base64",
            responses_compact.PREFIX + "gA==",  # not UTF-8
            "opaque-from-openai",
        ]
    )
    return {"type": rng.choice(sorted(responses_compact.ITEMS)), "encrypted_content": content}


def response_item(rng: random.Random) -> Any:
    kind = rng.choice(
        ["message"] * 4
        + ["function_call", "function_call_output", "compaction", "reasoning", "trigger", "odd"]
    )
    if kind == "message":
        part = lambda: rng.choice(  # noqa: E731
            [
                {"type": "input_text", "text": maybe(rng, lambda: text(rng))},
                {"type": "output_text", "text": text(rng)},
                {"type": "refusal", "refusal": text(rng)},
                {"type": "input_image", "image_url": maybe(rng, "data:image/png;base64,AAAA")},
                {"type": "input_file", "file_id": "f"},
            ]
        )
        return {
            "type": "message",
            "role": maybe(rng, lambda: rng.choice(["user", "assistant", "system", "developer"])),
            "content": maybe(rng, lambda: rng.choice([text(rng), some(rng, part, 3)])),
        }
    if kind == "function_call":
        item = {
            "type": "function_call",
            "call_id": maybe(rng, "call_1"),
            "name": maybe(rng, "get_weather"),
            "arguments": maybe(rng, lambda: rng.choice(['{"city": "Paris"}', "", "{", "[]"])),
        }
        optional(rng, item, {"namespace": "ns", "id": "fc_1", "status": "completed"})
        return item
    if kind == "function_call_output":
        return {
            "type": "function_call_output",
            "call_id": maybe(rng, "call_1"),
            "output": maybe(
                rng,
                lambda: rng.choice(
                    [text(rng), [{"type": "input_text", "text": text(rng)}], [{"type": "x"}]]
                ),
            ),
        }
    if kind == "compaction":
        return compaction(rng)
    if kind == "reasoning":
        return {"type": "reasoning", "summary": [], "encrypted_content": anything(rng)}
    if kind == "trigger":
        return {"type": responses_compact.TRIGGER}
    return {"type": anything(rng), "role": anything(rng), "content": anything(rng)}


def responses_tool(rng: random.Random) -> Any:
    function = {
        "type": "function",
        "name": maybe(rng, lambda: rng.choice(["get_weather", "f", "", "a" * 300])),
        "parameters": maybe(rng, {"type": "object", "properties": {"city": {"type": "string"}}}),
    }
    optional(
        rng, function, {"description": lambda: text(rng), "strict": lambda: rng.random() < 0.5}
    )
    return rng.choice(
        [
            function,
            function,
            {
                "type": "namespace",
                "name": maybe(rng, "ns"),
                "tools": some(rng, lambda: function, 2),
            },
            {"type": "web_search"},
            {"type": maybe(rng, "file_search")},
        ]
    )


def clean_responses_request(rng: random.Random, ids: deque[str]) -> dict[str, Any]:
    """A request the door should answer 200 (unless its stored response was evicted):
    most fuzzed requests are refused early, and the paths past validation need cases too."""
    items: list[dict[str, Any]] = []
    for _ in range(rng.randint(0, 4)):
        kind = rng.choice(["user", "developer", "assistant", "call", "compaction"])
        if kind == "call":
            call_id = f"call_{rng.randint(0, 9)}"
            items.append(
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": "get_weather",
                    "arguments": "{}",
                }
            )
            items.append({"type": "function_call_output", "call_id": call_id, "output": text(rng)})
        elif kind == "compaction":
            items.append(
                {"type": "compaction", "encrypted_content": responses_compact.encode(text(rng))}
            )
        else:
            items.append({"type": "message", "role": kind, "content": text(rng)})
    items.append({"type": "message", "role": "user", "content": text(rng)})
    if rng.random() < 0.1:
        items.append({"type": responses_compact.TRIGGER})
    body: dict[str, Any] = {
        "model": MODEL,
        "input": rng.choice([text(rng), items]),
        "stream": rng.random() < 0.5,
        "store": rng.random() < 0.9,
    }
    if ids and rng.random() < 0.4:
        body["previous_response_id"] = rng.choice(ids)
    optional(
        rng,
        body,
        {
            "instructions": lambda: text(rng),
            "tools": lambda: [
                {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
                {"type": "web_search"},
            ],
            "tool_choice": "auto",
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "max_output_tokens": 16,
        },
    )
    return body


def responses_request(rng: random.Random, ids: deque[str]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": maybe(rng, MODEL),
        "input": maybe(
            rng,
            lambda: rng.choice(
                [
                    text(rng),
                    [maybe(rng, lambda: response_item(rng)) for _ in range(rng.randint(0, 4))],
                ]
            ),
        ),
    }
    optional(
        rng,
        body,
        {
            "instructions": lambda: text(rng),
            "stream": lambda: rng.random() < 0.5,
            "store": lambda: rng.random() < 0.8,
            "previous_response_id": lambda: rng.choice(ids) if ids else "resp_none",
            "tools": lambda: [
                maybe(rng, lambda: responses_tool(rng)) for _ in range(rng.randint(0, 3))
            ],
            "tool_choice": lambda: rng.choice(
                [
                    "auto",
                    "none",
                    "required",
                    {"type": "function", "name": maybe(rng, "get_weather")},
                ]
            ),
            "text": lambda: {
                "format": maybe(
                    rng,
                    lambda: rng.choice(
                        [
                            {"type": "text"},
                            {"type": "json_object"},
                            {"type": "json_schema", "name": "x", "schema": {"type": "object"}},
                        ]
                    ),
                )
            },
            "metadata": lambda: {text(rng)[:20]: text(rng) for _ in range(rng.randint(0, 3))},
            "max_output_tokens": lambda: rng.randint(-1, 64),
            "temperature": lambda: rng.random() * 2,
            "top_p": lambda: rng.random(),
            "parallel_tool_calls": lambda: rng.random() < 0.5,
            "prompt_cache_key": lambda: text(rng),
            "reasoning": {"effort": "low", "summary": "auto"},
            "include": ["reasoning.encrypted_content"],
            "safety_identifier": lambda: text(rng),
            "truncation": "auto",
            "service_tier": "auto",
        },
    )
    if rng.random() < 0.05:
        body[
            rng.choice(["background", "conversation", "prompt", "max_tool_calls", "top_logprobs"])
        ] = anything(rng)
    return body


def remember(ids: deque[str], headers: dict[str, str], data: bytes) -> None:
    """The id of a response the door stored (a JSON answer, or a stream's last event)."""
    try:
        if headers.get("content-type", "").startswith("text/event-stream"):
            last = data.rstrip().rsplit(b"\ndata: ", 1)[-1]
            body = orjson.loads(last).get("response", {})
        else:
            body = orjson.loads(data)
    except (orjson.JSONDecodeError, AttributeError):
        return
    if isinstance(body, dict) and body.get("store") and isinstance(body.get("id"), str):
        ids.append(body["id"])


def response_id(rng: random.Random, ids: deque[str]) -> str:
    if ids and rng.random() < 0.6:
        return rng.choice(ids)
    return rng.choice(
        [
            "resp_" + "0" * 32,
            "",
            "x" * rng.choice([1, 257, 3000]),
            "..",
            "%2e%2e",
            "%00",
            "resp_%F0%9F%98%80",
            "%ff%fe",
            "a/b",
            "resp_1?x=1",
            urllib.parse.quote(text(rng), safe=""),
        ]
    )


def test_fuzz_the_responses_door(doors: Doors) -> None:  # noqa: F811 (the fixture)
    ids: deque[str] = deque(maxlen=64)

    def one(rng: random.Random) -> None:
        roll = rng.random()
        if roll < 0.2:  # read or delete a stored response (or something that is not one)
            method = rng.choice(["GET", "GET", "DELETE", "PUT", "POST"])
            path = "/v1/responses/" + response_id(rng, ids)
            body = rng.choice([None, b"", b"{}", orjson.dumps(anything(rng))])
            with case(method.encode(), path.encode(), body or b""):
                status, headers, data = doors.send(method, path, body)
                status_ok(status, headers, data)
                if status == 200 and method == "GET":
                    assert orjson.loads(data)["object"] == "response", data[:300]
                elif status == 200 and method == "DELETE":
                    assert orjson.loads(data)["deleted"] is True, data[:300]
                elif status != 200:
                    openai_error(data)
            return
        compact = roll < 0.3
        doors.lane.script = None
        if rng.random() < 0.1:  # the lane misbehaves now and then
            doors.lane.script = tool_stream(rng) if rng.random() < 0.5 else tool_body(rng)
        make = clean_responses_request if rng.random() < 0.35 else responses_request
        raw = with_hostile(rng, make(rng, ids), RESPONSE_PLACES)
        path = "/v1/responses/compact" if compact else "/v1/responses"
        with case(path.encode(), raw, doors.lane.script or b""):
            status, headers, data = doors.post(path, raw)
            if compact and status == 200:  # answered whole, whatever the body asked
                body = orjson.loads(data)
                assert body["object"] == "response.compaction", body
                assert [item["type"] for item in body["output"]][-1:] == ["compaction"], body
            else:
                responses_answer(status, headers, data)
        if status == 200:
            remember(ids, headers, data)

    fuzz(doors, "responses", one)


# --- numeric query parameters ---------------------------------------------------------------

# Every numeric query parameter of every endpoint (path, name, range): each is parsed one
# strict way (router.kernel.request_rules.ascii_int), a 400 naming it, never a 500.
NUMERIC_QUERY = [("/v1/responses/{id}/input_items", "limit", 1, 100)]
# What str.isdigit() or str.isnumeric() takes beyond ASCII (superscripts, circled digits,
# other scripts' digits, fractions): int() refuses some of them, float() others.
UNICODE_NUMERALS = [chr(c) for c in range(0x80, 0x30000) if chr(c).isdigit() or chr(c).isnumeric()]


def numeral(rng: random.Random, lo: int, hi: int) -> str:
    roll = rng.random()
    if roll < 0.3:  # around the range, with leading zeros now and then
        value = str(rng.choice([rng.randint(lo - 2, hi + 2), lo, hi, 0, hi + 1]))
        return "0" * rng.choice([0, 0, 0, 1, 2, 3]) + value
    if roll < 0.55:  # Unicode numerals, alone, repeated or among ASCII digits
        digits = [rng.choice("0123456789") for _ in range(rng.randint(0, 3))]
        for _ in range(rng.randint(1, 3)):
            digits.insert(rng.randint(0, len(digits)), rng.choice(UNICODE_NUMERALS))
        return "".join(digits)
    if roll < 0.65:  # long runs of digits, past int()'s 4,300-digit limit too
        return rng.choice("123456789") * rng.choice([4, 10, 100, 4300, 4301, 5000])
    return rng.choice(
        [
            "",
            " 5",
            "5 ",
            "+5",
            "-5",
            "5.0",
            "1e1",
            "0x10",
            "1_0",
            "inf",
            "nan",
            "\x00",
            "5\n",
            "\u00b2",
            "\u00b3\u00b9",
            "\u2460",
            "\uff15",
            "\u0665",
            "\ud7ff",
            text(rng)[:50],
        ]
    )


def strict_valid(value: str, lo: int, hi: int) -> bool:
    """The rule, written apart from the router's helper."""
    digits = len(str(hi))
    return re.fullmatch(rf"[0-9]{{1,{digits}}}", value) is not None and lo <= int(value) <= hi


def test_fuzz_the_numeric_query_parameters(doors: Doors) -> None:  # noqa: F811 (the fixture)
    doors.lane.script = None
    body = {"model": MODEL, "input": [{"role": "user", "content": "one"}], "store": True}
    status, _, data = doors.post("/v1/responses", orjson.dumps(body))
    assert status == 200, data[:300]
    stored = orjson.loads(data)["id"]

    def one(rng: random.Random) -> None:
        path, name, lo, hi = rng.choice(NUMERIC_QUERY)
        value = numeral(rng, lo, hi)
        pairs = [(name, value)]
        if rng.random() < 0.2:  # the first of several counts (aiohttp's query.get)
            pairs.append((name, numeral(rng, lo, hi)[:50]))  # (the URL within aiohttp's 8 KiB)
        if rng.random() < 0.2:
            pairs.insert(rng.randint(0, len(pairs)), ("order", rng.choice(["asc", "desc"])))
        query = urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote)
        raw = rng.random() < 0.05  # now and then bytes that are no UTF-8, or no encoding at all
        if raw:
            query = f"{name}=" + rng.choice(["%ff", "%c0%af", "%", "%zz", "1%00", "%e2%91", "1+2"])
        url = path.replace("{id}", stored) + "?" + query
        with case(url.encode()):
            status, headers, data = doors.send("GET", url, None)
            status_ok(status, headers, data)
            assert status in (200, 400), (status, data[:300])
            answer = orjson.loads(data)
            if status == 400:
                assert answer["error"]["param"] == name, answer
            else:
                assert answer["object"] == "list", answer
            if not raw:
                assert (status == 200) == strict_valid(value, lo, hi), (value, status)

    fuzz(doors, "numeric_query", one)


# --- the Ollama model endpoints -------------------------------------------------------------

OLLAMA_PLACES = [
    nest("format"),
    nest("format", "properties", "a"),
    nest("options"),
    nest("options", "stop"),
    nest("messages"),
    lambda b: b.__setitem__("messages", [{"role": "user", "content": HOLE}]),
    lambda b: b.__setitem__(
        "messages",
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "f", "arguments": HOLE}}],
            }
        ],
    ),
    nest("tools", "[]", "function", "parameters"),
    nest("model"),
    nest("name"),
    nest("keep_alive"),
    nest("images"),
    nest("insecure"),
]


def model_name(rng: random.Random) -> Any:
    if rng.random() < 0.5:
        return MODEL
    return maybe(
        rng,
        lambda: rng.choice(
            [f"{MODEL}:latest", "llama3:8b", "", "../etc/passwd", "/tmp/x", "a" * 600, "é"]
        ),
    )


def clean_ollama(rng: random.Random, kind: str) -> dict[str, Any]:
    """An /api/chat or /api/generate request that should be answered 200."""
    body: dict[str, Any] = {"model": MODEL, "stream": rng.random() < 0.5}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": text(rng)}]
    else:
        body["prompt"] = text(rng)
    optional(
        rng,
        body,
        {
            "format": lambda: rng.choice(["json", {"type": "object"}]),
            "options": {"num_predict": 8, "temperature": 0.5, "stop": ["\n"]},
            "keep_alive": "5m",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        },
    )
    if kind == "generate":
        body.pop("tools", None)
    return body


def model_request(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {}
    body[rng.choice(["model", "name", "model"])] = model_name(rng)
    optional(
        rng,
        body,
        {
            "stream": lambda: rng.random() < 0.5,
            "verbose": True,
            "insecure": True,
            "source": model_name(rng),
            "destination": model_name(rng),
            "from": model_name(rng),
            "modelfile": "FROM x",
            "quantize": "q4_0",
            "keep_alive": lambda: rng.choice([0, -1, "5m", "bogus"]),
        },
    )
    return body


# method, path, what makes its body (None: none), what its 200 looks like
def tags_like(data: bytes) -> None:
    assert isinstance(orjson.loads(data)["models"], list), data[:300]


def show_like(data: bytes) -> None:
    body = orjson.loads(data)
    assert isinstance(body["details"], dict) and isinstance(body["capabilities"], list), body


def pull_like(data: bytes) -> None:
    lines = [orjson.loads(line) for line in data.split(b"\n") if line.strip()]
    assert lines and all(isinstance(x, dict) and ("status" in x or "error" in x) for x in lines)


def version_like(data: bytes) -> None:
    assert isinstance(orjson.loads(data)["version"], str), data[:300]


OLLAMA_ENDPOINTS: list[tuple[str, str, str, Any]] = [
    ("POST", "/api/show", "model", show_like),
    ("POST", "/api/pull", "model", pull_like),
    ("GET", "/api/tags", "none", tags_like),
    ("GET", "/api/ps", "none", tags_like),
    ("GET", "/api/version", "none", version_like),
    ("POST", "/api/generate", "generate", None),
    ("POST", "/api/chat", "chat", None),
]
# Endpoints Ollama has and speclane does not: an Ollama-shaped 404, whatever the body.
ABSENT: list[tuple[str, str, str, Any]] = [
    ("DELETE", "/api/delete", "model", None),
    ("POST", "/api/copy", "model", None),
    ("POST", "/api/create", "model", None),
    ("POST", "/api/push", "model", None),
    ("POST", "/api/embed", "model", None),
]


def test_fuzz_the_ollama_model_endpoints(doors: Doors) -> None:  # noqa: F811
    def one(rng: random.Random) -> None:
        method, path, kind, looks = rng.choice(OLLAMA_ENDPOINTS if rng.random() < 0.85 else ABSENT)
        if rng.random() < 0.05:
            method = rng.choice(["GET", "POST", "PUT", "DELETE"])  # the wrong one, often
        if kind == "none":
            raw = rng.choice([b"", b"", b"{}", orjson.dumps(anything(rng))])
        else:
            if kind != "model" and rng.random() < 0.35:
                request = clean_ollama(rng, kind)
            else:
                make = {"model": model_request, "generate": ollama_generate, "chat": ollama_chat}
                request = make[kind](rng)
            raw = with_hostile(rng, request, OLLAMA_PLACES)
        doors.lane.script = None
        if kind in ("generate", "chat") and rng.random() < 0.1:
            doors.lane.script = tool_stream(rng) if rng.random() < 0.5 else tool_body(rng)
        with case(method.encode(), path.encode(), raw, doors.lane.script or b""):
            status, headers, data = doors.send(method, path, raw or None)
            if kind in ("generate", "chat") and method == "POST":
                ollama_answer(status, headers, data)
                return
            status_ok(status, headers, data)
            if status == 200 and looks is not None:
                looks(data)
            elif status != 200:
                ollama_error(data) if path.startswith("/api/") else openai_error(data)

    fuzz(doors, "ollama_models", one)
