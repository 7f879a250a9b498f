"""One upstream HTTP/1.1 answer parsed from its bytes: pure, no I/O.

Parsing is llhttp's (through ``httptools``, as uvicorn does): status line, headers,
Content-Length and chunked framing, and what HTTP/1.1 forbids (both Content-Length and
Transfer-Encoding, duplicate lengths, bad digits, bad chunk sizes). This module feeds it
and adds what a client reading a stranger's answers must bound on top: the head's size,
interim answers, trailers, versions and statuses it cannot use, and whether the connection
may carry another request afterwards (only when the answer ended exactly where its framing
said and nothing followed it).
"""

from __future__ import annotations

from typing import TypeVar, overload

import httptools

MAX_HEAD = 64 * 1024  # status lines and headers of an answer, interim ones included
MAX_HEADERS = 256
MAX_TRAILER = 16 * 1024
MAX_INTERIM = 8  # 1xx answers before the real one (speclane never asks for any)


class ProtocolViolation(Exception):
    """The answer breaks HTTP/1.1 or one of the bounds above."""


class _Stray(Exception):
    """Bytes after the end of the answer: they belong to no request."""


_T = TypeVar("_T")


class Headers(dict[str, str]):
    """Response headers by lower-cased name (repeated ones joined with ", ")."""

    @overload
    def get(self, key: str, default: None = None, /) -> str | None: ...
    @overload
    def get(self, key: str, default: str, /) -> str: ...
    @overload
    def get(self, key: str, default: _T, /) -> str | _T: ...

    def get(self, key: str, default: object = None, /) -> object:
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())


class ResponseParser:
    """Incremental parser of one answer: ``feed`` returns the body bytes decoded so far.

    ``stalled`` says whether the last ``feed`` made no progress (head or trailer bytes,
    framing without data): the caller puts a deadline on that. ``keep_alive`` is true only
    for an answer that allows reuse, ended where its framing said, and had nothing after it.
    """

    __slots__ = (
        "_head_size",
        "_header_count",
        "_in_head",
        "_max_head",
        "_max_interim",
        "_max_trailer",
        "_p",
        "_pieces",
        "_progress",
        "_stall_bytes",
        "_trailer_size",
        "done",
        "head_done",
        "headers",
        "interim",
        "keep_alive",
        "stalled",
        "status",
        "stray",
        "until_close",
        "version",
    )

    def __init__(
        self,
        *,
        max_head: int = MAX_HEAD,
        max_trailer: int = MAX_TRAILER,
        max_interim: int = MAX_INTERIM,
    ) -> None:
        self._p: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        # "5 \r\n" (spaces before a chunk extension, RFC 9112 BWS) is read; every other
        # leniency stays off.
        self._p.set_dangerous_leniencies(lenient_spaces_after_chunk_size=True)
        self._pieces: list[bytes] = []
        self._progress = 0
        self._in_head = True
        self._head_size = self._header_count = self._trailer_size = self._stall_bytes = 0
        self._max_head, self._max_trailer, self._max_interim = max_head, max_trailer, max_interim
        self.status = 0
        self.version = ""
        self.headers = Headers()
        self.keep_alive = False
        self.head_done = False
        self.done = False
        self.interim = 0
        self.until_close = False  # no length, no chunks: the body ends when the socket does
        self.stalled = False
        self.stray = False  # bytes came after the end of the answer

    def feed(self, data: bytes) -> list[bytes]:
        if self.done:
            if data:  # a later read after the end: not ours, and the connection is spoilt
                self.keep_alive = False
                self.stray = True
            return []
        pieces = self._pieces = []
        progress = self._progress
        if self._p is None:
            raise ProtocolViolation("the answer was already released")
        try:
            self._p.feed_data(data)
        except httptools.HttpParserError as e:
            cause = e.__context__
            if isinstance(cause, _Stray) or self.done:
                self.keep_alive = False  # the answer is whole; what followed it is dropped
                self.stray = True
            elif isinstance(cause, ProtocolViolation):
                raise cause from None
            else:
                raise ProtocolViolation(str(e) or type(e).__name__) from None
        if self._progress == progress and not self.done:
            self._stall_bytes += len(data)
            self.stalled = True
            # llhttp keeps a header or trailer line that has not ended in memory: bound it.
            if self._stall_bytes > self._max_head:
                raise ProtocolViolation(
                    f"more than {self._max_head} bytes of head, trailers or framing without data"
                )
        else:
            self._stall_bytes = 0
            self.stalled = False
        return pieces

    def release(self) -> None:
        """Drop llhttp, which holds this object's callbacks: the reference cycle between
        them would otherwise keep every answer's parser alive until a full collection."""
        self._p = None

    def feed_eof(self) -> None:
        """The connection closed: fine only for a body read until close."""
        if self.done:
            return
        if self.head_done and self.until_close:
            self.done = True
            return
        raise ProtocolViolation("connection closed before the answer was complete")

    # --- llhttp callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.done:
            raise _Stray()

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value) + 4
        if not self._in_head:
            self._trailer_size += size
            if self._trailer_size > self._max_trailer:
                raise ProtocolViolation(f"trailers over {self._max_trailer} bytes")
            return  # trailers are read and dropped: nothing downstream uses them
        self._head_size += size
        self._header_count += 1
        if self._head_size > self._max_head or self._header_count > MAX_HEADERS:
            raise ProtocolViolation(
                f"response head over {self._max_head} bytes or {MAX_HEADERS} headers"
            )
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1").strip()
        prev = dict.get(self.headers, key)
        dict.__setitem__(self.headers, key, text if prev is None else f"{prev}, {text}")

    def on_headers_complete(self) -> None:
        p = self._p
        assert p is not None  # called by it
        status = p.get_status_code()
        version = p.get_http_version()
        if version not in ("1.1", "1.0"):
            raise ProtocolViolation(f"HTTP version {version!r} in an HTTP/1.1 answer")
        if not 100 <= status <= 599:
            raise ProtocolViolation(f"status {status} is outside 100-599")
        if status < 200:
            if status == 101:
                raise ProtocolViolation("101 Switching Protocols, which speclane never asks for")
            self.interim += 1
            if self.interim > self._max_interim:
                raise ProtocolViolation(f"more than {self._max_interim} interim (1xx) answers")
            self.headers = Headers()  # an interim answer's headers are not the answer's
            self._header_count = 0
            return
        self._in_head = False
        self.status, self.version = status, version
        self.head_done = True
        self._progress += 1
        headers = self.headers
        te = dict.get(headers, "transfer-encoding")
        keep_alive = p.should_keep_alive()  # (llhttp forgets it once the answer is complete)
        if te is not None:
            # llhttp takes any final "chunked" coding; speclane decodes no transfer coding
            # but chunked itself, and "xchunked" is not chunked.
            if te.lower() != "chunked":
                raise ProtocolViolation(f"unsupported transfer-encoding {te[:40]!r}")
            if version == "1.0":  # RFC 9112 6.1: chunked in HTTP/1.0 is a framing fault
                keep_alive = False
        elif status not in (204, 304) and "content-length" not in headers:
            self.until_close = True
            keep_alive = False
        self.keep_alive = keep_alive

    def on_body(self, body: bytes) -> None:
        self._pieces.append(body)
        self._progress += 1

    def on_message_complete(self) -> None:
        if self._in_head:
            return  # the end of an interim answer: the real one follows
        self.done = True
        self._progress += 1


__all__ = [
    "MAX_HEAD",
    "MAX_INTERIM",
    "MAX_TRAILER",
    "Headers",
    "ProtocolViolation",
    "ResponseParser",
]
