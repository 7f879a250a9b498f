"""A lean HTTP/1.1 client for the relay's hot path: one POST out, its answer read back.

Why not aiohttp's client here: per request it builds a ClientRequest, a ClientResponse,
trace and cookie machinery and a timeout context, and per relayed chunk it runs a
StreamReader (flow control, chunk bookkeeping, joins). On the relay path that was most
of what speclane itself cost per stream (``speclane bench overhead``). This client does
only what the relay needs: keep-alive connections per (scheme, host, port), one request
written in one call, status and headers parsed once, the body decoded (Content-Length,
chunked, or until close) straight from ``data_received`` into a list the relay drains.
aiohttp's client stays for health checks and scraping, where none of this matters.

Errors: every failure to connect or to read is an ``UpstreamConnectionError`` (a
``ConnectionError``), silence longer than the read timeout is ``TimeoutError``: the two
the relay tells apart.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import ne
from typing import Any, cast
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024  # status line and headers
MAX_LINE = 8 * 1024  # a chunk-size or trailer line
PAUSE_AT = 1 << 20  # unread body bytes that pause reading from the socket


class UpstreamConnectionError(ConnectionError):
    """Could not connect, the connection closed early, or the upstream broke HTTP/1.1."""


class Headers(dict[str, str]):
    """Response headers by lower-cased name (repeated ones joined with ", ")."""

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str
    port: int

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


@functools.lru_cache(maxsize=1024)  # the relay asks for the same few URLs on every request
def split_url(url: str) -> tuple[Origin, str]:
    """``(origin, request target)`` of an http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return Origin(parts.scheme, parts.hostname, port), target


# --- body decoding (pure: bytes in, body pieces out) ------------------------------------

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


class ProtocolViolation(Exception):
    pass


_HEX = b"0123456789abcdefABCDEF"


# Size lines already read, by their bytes: a stream's events have a few lengths, and a
# dict look-up costs a fifth of parsing the hex again. Only short lines of plain hex
# digits get in, and only so many: an upstream can't make it grow without bound.
_SIZES: dict[bytes, int] = {}
_SIZES_MAX = 4096
_SIZE_KEY_MAX = 8


def _plain_size(piece: bytes) -> int | None:
    """The value of a size line that is only hex digits (remembered), else None."""
    if not piece or piece.translate(None, _HEX):
        return None
    value = int(piece, 16)
    if len(piece) <= _SIZE_KEY_MAX and len(_SIZES) < _SIZES_MAX:
        _SIZES[piece] = value
    return value


def _chunk_size(line: bytes) -> int:
    """A chunk-size line's size: hex digits only (RFC 9112 ``1*HEXDIG``), then optional
    whitespace and extensions. ``int(x, 16)`` alone would also take ``0x1f``, ``+1f``,
    ``1_f`` or leading spaces: forms no server sends and a framing check must not guess at.
    """
    size = _plain_size(line.split(b";", 1)[0].rstrip(b" \t"))
    if size is None:
        raise ProtocolViolation(f"bad chunk size {line[:20]!r}")
    return size


def _split_chunks(buf: bytes, pos: int) -> tuple[bytes, int] | None:
    """The usual read decoded with C loops instead of a Python loop per chunk: the
    complete chunks from ``pos`` on, up to the first one that is cut by the end of the
    read, carries CRLF in its data or an extension on its size, or is the last chunk.
    Returns ``(their data joined, where decoding goes on)``, or None when not even the
    first chunk qualifies; the chunk-by-chunk loop reads (and judges) whatever is left.

    Why it is sound: split at every CRLF, the pieces alternate size line, data. While each
    size matches the length of the piece after it, that piece is exactly the chunk's data
    (it holds no CRLF and a CRLF follows it), so the next pair starts at the next chunk. The
    first chunk whose data holds a CRLF is compared with the part before that CRLF, which
    is shorter: the run of accepted chunks stops there.
    """
    parts = (buf[pos:] if pos else buf).split(b"\r\n")
    pairs = (len(parts) - 1) // 2  # pairs whose data piece is followed by a CRLF
    datas = parts[1:2 * pairs:2]
    lengths = list(map(len, datas))
    if 0 in lengths:  # the last chunk (or a misread): only a chunk's data is never empty
        pairs = lengths.index(0)
        del datas[pairs:], lengths[pairs:]
    if not pairs:
        return None
    sizes = parts[0:2 * pairs:2]
    values = list(map(_SIZES.get, sizes))
    if None in values:
        values = [_plain_size(s) if v is None else v for s, v in zip(sizes, values, strict=True)]
    if values != lengths:
        pairs = list(map(ne, values, lengths)).index(True)
        if not pairs:
            return None
        del datas[pairs:]
    rest = parts[2 * pairs:]  # what follows the CRLF after the last chunk taken
    end = len(buf) if len(rest) == 1 and not rest[0] else (
        len(buf) - sum(map(len, rest)) - 2 * (len(rest) - 1))
    return b"".join(datas), end


@dataclass(slots=True)
class ResponseParser:
    """Incremental parser of one response: ``feed`` returns the body bytes decoded so far."""

    head_only: bool = False  # the request was HEAD: no body whatever the headers say
    state: int = _HEAD
    status: int = 0
    reason: str = ""
    version: str = ""
    headers: Headers = field(default_factory=Headers)
    remaining: int = 0
    keep_alive: bool = True
    _buf: bytes = b""

    @property
    def head_done(self) -> bool:
        return self.state != _HEAD

    @property
    def done(self) -> bool:
        return self.state == _DONE

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        pos = 0
        out: list[bytes] = []
        n = len(buf)
        # (A Content-Length of 0 ends the answer with no byte left to read.)
        while pos < n or (self.state == _LENGTH and self.remaining == 0):
            state = self.state
            if state == _CHUNK_SIZE:
                pos = self._whole_chunks(buf, pos, out)
                if pos >= n or self.state != _CHUNK_SIZE:
                    continue
                # what is left is a chunk that has not fully arrived: the general path
            if state == _CHUNK_DATA:
                take = min(self.remaining, n - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self.remaining -= take
                if self.remaining:
                    break
                self.state = _CHUNK_END
            elif state == _CHUNK_SIZE:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if n - pos > MAX_LINE:
                        raise ProtocolViolation("chunk size line too long")
                    break
                size = _chunk_size(buf[pos:end])
                pos = end + 2
                self.remaining = size
                self.state = _CHUNK_DATA if size else _TRAILERS
            elif state == _CHUNK_END:
                if n - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ProtocolViolation("chunk data not followed by CRLF")
                pos += 2
                self.state = _CHUNK_SIZE
            elif state == _LENGTH:
                if self.remaining == 0:
                    self.state = _DONE
                    continue
                take = min(self.remaining, n - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    self.state = _DONE
            elif state == _UNTIL_CLOSE:
                out.append(buf[pos:] if pos else buf)
                pos = n
            elif state == _TRAILERS:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if n - pos > MAX_LINE:
                        raise ProtocolViolation("trailer line too long")
                    break
                line_empty = end == pos
                pos = end + 2
                if line_empty:
                    self.state = _DONE
            elif state == _HEAD:
                end = buf.find(b"\r\n\r\n", pos)
                if end < 0:
                    if n - pos > MAX_HEAD:
                        raise ProtocolViolation("response head too large")
                    break
                self._parse_head(buf[pos:end])
                pos = end + 4
            else:  # _DONE: anything after the answer is not ours to read
                if pos < n:
                    self.keep_alive = False
                pos = n
        self._buf = buf[pos:] if pos < n else b""
        return out

    def _whole_chunks(self, buf: bytes, pos: int, out: list[bytes]) -> int:
        """Decode every complete chunk from ``pos`` on.

        Upstreams flush one chunk per token, so a read holds many small chunks: this is
        where a long stream's relay spends its time. ``_split_chunks`` takes the usual read
        whole; what it leaves (a chunk with CRLF in its data, an extension) goes through one
        tight loop over locals, without trying the shortcut again: that would split the
        rest of the read once more after every such chunk. It stops before a chunk that has
        not fully arrived, and at the last chunk (the general path reads the trailers).
        """
        taken = _split_chunks(buf, pos)
        if taken is not None:
            out.append(taken[0])
            pos = taken[1]
        find = buf.find
        n = len(buf)
        append = out.append
        while True:
            end = find(b"\r\n", pos)
            if end < 0 or end == pos:
                return pos
            size = _chunk_size(buf[pos:end])
            start = end + 2
            stop = start + size
            if size == 0 or stop + 2 > n:
                return pos  # the last chunk, or one still arriving
            if buf[stop:stop + 2] != b"\r\n":
                raise ProtocolViolation("chunk data not followed by CRLF")
            append(buf[start:stop])
            pos = stop + 2

    def feed_eof(self) -> None:
        """The connection closed: fine only for a body read until close."""
        if self.state == _UNTIL_CLOSE:
            self.state = _DONE
        elif self.state != _DONE:
            raise ProtocolViolation("connection closed before the answer was complete")

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0].decode("latin-1")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolViolation(f"bad status line {status_line[:60]!r}")
        status = int(parts[1])
        headers = Headers()
        for raw in lines[1:]:
            name, sep, value = raw.decode("latin-1").partition(":")
            if not sep or not name or name != name.strip():
                raise ProtocolViolation(f"bad header line {raw[:60]!r}")
            key = name.lower()
            value = value.strip()
            prev = dict.get(headers, key)
            dict.__setitem__(headers, key, value if prev is None else f"{prev}, {value}")
        if 100 <= status < 200:
            return  # an interim answer (100 Continue, 103 Early Hints): the real one follows
        self.status, self.version = status, parts[0]
        self.reason = parts[2] if len(parts) > 2 else ""
        self.headers = headers
        connection = headers.get("connection", "").lower()
        self.keep_alive = (parts[0] == "HTTP/1.1" and "close" not in connection) or (
            parts[0] == "HTTP/1.0" and "keep-alive" in connection)
        te = headers.get("transfer-encoding", "").lower()
        if self.head_only or status in (204, 304):
            self.state = _DONE
        elif te:
            if not te.endswith("chunked"):
                raise ProtocolViolation(f"unsupported transfer-encoding {te!r}")
            self.state = _CHUNK_SIZE
        elif (length := headers.get("content-length")) is not None:
            if not length.isdigit():
                raise ProtocolViolation(f"bad content-length {length[:20]!r}")
            self.remaining = int(length)
            self.state = _LENGTH
        else:
            self.state = _UNTIL_CLOSE
            self.keep_alive = False


# --- connections ------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One socket; carries one request at a time."""

    def __init__(self, open_set: set[_Connection]) -> None:
        self._open_set = open_set  # the pool's: a connection leaves it when it closes
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.used = False  # has carried a request before (may be stale when reused)
        self._response: Response | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)
        self._open_set.add(self)

    def data_received(self, data: bytes) -> None:
        if self._response is None:
            self.close()  # bytes nobody asked for: the connection can't be trusted
            return
        self._response._data(data)

    def eof_received(self) -> bool:
        return False  # close the transport: HTTP/1.1 has no half-closed use here

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._open_set.discard(self)
        if self._response is not None:
            self._response._lost(exc)

    def pause_writing(self) -> None:  # request bodies are small; nothing to pace
        pass

    def resume_writing(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Response:
    """An upstream answer: ``status``, ``headers``, then ``readany()``/``read()`` its body.

    ``close()`` gives the connection back when the body was read whole, and otherwise
    aborts it, which is what tells the upstream to stop generating.
    """

    def __init__(self, pool: Http1Pool, origin: Origin, conn: _Connection,
                 read_timeout: float | None, head_only: bool = False) -> None:
        self._pool = pool
        self._origin = origin
        self._conn: _Connection | None = conn
        self._read_timeout = read_timeout
        self._parser = ResponseParser(head_only=head_only)
        self._body: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._encoding: str | None = None  # Content-Encoding, read once the head is in
        self._decoder: Any = None  # a zlib decompressor for gzip/deflate answers
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._quiet_since = 0.0  # loop time the current wait began
        self._timer: asyncio.TimerHandle | None = None  # checks the current wait's silence
        self.got_bytes = False

    # what the relay reads
    @property
    def status(self) -> int:
        return self._parser.status

    @property
    def headers(self) -> Headers:
        return self._parser.headers

    @property
    def complete(self) -> bool:
        return self._parser.done and not self._body

    async def readany(self) -> bytes:
        """Body bytes as they come (b"" at the end of the body)."""
        while not self._body:
            if self._error is not None:
                raise self._error
            if self._parser.done:
                self._release()
                return b""
            await self._wait()
        data = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body.clear()
        self._buffered = 0
        if (self._paused and self._conn is not None and self._conn.transport is not None
                and not self._conn.closed):
            self._paused = False
            self._conn.transport.resume_reading()
        if self._parser.done:
            self._release()
        return data

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body (or its first ``limit`` bytes; then the connection is dropped)."""
        parts: list[bytes] = []
        size = 0
        while chunk := await self.readany():
            parts.append(chunk)
            size += len(chunk)
            if limit is not None and size >= limit:
                self.close()
                return b"".join(parts)[:limit]
        return b"".join(parts)

    def close(self) -> None:
        self._stop_timer()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn._response = None
        if self._parser.done and self._parser.keep_alive and not conn.closed:
            self._pool._give_back(self._origin, conn)
        else:
            conn.abort()
        if self._error is None and not self._parser.done:
            self._error = UpstreamConnectionError("the upstream answer was closed")
        self._wake()

    # internals
    async def _start(self) -> None:
        """Wait for the status and headers."""
        while True:
            if self._error is not None:
                raise self._error
            if self._parser.head_done:
                return
            await self._wait()

    def _release(self) -> None:
        if self._conn is not None:
            self.close()

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        if self._read_timeout is not None:
            # One timer per answer, moved on only when it fires during a later wait: arming
            # and cancelling a timer for every wait (every relayed read of a stream) cost
            # more than the rest of a read's bookkeeping.
            self._quiet_since = loop.time()
            if self._timer is None:
                self._timer = loop.call_at(self._quiet_since + self._read_timeout,
                                           self._check_silence)
        try:
            await waiter
        finally:
            self._waiter = None

    def _check_silence(self) -> None:
        """A wait that has lasted the read timeout fails with TimeoutError."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody is waiting: the next wait arms the timer again
        assert self._read_timeout is not None  # the timer is only armed with one
        due = self._quiet_since + self._read_timeout
        loop = waiter.get_loop()
        if loop.time() >= due:
            waiter.set_exception(TimeoutError())
        else:  # this wait began after the timer was armed: check again at its own end
            self._timer = loop.call_at(due, self._check_silence)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _data(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            pieces = self._parser.feed(data)
            if self._encoding is None and self._parser.head_done:
                self._start_decoding()
            if self._decoder is not None:
                pieces = self._decode(pieces)
        except ProtocolViolation as e:
            self._fail(UpstreamConnectionError(f"invalid HTTP/1.1 answer: {e}"))
            return
        # One piece per read, however many chunks it held: the relay takes them all at once.
        piece = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if piece:
            self._body.append(piece)
            self._buffered += len(piece)
        if (self._buffered > PAUSE_AT and not self._paused and self._conn is not None
                and self._conn.transport is not None):
            self._paused = True  # nobody is reading: stop taking bytes from the socket
            self._conn.transport.pause_reading()
        self._wake()

    def _start_decoding(self) -> None:
        """speclane asks for identity encoding; a server (or a proxy in front of it) that
        compresses anyway is decoded here rather than relayed as bytes no client expects."""
        self._encoding = (self._parser.headers.get("content-encoding") or "identity").lower()
        if self._encoding in ("gzip", "x-gzip", "deflate"):
            self._decoder = zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
        elif self._encoding != "identity":
            raise ProtocolViolation(f"unsupported content-encoding {self._encoding!r}")

    def _decode(self, pieces: list[bytes]) -> list[bytes]:
        try:
            out = [self._decoder.decompress(p) for p in pieces]
            if self._parser.done:
                out.append(self._decoder.flush())
        except zlib.error as e:
            raise ProtocolViolation(f"{self._encoding} body does not decode: {e}") from None
        return out

    def _lost(self, exc: Exception | None) -> None:
        try:
            self._parser.feed_eof()
        except ProtocolViolation as e:
            detail = f": {exc}" if exc else ""
            self._error = UpstreamConnectionError(f"upstream closed the connection ({e}){detail}")
        if self._conn is not None:
            self._conn._response = None
            self._conn = None
        self._stop_timer()  # no wait follows: the answer has ended or failed
        self._wake()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._stop_timer()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn._response = None
            conn.abort()
        self._wake()


class Http1Pool:
    """Keep-alive connections per origin; ``post`` sends one request on one of them."""

    def __init__(self, *, keepalive: float = 30.0, max_idle: int = 256,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._keepalive = keepalive
        self._max_idle = max_idle
        self._idle: dict[Origin, list[_Connection]] = {}
        self._ssl = ssl_context
        self._open: set[_Connection] = set()

    async def request(self, method: str, url: str, *, body: bytes = b"",
                      headers: Mapping[str, str] | None = None,
                      connect_timeout: float | None = None,
                      read_timeout: float | None = None) -> Response:
        """Send the request and return once the answer's status and headers arrived."""
        origin, target = split_url(url)
        head = _request_head(method, target, origin, headers or {}, len(body))
        payload = head + body
        for reused in (True, False):
            conn = self._checkout(origin) if reused else None
            if conn is None:
                reused = False
                conn = await self._connect(origin, connect_timeout)
            resp = Response(self, origin, conn, read_timeout, head_only=method == "HEAD")
            conn._response = resp
            conn.used = True
            assert conn.transport is not None
            conn.transport.write(payload)
            try:
                await resp._start()
                return resp
            except UpstreamConnectionError:
                resp.close()
                # A kept-alive connection the server closed meanwhile fails before any byte
                # of an answer: the request never ran, so sending it again is safe.
                if reused and not resp.got_bytes:
                    continue
                raise
            except BaseException:
                resp.close()
                raise
        raise AssertionError("unreachable: the fresh connection either answered or raised")

    def _checkout(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self._keepalive:
                return conn
            conn.close()
        return None

    def _give_back(self, origin: Origin, conn: _Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        if len(idle) >= self._max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def _connect(self, origin: Origin, connect_timeout: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        ssl_arg: ssl.SSLContext | None = None
        if origin.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ssl_arg = self._ssl
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self._open), origin.host, origin.port, ssl=ssl_arg)
        except TimeoutError:
            # Nothing was sent: as safe to try elsewhere as a refused connection.
            raise UpstreamConnectionError(f"cannot connect to {origin.host}:{origin.port} "
                                          f"within {connect_timeout:g}s") from None
        except (OSError, ssl.SSLError) as e:
            raise UpstreamConnectionError(
                f"cannot connect to {origin.host}:{origin.port}: {e.strerror or e}"
                if isinstance(e, OSError) else f"TLS to {origin.host}:{origin.port} failed: {e}"
            ) from e
        return conn

    async def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
        for conn in list(self._open):
            conn.abort()
        await asyncio.sleep(0)  # let the transports run their close callbacks


def _request_head(method: str, target: str, origin: Origin, headers: Mapping[str, str],
                  length: int) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {origin.host_header}",
             f"Content-Length: {length}", "Accept-Encoding: identity"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} contains a line break")
        if name.lower() not in ("host", "content-length", "accept-encoding", "connection",
                                "transfer-encoding"):
            lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


__all__ = ["Headers", "Http1Pool", "Response", "ResponseParser", "UpstreamConnectionError",
           "split_url"]
