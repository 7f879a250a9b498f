"""A lean HTTP/1.1 client for the relay's hot path: one POST out, its answer read back.

Why not aiohttp's client here: per request it builds a ClientRequest, a ClientResponse,
trace and cookie machinery and a timeout context, and per relayed chunk it runs a
StreamReader (flow control, chunk bookkeeping, joins). On the relay path that was most
of what speclane itself cost per stream (``speclane bench overhead``). This client does
only what the relay needs: keep-alive connections per (scheme, host, port), one request
written in one call, and the answer parsed by llhttp (``router.upstream.http_response``)
straight from ``data_received`` into a list the relay drains, the way uvicorn drives it.
aiohttp's client stays for health checks and scraping, where none of this matters.

Every upstream is a stranger: an answer's head must arrive within ``head_timeout`` of its
first byte (interim answers and trailers are counted and bounded), its decoded body is at
most ``max_body`` bytes (gzip is inflated piece by piece against that bound), and a
connection goes back to the pool only when its answer ended exactly where its framing said,
nothing is left to read on it, and reading was never paused.

Errors: a failure to connect or a connection that breaks is an ``UpstreamConnectionError``
(a ``ConnectionError``); an answer that breaks HTTP/1.1 or a bound is its subclass
``UpstreamProtocolError`` (not worth retrying: the upstream ran the request and answered
badly); silence longer than the read timeout, or a head slower than ``head_timeout``, is
``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import select
import ssl
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple, cast
from urllib.parse import urlsplit

from router.upstream.http_response import Headers, ProtocolViolation, ResponseParser

log = logging.getLogger("speclane.upstream")

PAUSE_AT = 1 << 20  # unread body bytes that pause reading from the socket
DEFAULT_MAX_BODY = 64 * 1024 * 1024  # decoded body bytes of one answer
DEFAULT_HEAD_TIMEOUT = 30.0  # from an answer's first byte to the end of its head

StillWorking = Callable[[], Awaitable[bool]]


class UpstreamConnectionError(ConnectionError):
    """Could not connect, the connection closed early, or the upstream broke HTTP/1.1."""


class UpstreamProtocolError(UpstreamConnectionError):
    """The upstream answered, but not in valid HTTP/1.1 or beyond a bound: the request ran,
    so this is not retried as a connection failure."""


class UpstreamTooLarge(UpstreamProtocolError):
    """The answer's decoded body is larger than ``max_body``."""


class HeadTimeout(TimeoutError):
    """The answer's head began but did not end within ``head_timeout``."""


class Origin(NamedTuple):  # a tuple: hashed in C, as the pool's keys are on every request
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


# --- connections ------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One socket; carries one request at a time."""

    def __init__(self, open_set: set[_Connection], on_stray: Callable[[], None]) -> None:
        self._open_set = open_set  # the pool's: a connection leaves it when it closes
        self.on_stray = on_stray  # bytes came that belong to no answer
        self.transport: asyncio.Transport | None = None
        self._poll: select.poll | None = None  # asks the socket whether bytes wait on it
        self.tls = False
        self.closed = False
        self.idle_since = 0.0
        self.used = False  # has carried a request before (may be stale when reused)
        self._response: Response | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        # Under TLS the socket's bytes are records (a session ticket may come at any time),
        # not answers; stray plaintext still reaches data_received, which closes.
        self.tls = transport.get_extra_info("sslcontext") is not None
        if sock is not None and not self.tls:
            self._poll = select.poll()
            self._poll.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        self._open_set.add(self)

    def data_received(self, data: bytes) -> None:
        if self._response is None:
            self.abort()  # bytes nobody asked for: the connection can't be trusted
            self.on_stray()
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

    def reusable(self) -> bool:
        """Open, and nothing (bytes, EOF, an error) waiting to be read on its socket: the
        check at check-out and at return. When the socket can't be asked, it is not."""
        if self.closed:
            return False
        if self.tls:
            return True
        try:
            return self._poll is not None and not self._poll.poll(0)
        except (OSError, ValueError):
            return False

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

    ``close()`` gives the connection back when the body was read whole and the connection
    is clean, and otherwise aborts it, which is what tells the upstream to stop generating.
    """

    def __init__(
        self,
        pool: Http1Pool,
        origin: Origin,
        conn: _Connection,
        read_timeout: float | None,
        still_working: StillWorking | None = None,
    ) -> None:
        self._pool = pool
        self._origin = origin
        self._conn: _Connection | None = conn
        self._read_timeout = read_timeout
        self._still_working = still_working
        self._parser = ResponseParser(max_trailer=pool.max_trailer)
        self._body: list[bytes] = []
        self._buffered = 0
        self._size = 0  # decoded body bytes so far
        self._paused = False
        self._spoilt = False  # reading was paused at some point: never pooled
        self._returned: _Connection | None = None  # given back to the pool by close()
        self._encoding: str | None = None  # Content-Encoding, read once the head is in
        self._decoder: Any = None  # a zlib decompressor for gzip/deflate answers
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._quiet_since = 0.0  # loop time the current wait began
        # checks the current wait's silence (a task while still_working is being asked)
        self._timer: asyncio.TimerHandle | asyncio.Task[None] | None = None
        self._stall_since: float | None = None  # first byte of a head (or trailers) not done
        self._stall_timer: asyncio.TimerHandle | None = None
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
        if (
            self._paused
            and self._conn is not None
            and self._conn.transport is not None
            and not self._conn.closed
        ):
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

    def discard(self) -> None:
        """Close without pooling the connection (what came on it was not right), and take it
        back out of the pool if the end of the body already gave it back and nobody has
        taken it since (its framing was clean, so a request already on it is safe)."""
        self._spoilt = True
        if self._conn is not None:
            self.close()
        elif self._returned is not None:
            self._pool._take_back(self._origin, self._returned)
            self._returned = None

    def close(self) -> None:
        self._stop_timers()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._parser.release()
        conn._response = None
        parser = self._parser
        if parser.stray:
            conn.on_stray()
        if (
            parser.done
            and parser.keep_alive
            and not self._spoilt
            and self._error is None
            and conn.reusable()
        ):
            self._pool._give_back(self._origin, conn)
            self._returned = conn
        else:
            conn.abort()
        if self._error is None and not parser.done:
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
                self._timer = loop.call_at(
                    self._quiet_since + self._read_timeout, self._check_silence
                )
        try:
            await waiter
        finally:
            self._waiter = None

    def _check_silence(self) -> None:
        """A wait that has lasted the read timeout fails with TimeoutError, unless the
        ``still_working`` callback says the upstream is busy on it: then it waits again."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody is waiting: the next wait arms the timer again
        assert self._read_timeout is not None  # the timer is only armed with one
        due = self._quiet_since + self._read_timeout
        loop = waiter.get_loop()
        if loop.time() < due:  # this wait began after the timer was armed: check at its end
            self._timer = loop.call_at(due, self._check_silence)
        elif self._still_working is None:
            waiter.set_exception(TimeoutError())
        else:
            self._timer = loop.create_task(self._ask_still_working(waiter))

    async def _ask_still_working(self, waiter: asyncio.Future[None]) -> None:
        assert self._still_working is not None and self._read_timeout is not None
        try:
            async with asyncio.timeout(self._read_timeout):
                working = bool(await self._still_working())
        except asyncio.CancelledError:
            raise
        except Exception:  # a callback that fails or hangs does not keep a silent upstream
            working = False
        self._timer = None
        if waiter is not self._waiter or waiter.done():
            return  # bytes came (or the answer ended) while asking
        loop = waiter.get_loop()
        if working:
            self._quiet_since = loop.time()
            self._timer = loop.call_at(self._quiet_since + self._read_timeout, self._check_silence)
        else:
            waiter.set_exception(TimeoutError())

    def _check_stall(self) -> None:
        """A head (or trailers, or framing without data) still unfinished ``head_timeout``
        after its first byte ends the answer: trickled bytes do not keep it alive."""
        self._stall_timer = None
        if self._stall_since is None or self._conn is None:
            return
        due = self._stall_since + self._pool.head_timeout
        loop = asyncio.get_running_loop()
        if loop.time() < due:
            self._stall_timer = loop.call_at(due, self._check_stall)
            return
        what = "head" if not self._parser.head_done else "trailers or chunk framing"
        self._fail(
            HeadTimeout(
                f"the upstream's {what} did not end within "
                f"{self._pool.head_timeout:g}s of its first byte"
            )
        )

    def _stop_timers(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _data(self, data: bytes) -> None:
        self.got_bytes = True
        parser = self._parser
        try:
            pieces = parser.feed(data)
            if self._encoding is None and parser.head_done:
                self._start_decoding()
            if self._decoder is not None:
                pieces = self._decode(pieces)
        except ProtocolViolation as e:
            self._fail(UpstreamProtocolError(f"invalid HTTP/1.1 answer: {e}"))
            return
        except UpstreamProtocolError as e:
            self._fail(e)
            return
        if parser.stalled:
            if self._stall_since is None:
                loop = asyncio.get_running_loop()
                self._stall_since = loop.time()
                if self._stall_timer is None:
                    self._stall_timer = loop.call_at(
                        self._stall_since + self._pool.head_timeout, self._check_stall
                    )
        elif self._stall_since is not None:
            self._stall_since = None
        # One piece per read, however many chunks it held: the relay takes them all at once.
        piece = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if piece:
            self._size += len(piece)
            if self._size > self._pool.max_body:
                self._fail(self._too_large())
                return
            self._body.append(piece)
            self._buffered += len(piece)
        if (
            self._buffered > PAUSE_AT
            and not self._paused
            and self._conn is not None
            and self._conn.transport is not None
        ):
            self._paused = self._spoilt = True  # nobody is reading: stop taking bytes
            self._conn.transport.pause_reading()
        self._wake()

    def _too_large(self) -> UpstreamTooLarge:
        return UpstreamTooLarge(
            f"the upstream's answer is larger than {self._pool.max_body} "
            "bytes decoded (upstream.max_body_bytes)"
        )

    def _start_decoding(self) -> None:
        """speclane asks for identity encoding; a server (or a proxy in front of it) that
        compresses anyway is decoded here rather than relayed as bytes no client expects."""
        self._encoding = (self._parser.headers.get("content-encoding") or "identity").lower()
        if self._encoding in ("gzip", "x-gzip", "deflate"):
            self._decoder = zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
        elif self._encoding != "identity":
            raise ProtocolViolation(f"unsupported content-encoding {self._encoding!r}")

    def _decode(self, pieces: list[bytes]) -> list[bytes]:
        """Inflate piece by piece, never more than the body bound allows: a small bomb
        stops at ``max_body`` decoded bytes instead of filling memory first."""
        decoder = self._decoder
        budget = self._pool.max_body - self._size + 1  # one byte over is what tells
        out: list[bytes] = []
        try:
            for piece in pieces:
                data = piece
                while data and budget > 0:
                    got = decoder.decompress(data, budget)
                    out.append(got)
                    budget -= len(got)
                    data = decoder.unconsumed_tail
            if self._parser.done and budget > 0:
                out.append(decoder.flush(budget))
        except zlib.error as e:
            raise ProtocolViolation(f"{self._encoding} body does not decode: {e}") from None
        if budget <= 0:
            raise self._too_large()
        return out

    def _lost(self, exc: Exception | None) -> None:
        if self._error is None:
            try:
                self._parser.feed_eof()
                if self._decoder is not None:
                    if self._parser.done:
                        self._body.extend(self._decode([]))
            except ProtocolViolation as e:
                detail = f": {exc}" if exc else ""
                self._error = UpstreamConnectionError(
                    f"upstream closed the connection ({e}){detail}"
                )
            except UpstreamProtocolError as e:
                self._error = e
        if self._conn is not None:
            self._conn._response = None
            self._conn = None
        self._parser.release()
        self._stop_timers()  # no wait follows: the answer has ended or failed
        self._wake()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._parser.release()
        self._stop_timers()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn._response = None
            conn.abort()
        self._wake()


class Http1Pool:
    """Keep-alive connections per origin; ``request`` sends one request on one of them.

    ``max_body`` bounds an answer's decoded body, ``head_timeout`` the time from an
    answer's first byte to the end of its head (and of trailers), ``max_trailer`` the
    trailers' bytes.
    """

    def __init__(
        self,
        *,
        keepalive: float = 30.0,
        max_idle: int = 256,
        ssl_context: ssl.SSLContext | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        head_timeout: float = DEFAULT_HEAD_TIMEOUT,
        max_trailer: int = 16 * 1024,
    ) -> None:
        self._keepalive = keepalive
        self._max_idle = max_idle
        self._idle: dict[Origin, list[_Connection]] = {}
        self._ssl = ssl_context
        self._open: set[_Connection] = set()
        self.max_body = max_body
        self.head_timeout = head_timeout
        self.max_trailer = max_trailer
        # Origins that sent bytes after the end of an answer: their connections are not
        # reused any more (a late stray answer could otherwise meet the next request).
        self.distrusted: set[Origin] = set()

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
        still_working: StillWorking | None = None,
    ) -> Response:
        """Send the request and return once the answer's status and headers arrived.

        ``read_timeout`` is the longest silence while waiting for the answer's bytes
        (TimeoutError beyond it). ``still_working``, when given, is asked once that silence
        has lasted ``read_timeout``: if it returns True (the upstream says it is still busy
        on this request, e.g. a lane still processing a long prompt), the wait starts over
        instead of failing; False, an exception, or no answer within ``read_timeout``
        ends it with TimeoutError as without it. (HEAD is not supported: an answer is
        read by its framing, which a HEAD answer does not follow.)
        """
        if method == "HEAD":
            raise ValueError("HEAD requests are not supported by this client")
        origin, target = split_url(url)
        head = _request_head(method, target, origin, headers or {}, len(body))
        payload = head + body
        for reused in (True, False):
            conn = self._checkout(origin) if reused else None
            if conn is None:
                reused = False
                conn = await self._connect(origin, connect_timeout)
            resp = Response(self, origin, conn, read_timeout, still_working)
            conn._response = resp
            conn.used = True
            assert conn.transport is not None
            conn.transport.write(payload)
            try:
                await resp._start()
                return resp
            except UpstreamProtocolError:
                resp.close()
                raise
            except UpstreamConnectionError as e:
                resp.close()
                # A kept-alive connection the server closed meanwhile fails before any byte
                # of an answer: the request never ran, so sending it again is safe.
                if reused and not resp.got_bytes:
                    continue
                if resp.got_bytes:  # the answer began: the request ran, it is not retried
                    raise UpstreamProtocolError(f"the answer's head was cut short ({e})") from e
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
            if now - conn.idle_since < self._keepalive and conn.reusable():
                return conn
            conn.abort()
        return None

    def _distrust(self, origin: Origin) -> None:
        if origin not in self.distrusted:
            self.distrusted.add(origin)
            log.warning(
                "upstream %s:%d sent bytes after the end of an answer: its "
                "connections are no longer reused",
                origin.host,
                origin.port,
            )
            for conn in self._idle.pop(origin, []):
                conn.abort()

    def _take_back(self, origin: Origin, conn: _Connection) -> None:
        idle = self._idle.get(origin)
        if idle and conn in idle:
            idle.remove(conn)
            conn.close()

    def _give_back(self, origin: Origin, conn: _Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        if len(idle) >= self._max_idle or origin in self.distrusted:
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
                    lambda: _Connection(self._open, lambda: self._distrust(origin)),
                    origin.host,
                    origin.port,
                    ssl=ssl_arg,
                )
        except TimeoutError:
            # Nothing was sent: as safe to try elsewhere as a refused connection.
            raise UpstreamConnectionError(
                f"cannot connect to {origin.host}:{origin.port} within {connect_timeout:g}s"
            ) from None
        except (OSError, ssl.SSLError) as e:
            raise UpstreamConnectionError(
                f"cannot connect to {origin.host}:{origin.port}: {e.strerror or e}"
                if isinstance(e, OSError)
                else f"TLS to {origin.host}:{origin.port} failed: {e}"
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


def _request_head(
    method: str, target: str, origin: Origin, headers: Mapping[str, str], length: int
) -> bytes:
    lines = [
        f"{method} {target} HTTP/1.1",
        f"Host: {origin.host_header}",
        f"Content-Length: {length}",
        "Accept-Encoding: identity",
    ]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} contains a line break")
        if name.lower() not in (
            "host",
            "content-length",
            "accept-encoding",
            "connection",
            "transfer-encoding",
        ):
            lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


__all__ = [
    "DEFAULT_HEAD_TIMEOUT",
    "DEFAULT_MAX_BODY",
    "HeadTimeout",
    "Headers",
    "Http1Pool",
    "ProtocolViolation",
    "Response",
    "ResponseParser",
    "StillWorking",
    "UpstreamConnectionError",
    "UpstreamProtocolError",
    "UpstreamTooLarge",
    "split_url",
]
