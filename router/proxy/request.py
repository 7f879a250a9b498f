"""Request parsing and SSE framing.

What is forwarded is the parsed object, re-encoded (``ParsedRequest.body``), never the raw
bytes: what speclane validated is exactly what the backend gets, at every depth. JSON
parsers disagree on duplicate keys (``"max_tokens": 1000000, "max_tokens": 10``: orjson
keeps the last, others the first), so forwarding the raw bytes would let a body pass the
caps with one value and reach the backend with the other. Detecting duplicates exactly
costs more than re-encoding (orjson: about 50 us for a 50 KB agent request, a third of
parsing it; well under a microsecond for a short one), so every body is re-encoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from router.errors import bad_request
from router.routing.types import Endpoint, RouteRequest
from router.speculation.families import classify_family
from router.worker.contract import DRAFT_SOURCE_FIELD, DRAFT_TOKENS_FIELD, REQUEST_DRAFT_SOURCES

MAX_N = 128
MAX_TOKENS_LIMIT = 1_000_000


@dataclass(slots=True)
class ParsedRequest:
    endpoint: Endpoint
    raw: bytes  # as received; never forwarded (see the module docstring)
    data: dict[str, Any]
    route: RouteRequest
    changed: bool = False  # speclane changed a field (clamped, aliased...)
    # The token a lane of ours files the prompt's KV cache under (``router.proxy.partition``).
    cache_partition: str | None = None
    _encoded: bytes | None = None

    def set_field(self, key: str, value: Any) -> None:
        self.data[key] = value
        # The two names of the token limit move together: a backend may read either.
        if (twin := TOKEN_TWINS.get(key)) is not None and twin in self.data:
            self.data[twin] = value
        self.changed = True
        self._encoded = None

    def body(self, *, plain: bool = False, draft_source: str | None = None) -> bytes:
        """The bytes to forward: ``data`` re-encoded (encoded once, reused by retries), so the
        upstream sees exactly what was validated. ``plain``: for the speculative lane decoding
        without its draft (a workload where speculation is off, or the baseline it is compared
        against), through the worker's ``num_draft_tokens`` request field. ``draft_source``:
        for the speculative lane drafting, the source the router chose for the request's
        family; never over the client's own ``draft_source``, which is forwarded as sent."""
        if self._encoded is None:
            self._encoded = orjson.dumps(self.data)
        if plain:
            return self._with_field(DRAFT_TOKENS_FIELD, 0)
        if draft_source is not None and DRAFT_SOURCE_FIELD not in self.data:
            return self._with_field(DRAFT_SOURCE_FIELD, draft_source)
        return self._encoded

    def _with_field(self, key: str, value: Any) -> bytes:
        """The encoded body with one more top-level field. A key the client did not send is
        appended to the bytes already encoded (an agent's 50 KB body is not encoded a second
        time for one field); one it did send is replaced in a re-encoded copy, so no key is
        ever sent twice."""
        assert self._encoded is not None
        if key in self.data:
            return orjson.dumps({**self.data, key: value})
        # ``data`` is a non-empty object (it has ``model``): its encoding ends with "}".
        return b"".join((self._encoded[:-1], b",", orjson.dumps(key), b":",
                         orjson.dumps(value), b"}"))


def load_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 (every front door reads bodies this way)."""
    if not raw.strip():
        raise bad_request("request body is empty; expected a JSON object", code="invalid_json")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from e
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    return data


def parse_request(endpoint: Endpoint, raw: bytes) -> ParsedRequest:
    data = load_object(raw)
    model = data.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_request("'model' is required and must be a non-empty string", param="model")
    if len(model) > 512:
        raise bad_request("'model' is too long (512 characters at most)", param="model")
    _check_payload(endpoint, data)
    stream = _optional(data, "stream", bool, False)
    n = _optional(data, "n", int, 1)
    if not 1 <= n <= MAX_N:
        raise bad_request(f"'n' must be between 1 and {MAX_N}", param="n")
    max_tokens = _max_tokens(data)
    temperature = _optional(data, "temperature", (int, float), None)
    if temperature is not None and not 0 <= temperature <= 2:
        raise bad_request("'temperature' must be between 0 and 2", param="temperature")
    route = RouteRequest(
        endpoint=endpoint,
        model=model,
        stream=stream,
        n=n,
        max_tokens=max_tokens,
        temperature=None if temperature is None else float(temperature),
        prompt_chars=_prompt_chars(endpoint, data),
        family=classify_family(data) if endpoint != "embeddings" else "chat",
        draft_source=_asked_source(data),
    )
    parsed = ParsedRequest(endpoint=endpoint, raw=raw, data=data, route=route)
    try:
        parsed.body()  # encoded now: what cannot be forwarded is the client's 400
    except orjson.JSONEncodeError as e:  # orjson writes 254 levels of nesting, reads 1024
        raise bad_request(f"request body cannot be forwarded: {e}", code="invalid_json") from e
    return parsed


def _asked_source(data: dict[str, Any]) -> str | None:
    """The client's own ``draft_source`` when it is one the lane accepts (any other value is
    forwarded too, and the lane answers the 400)."""
    value = data.get(DRAFT_SOURCE_FIELD)
    return value if isinstance(value, str) and value in REQUEST_DRAFT_SOURCES else None


def _check_payload(endpoint: Endpoint, data: dict[str, Any]) -> None:
    if endpoint == "chat":
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' is required and must be a non-empty array",
                              param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad_request(
                    f"'messages[{i}]' must be an object with a string 'role'",
                    param=f"messages[{i}]")
    elif endpoint == "completions":
        if not isinstance(data.get("prompt"), str | list):
            raise bad_request("'prompt' is required (a string or an array)", param="prompt")
    elif not isinstance(data.get("input"), str | list):
        raise bad_request("'input' is required (a string or an array)", param="input")
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options")


def _optional(data: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = data.get(key)
    if value is None:
        return default
    # bool is an int subclass: reject true/false where a number is expected.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise bad_request(f"'{key}' has the wrong type", param=key)
    return value


TOKEN_TWINS = {"max_tokens": "max_completion_tokens", "max_completion_tokens": "max_tokens"}


def _max_tokens(data: dict[str, Any]) -> int | None:
    """The token limit. Both names are checked; when a request sets both, both become the
    smaller value, since backends differ in which one they read (mlx_lm and vLLM prefer
    ``max_completion_tokens``, others ``max_tokens``) and the caps apply to one value."""
    found = []
    for key in ("max_completion_tokens", "max_tokens"):
        value = _optional(data, key, int, None)
        if value is not None:
            if not 1 <= value <= MAX_TOKENS_LIMIT:
                raise bad_request(f"'{key}' must be between 1 and {MAX_TOKENS_LIMIT}", param=key)
            found.append(value)
    if not found:
        return None
    limit = min(found)
    if len(found) == 2:
        data["max_completion_tokens"] = data["max_tokens"] = limit
    return limit


def _prompt_chars(endpoint: Endpoint, data: dict[str, Any]) -> int:
    if endpoint == "chat":
        total = 0
        for m in data["messages"]:
            content = m.get("content")
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(p.get("text", "")) for p in content if isinstance(p, dict)
                             and isinstance(p.get("text"), str))
        return total
    field = data.get("prompt" if endpoint == "completions" else "input")
    if isinstance(field, str):
        return len(field)
    return sum(len(x) for x in field if isinstance(x, str)) if isinstance(field, list) else 0


# --- SSE ----------------------------------------------------------------------------------

SSE_FIELD_PREFIXES = (b"data:", b":", b"event:", b"id:", b"retry:")
DONE = b"[DONE]"


def looks_like_sse(first_chunk: bytes) -> bool:
    """Cheap framing check on the first bytes of a stream (the rest is relayed untouched)."""
    head = first_chunk.lstrip(b"\r\n")
    return not head or head.startswith(SSE_FIELD_PREFIXES)


# What ends an event: a line end, then an empty line (LF, CRLF; CR alone is not used by
# any backend we front, and is only caught by the size valve in split_events).
_EVENT_ENDS = ((b"\n\n", 2), (b"\n\r\n", 3))
HELD_LIMIT = 64 * 1024


def split_events(data: bytes) -> tuple[bytes, bytes]:
    """``(complete events, the incomplete event after them)``.

    The relay writes only whole events, so that when an upstream dies in the middle of one
    the error event it appends is not glued onto half an event (which a client would
    dispatch as one broken event, never seeing the error). A complete event is never held
    back; an incomplete one is useless to a client until its end arrives anyway. Past
    ``HELD_LIMIT`` bytes without an event end everything is released.
    """
    if data.endswith(b"\n\n") or len(data) > HELD_LIMIT:
        return data, b""  # the usual case: one or more whole events per chunk
    end = max((i + n for sep, n in _EVENT_ENDS if (i := data.rfind(sep)) >= 0), default=0)
    return data[:end], data[end:]


def first_event_is_json(first_chunk: bytes) -> bool:
    """The first complete event's data is JSON or [DONE] (True while none is complete).

    Only the events up to the first one with data are read: an upstream that answers at
    once can put a whole long answer in the first chunk.
    """
    text = first_chunk.replace(b"\r\n", b"\n") if b"\r" in first_chunk else first_chunk
    start = 0
    while (end := text.find(b"\n\n", start)) >= 0:
        payload = _payload(text[start:end])
        start = end + 2
        if payload is None:
            continue  # a comment or an event without data
        if payload.strip() == DONE:
            return True
        try:
            orjson.loads(payload)
        except orjson.JSONDecodeError:
            return False
        return True
    return True


def _payload(event: bytes) -> bytes | None:
    """The joined ``data:`` lines of one event (LF line ends), None when it has none."""
    if b"\n" not in event:  # the usual event, one line: no list to build
        return event[5:].lstrip(b" ") if event.startswith(b"data:") else None
    lines = [ln[5:].lstrip(b" ") for ln in event.split(b"\n") if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _tail_payloads(buf: bytes | bytearray, want: int) -> list[bytes]:
    """The ``data:`` payloads of the last ``want`` events of ``buf`` that have data (fewer
    when it holds fewer), oldest first; an unterminated last event counts too.

    Reads a window at the end, widened until it holds enough events, so that finishing a
    long stream costs a few events' parsing rather than the whole tail's.
    """
    window = 1024  # a few token events; widened for bigger ones
    while True:
        whole = window >= len(buf)
        text = bytes(buf if whole else buf[-window:])
        if b"\r" in text:  # CRLF events (rare): a copy with LF line ends
            text = text.replace(b"\r\n", b"\n")
        events = text.split(b"\n\n")
        if not whole:
            events = events[1:]  # the window may have cut the first one
        payloads = [p for p in map(_payload, events) if p is not None]
        if whole or len(payloads) >= want:
            return payloads[-want:]
        window *= 4


class SSETail:
    """Keeps the last bytes of a relayed stream so its final events can be parsed after it ends.

    Costs one bounded bytearray append per chunk: the stream itself is never held back.
    """

    def __init__(self, limit: int = 64 * 1024) -> None:
        self._buf = bytearray()
        self._limit = limit

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        if len(self._buf) > 2 * self._limit:
            del self._buf[: len(self._buf) - self._limit]

    def saw_done(self) -> bool:
        return self.finish(1)[2]

    def last_events(self, count: int = 4) -> tuple[list[dict[str, Any]], int]:
        """The last ``count`` JSON events (not [DONE]) and how many of them failed to parse."""
        events, bad, _ = self.finish(count)
        return events, bad

    def finish(self, count: int = 4) -> tuple[list[dict[str, Any]], int, bool]:
        """``(last_events(count), how many of those were malformed, saw_done())`` in one
        reading of the tail: the relay asks all three as each stream ends."""
        events: list[dict[str, Any]] = []
        bad = 0
        # A little more than asked: [DONE] (sent twice by some servers) does not count.
        tail = _tail_payloads(self._buf, count + 2)
        done = any(p.strip() == DONE for p in tail[-2:])
        payloads = [p for p in tail if p.strip() != DONE]
        for payload in payloads[-count:]:
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                bad += 1
                continue
            if isinstance(obj, dict):
                events.append(obj)
            else:
                bad += 1
        return events, bad, done
