"""What both front doors need: reading a JSON body, handing the OpenAI request to the
pipeline, and reading the OpenAI events an upstream streams back (pure)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from router.kernel import errors, sse
from router.kernel.errors import RouterError, bad_request
from router.kernel.request_rules import too_deep
from router.proxy.request import ParsedRequest, parse_request
from router.routing.types import Endpoint

# What a lane renders into the prompt (the messages, the tools and how they may be called),
# nothing it generates: the body of a token count (``router.frontdoors.tokencount``).
COUNTED_FIELDS = ("model", "messages", "tools", "tool_choice", "parallel_tool_calls")


def counted(openai: dict[str, Any]) -> dict[str, Any]:
    """A lane's /tokenize body for an OpenAI chat request."""
    return {k: openai[k] for k in COUNTED_FIELDS if k in openai}


def to_parsed(endpoint: Endpoint, openai: dict[str, Any]) -> ParsedRequest:
    """The translated request, checked and described exactly as an OpenAI client's would be."""
    try:
        raw = orjson.dumps(openai)
    except orjson.JSONEncodeError as e:  # not with a body under the depth rule: a guard
        raise bad_request(f"request body cannot be forwarded: {e}", code="invalid_json") from e
    return parse_request(endpoint, raw, translated=True)


class Pieces:
    """Text that arrives in pieces (a stream's deltas), joined when read. ``text += piece``
    copies the text so far at every piece: a long answer in small deltas cost the square of
    its length on the event loop (a 1 MB answer in 10-byte deltas: a minute)."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[str] = []

    def add(self, piece: str) -> None:
        self._parts.append(piece)

    def text(self) -> str:
        if len(self._parts) > 1:
            self._parts[:] = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def __bool__(self) -> bool:
        return any(self._parts)


def first_choices(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The well-formed choices of index 0 in an upstream chunk (the doors answer one choice);
    anything else in ``choices`` is skipped."""
    choices = event.get("choices")
    if not isinstance(choices, list):
        return []
    return [c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0]


def dict_of(data: dict[str, Any], key: str) -> dict[str, Any]:
    """An upstream object's member that should be an object; anything else reads as empty."""
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def list_of(data: dict[str, Any], key: str) -> list[Any]:
    """An upstream object's member that should be a list; anything else reads as empty."""
    value = data.get(key)
    return value if isinstance(value, list) else []


def str_field(data: dict[str, Any], key: str, *, required: bool = False) -> str | None:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        what = "a non-empty string" if required else "a string"
        raise bad_request(f"'{key}' must be {what}", param=key)
    return value


def whole_call(call: Any) -> tuple[str, dict[str, Any]]:
    """A whole OpenAI tool call's function name and arguments object, for the front doors
    that send arguments as an object (Anthropic's ``input``, Ollama's ``arguments``); a 502
    for a malformed call or arguments that are not a JSON object."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise errors.upstream_failed(
            "the backend's answer has a malformed tool call", code="upstream_bad_json"
        )
    args = arguments_object(function.get("arguments"))
    if args is None:
        raise errors.upstream_failed(
            f"the backend called tool '{function['name']}' with arguments that are not a "
            "JSON object",
            code="upstream_bad_tool_call",
        )
    return function["name"], args


def logprob_entries(choice: Any) -> list[dict[str, Any]]:
    """An OpenAI choice's (or chunk's) log-probabilities as entries ``{token, logprob, bytes,
    top_logprobs: [{token, logprob, bytes}]}``: chat's shape as it is (the Responses and
    Ollama APIs' too), a text completion's ``{tokens, token_logprobs, top_logprobs}`` turned
    into it; [] without any."""
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    if not isinstance(logprobs, dict):
        return []
    content = logprobs.get("content")
    if isinstance(content, list):
        return [e for e in content if isinstance(e, dict)]
    tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list):
        return []
    tops = logprobs.get("top_logprobs")
    tops = tops if isinstance(tops, list) else []
    out = []
    for i, (token, value) in enumerate(zip(tokens, values, strict=False)):
        if not isinstance(token, str) or not isinstance(value, int | float):
            continue
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        out.append(
            {
                **_entry(token, value),
                "top_logprobs": [
                    _entry(t, lp) for t, lp in top.items() if isinstance(lp, int | float)
                ],
            }
        )
    return out


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def kept_calls(calls: list[Any], finish_reason: Any) -> list[Any]:
    """A whole answer's tool calls for the doors that send arguments as an object: a call the
    token limit cut (``finish_reason: "length"``, arguments written part way, as OpenAI
    answers it) is unusable there and dropped, as their streams drop it; any other call must
    be whole (``whole_call``)."""
    if finish_reason != "length":
        return calls
    return [
        c
        for c in calls
        if not isinstance(c, dict)
        or not isinstance(c.get("function"), dict)
        or arguments_object(c["function"].get("arguments")) is not None
    ]


def arguments_object(arguments: Any) -> dict[str, Any] | None:
    """An OpenAI tool call's ``arguments`` (a JSON string) as an object; None when it is not
    a JSON object, or nests deeper than a request may (``request_rules.MAX_JSON_DEPTH``: the
    doors that send arguments as an object could not encode it)."""
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return None
    return arguments if isinstance(arguments, dict) and not too_deep(arguments) else None


def translate_events(
    data: bytes,
    *,
    chunk: Callable[[dict[str, Any]], bytes],
    error: Callable[[RouterError], bytes],
    ended: Callable[[], bool],
    head: bytes = b"",
) -> bytes:
    """The OpenAI SSE events of ``data`` in another API's framing (``chunk`` per event),
    after ``head``; an upstream error event ends the stream with that API's ``error``."""
    out = bytearray(head)
    for event in sse.json_events(data):
        if ended():
            break
        failed = errors.from_upstream_event(event)
        if failed is not None:
            out += error(failed)
            break
        out += chunk(event)
    return bytes(out)
