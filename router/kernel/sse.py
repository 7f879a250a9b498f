"""Server-sent events as the OpenAI-style streams use them: framing, event splitting and
the ``[DONE]`` rule, for every part that writes or reads a stream (the relay, the front
doors, the worker, the benchmarks).

An event is lines ended by LF or CRLF, ended itself by an empty line; its data is its
``data:`` lines joined by LF (the space after the colon is dropped); ``:`` lines are
comments. A stream ends with the event ``data: [DONE]``: only that line ends it, never the
text ``[DONE]`` inside a model's content.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from typing import Any

import orjson

FIELD_PREFIXES = (b"data:", b":", b"event:", b"id:", b"retry:")
DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"
# "data: [DONE]" at the start of a line (a model can write "[DONE]" inside its content).
DONE_LINE = re.compile(rb"(?:^|\n)data: ?\[DONE\][ \t]*(?:\r?\n|$)")
# What ends an event: a line end, then an empty line (LF, CRLF; CR alone is not used by
# any backend we front, and is only caught by the size valve in split_events).
_EVENT_ENDS = ((b"\n\n", 2), (b"\n\r\n", 3))
HELD_LIMIT = 64 * 1024


# --- writing ------------------------------------------------------------------------------


def frame(data: bytes, event: str | None = None) -> bytes:
    """One event holding ``data`` (a single line: JSON encoders write no raw line ends)."""
    if event is None:
        return b"data: " + data + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


def event_json(event: str, obj: Any) -> bytes:
    """A named event holding ``obj`` as JSON (Anthropic's framing)."""
    return frame(orjson.dumps(obj), event)


# --- reading what a stream is made of -----------------------------------------------------


def comment(note: str) -> bytes:
    """A comment line: every SSE reader skips it (a stream's keep-alive). ``note`` is
    speclane's own text (one line)."""
    return f": {note}\n\n".encode()


def is_done(payload: bytes) -> bool:
    """The data of an event is ``[DONE]``: the stream's end."""
    return payload.strip() == DONE


def looks_like_sse(first_chunk: bytes) -> bool:
    """Cheap framing check on the first bytes of a stream (the rest is relayed untouched)."""
    head = first_chunk.lstrip(b"\r\n")
    return not head or head.startswith(FIELD_PREFIXES)


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


def payload(event: bytes) -> bytes | None:
    """The joined ``data:`` lines of one event (LF line ends), None when it has none."""
    if b"\n" not in event:  # the usual event, one line: no list to build
        return event[5:].lstrip(b" ") if event.startswith(b"data:") else None
    lines = [ln[5:].lstrip(b" ") for ln in event.split(b"\n") if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def payloads(data: bytes) -> Iterator[bytes]:
    """The data of every event of ``data`` that has some (comments and events without data
    are skipped); an unterminated last event counts too."""
    text = data.replace(b"\r\n", b"\n") if b"\r" in data else data
    for event in text.split(b"\n\n"):
        found = payload(event)
        if found is not None:
            yield found


def json_events(data: bytes) -> Iterator[dict[str, Any]]:
    """The JSON objects of the events of ``data``; ``[DONE]`` and malformed events are
    skipped."""
    for found in payloads(data):
        if is_done(found):
            continue
        try:
            obj = orjson.loads(found)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            yield obj


def first_event_is_json(first_chunk: bytes) -> bool:
    """The first complete event's data is JSON or [DONE] (True while none is complete).

    Only the events up to the first one with data are read: an upstream that answers at
    once can put a whole long answer in the first chunk.
    """
    text = first_chunk.replace(b"\r\n", b"\n") if b"\r" in first_chunk else first_chunk
    start = 0
    while (end := text.find(b"\n\n", start)) >= 0:
        found = payload(text[start:end])
        start = end + 2
        if found is None:
            continue  # a comment or an event without data
        if found.strip() == DONE:
            return True
        try:
            orjson.loads(found)
        except orjson.JSONDecodeError:
            return False
        return True
    return True


def has_done_line(events: bytes) -> bool:
    """A ``data: [DONE]`` line among these events (``DONE_LINE``).

    The search starts just before the first ``[DONE]``: from the start of a whole stream's
    bytes the pattern's leading alternation is tried at every position, which costs more
    than the rest of the relay loop. A match cannot start earlier than 7 bytes before its
    ``[DONE]`` (``\\ndata: ``), and ``^`` still matches only at the real start of
    ``events``, so the answer is the same.
    """
    first = events.find(b"[DONE]")
    return first >= 0 and DONE_LINE.search(events, max(0, first - 7)) is not None


def done_tail(events: bytes) -> bytes | None:
    """What follows the first ``data: [DONE]`` line's event among these events (``b""``: it
    ends them), None without one. The usual stream's last read ends with its only ``[DONE]``
    and is answered without a regular expression."""
    first = events.find(DONE)
    if first < 0:
        return None
    if (
        first == len(events) - 8
        and events.endswith(DONE_EVENT)
        and (first == 6 or events[first - 7] == 0x0A)  # "data: " at a line start
    ):
        return b""
    if DONE_LINE.search(events, max(0, first - 7)) is None:
        return None
    return through_done(events)[1]


def through_done(events: bytes) -> tuple[bytes, bytes]:
    """``(the events up to and including the first data: [DONE] event, what follows it)``;
    ``(events, b"")`` when no whole ``[DONE]`` event is among them. Nothing an upstream sends
    after its end reaches a client."""
    first = events.find(DONE)
    found = DONE_LINE.search(events, max(0, first - 7)) if first >= 0 else None
    if found is None:
        return events, b""
    line_end = found.end() - 1  # the LF that ends the [DONE] line
    if line_end < 0 or events[line_end : line_end + 1] != b"\n":
        return events, b""  # the line has no end yet: the event is not whole
    ends = [i + n for sep, n in _EVENT_ENDS if (i := events.find(sep, line_end)) >= 0]
    if not ends:
        return events, b""
    end = min(ends)
    return events[:end], events[end:]


def only_done_after(rest: bytes) -> bool:
    """What followed a stream's ``[DONE]`` is blank, comments or repeated ``[DONE]`` events
    (some servers send it twice): nothing that says the upstream misbehaved."""
    return all(is_done(p) for p in payloads(rest)) and all(
        not line.strip() or line.startswith(b":") or line.startswith(b"data:")
        for line in rest.splitlines()
    )


# --- a client's reading, line by line -----------------------------------------------------


async def read_payloads(lines: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The data of each event of a stream read line by line (aiohttp's ``resp.content``
    iterates so), as each event ends; an unterminated last event at the end of the stream
    counts too."""
    data: list[bytes] = []
    async for raw in lines:
        line = raw.rstrip(b"\r\n")
        if not line:
            if data:
                yield b"\n".join(data)
                data = []
        elif line.startswith(b"data:"):
            data.append(line[5:].lstrip(b" "))
    if data:
        yield b"\n".join(data)


# --- the end of a relayed stream ----------------------------------------------------------


def tail_payloads(buf: bytes | bytearray, want: int) -> list[bytes]:
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
        found = [p for p in map(payload, events) if p is not None]
        if whole or len(found) >= want:
            return found[-want:]
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
        tail = tail_payloads(self._buf, count + 2)
        done = any(p.strip() == DONE for p in tail[-2:])
        data = [p for p in tail if p.strip() != DONE]
        for found in data[-count:]:
            try:
                obj = orjson.loads(found)
            except orjson.JSONDecodeError:
                bad += 1
                continue
            if isinstance(obj, dict):
                events.append(obj)
            else:
                bad += 1
        return events, bad, done
