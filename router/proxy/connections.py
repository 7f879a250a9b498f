"""Bounds on client connections: idle keep-alive, request-head deadline, connection cap.

aiohttp's server already closes a connection that stays idle ``keepalive_timeout`` seconds
(its timer runs from the connection's start and from the end of each answer; bytes of an
unfinished request head do not reset it). What it does not have, and this module adds:

- a deadline for a request head: from the first byte of a request to the end of its head,
  ``head_timeout`` seconds, however the bytes trickle in; then a 408 and the connection is
  closed (a partial head must not hold a connection for the whole keep-alive time);
- a cap on concurrent client connections: beyond ``max_connections`` a new connection is
  answered at once with a 503 (OpenAI error shape, ``Retry-After``) and closed, so that
  thousands of idle or slow clients cannot use up the process's file descriptors.

The request-body deadline (``body_timeout``) is applied where the body is read
(``read_body``), because only the handler knows when it wants the body.

``GuardedRunner`` is ``web.AppRunner`` with these guards; ``serve`` uses it.

aiohttp has no public hook for these, so ``GuardedHandler`` and ``GuardedServer`` rely on
a few of its private names (``AIOHTTP_PRIVATE_NAMES``); ``pyproject.toml`` pins the aiohttp
versions they were tested with and ``tests/proxy/test_connections_aiohttp.py`` fails when
an aiohttp release moves them.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from router.config.settings import ClientLimits
from router.kernel import errors
from router.kernel.errors import RouterError

log = logging.getLogger("speclane.clients")

# After an answer given before the request body was read whole (401, 413, 408), the rest of
# the body is read and dropped for at most this long, so that the client sees the answer
# rather than a reset; then the connection is closed (aiohttp's default is 10 s).
LINGER = 2.0

# What aiohttp keeps privately and this module reads or writes: on the handler the number
# of request heads parsed, the parsed requests not yet handled, whether one is being
# answered, and when its idle timer closes the connection; on the server the keyword
# arguments every handler is built with; on the runner the method that builds the server.
AIOHTTP_PRIVATE_NAMES: dict[type, tuple[str, ...]] = {
    RequestHandler: (
        "_request_count",
        "_messages",
        "_request_in_progress",
        "_next_keepalive_close_time",
    ),
    Server: ("_kwargs",),
    web.AppRunner: ("_make_server",),
}

# File descriptors kept aside for everything that is not a client connection (listening
# sockets, lane worker pipes, log files, policy reads, health checks).
FD_RESERVE = 64


def _raw_answer(err: RouterError) -> bytes:
    """A complete HTTP/1.1 answer for a connection that will be closed right after."""
    status, body, headers = errors.render(err)
    reason = {408: "Request Timeout", 503: "Service Unavailable"}.get(status, "Error")
    lines = [
        f"HTTP/1.1 {status} {reason}",
        "Connection: close",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


TOO_MANY = _raw_answer(
    RouterError(
        503,
        "too many client connections; retry shortly",
        type="service_unavailable",
        code="too_many_connections",
        headers={"Retry-After": "1"},
    )
)
HEAD_TIMEOUT = _raw_answer(
    RouterError(408, "the request head did not arrive in time", code="request_timeout")
)


def body_timeout_error(seconds: float) -> RouterError:
    return RouterError(
        408,
        f"the request body did not arrive within {seconds:g} s",
        code="request_timeout",
        headers={"Connection": "close"},
    )


async def read_body(request: web.Request, deadline: float) -> bytes:
    """The whole request body, or a 408 when it takes longer than ``deadline`` seconds."""
    try:
        if request.content.is_eof():
            # Already in whole (a short body comes with its head): reading it cannot wait,
            # so no deadline timer is armed and cancelled for it.
            return await request.read()
        async with asyncio.timeout(deadline):
            return await request.read()
    except TimeoutError:
        request.protocol.close()  # not reused: the rest of that body may still come
        raise body_timeout_error(deadline) from None
    except web.RequestPayloadError as e:  # broken chunked framing, undecodable gzip/deflate
        request.protocol.close()
        # Nothing more can be read from it: marked ended, so that aiohttp does not read it
        # again after the answer (to drain it) and log the same error as unhandled.
        request.content.feed_eof()
        cause = e.__cause__ or e
        raise RouterError(
            400,
            f"the request body could not be read: {_describe(cause)}",
            code="invalid_body",
            headers={"Connection": "close"},
        ) from None


def connection_cap(configured: int, soft_fd_limit: int) -> int:
    """The cap in force: the configured one, lowered so that every client connection can
    also hold one upstream connection within the process's file-descriptor limit."""
    if soft_fd_limit == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, (soft_fd_limit - FD_RESERVE) // 2))


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft file-descriptor limit towards ``wanted`` (never above the hard
    limit); the soft limit in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # macOS refuses values above its OPEN_MAX
            pass
    return soft


def _describe(exc: BaseException) -> str:
    """The parser's reason in one short line (it may quote the client's bytes)."""
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    text = str(text).replace("\r", " ").replace("\n", " ")
    return text if len(text) <= 200 else text[:200] + "..."


class GuardedHandler(RequestHandler):
    """aiohttp's per-connection protocol with the head deadline and the cap."""

    __slots__ = ("_guard", "_head_count", "_head_timer", "_last_payload", "_refused")

    def __init__(self, manager: GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = manager
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_count = 0  # requests parsed when the head timer was armed
        self._last_payload: Any = None  # the body stream of the last request parsed
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._guard.admit():
            self._refused = True
            self._guard.refused += 1
            # A stream protocol's transport writes (uvloop's is not registered as an
            # asyncio.WriteTransport, so isinstance cannot say it).
            cast(asyncio.WriteTransport, transport).write(TOO_MANY)
            transport.close()
            self._guard.warn_refused()
            return
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_head_timer()
        if self._refused:
            return
        self._guard.release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        parsed_before = self._request_count
        super().data_received(data)
        if self._request_count != parsed_before:  # a head was completed: its deadline is met
            self._cancel_head_timer()
            self._last_payload = self._messages[-1][1] if self._messages else None
            return
        # No new head. The bytes are either the body of the last request (its payload still
        # open) or the beginning of a next head, whose deadline starts now.
        body_open = self._last_payload is not None and not self._last_payload.is_eof()
        if data and not body_open and self._head_timer is None:
            self._arm_head_timer()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp logs a traceback for a body it could not read while draining it after
        an early answer (bad gzip, broken chunks): that is a malformed request, not a bug."""
        exc = kw.get("exc_info")
        if isinstance(exc, web.RequestPayloadError | HttpProcessingError):
            remote = self.transport.get_extra_info("peername") if self.transport else None
            self._guard.warn_malformed(remote[0] if remote else None, exc)
            return
        super().log_exception(*args, **kw)

    def _arm_head_timer(self) -> None:
        deadline = self._guard.limits.head_timeout
        self._head_count = self._request_count
        loop = asyncio.get_running_loop()
        self._head_timer = loop.call_later(deadline, self._head_timed_out)
        # Reading a head is not idling: aiohttp's idle timer (which bytes do not reset)
        # must not cut it silently before this deadline answers 408.
        self._next_keepalive_close_time = max(
            self._next_keepalive_close_time, loop.time() + deadline + 1.0
        )

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request the HTTP parser refused (a 4xx before speclane's code runs): one
        rate-limited warning line instead of aiohttp's ERROR traceback per request, and the
        answer in the OpenAI error shape. Anything else (a 500: a bug) keeps aiohttp's
        traceback."""
        if status >= 500 or exc is None:
            return super().handle_error(request, status, exc, message)
        self._guard.warn_malformed(request.remote, exc)
        if request.writer.output_size > 0:
            raise ConnectionError("answer already started; cannot send the parser's error")
        err = RouterError(
            status, f"malformed HTTP request: {_describe(exc)}", code="malformed_request"
        )
        code, body, headers = errors.render(err)
        resp = web.Response(status=code, body=body, headers=headers)
        resp.force_close()
        return resp

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport is None or self._request_count != self._head_count:
            return  # closed, or the head arrived after all
        if self._request_in_progress or self._messages:
            # A pipelined head behind a request still being answered (a long stream):
            # never cut that answer; the head's deadline runs again from here.
            self._arm_head_timer()
            return
        self._guard.head_timeouts += 1
        self.transport.write(HEAD_TIMEOUT)
        self.force_close()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None


class GuardedServer(Server):
    """aiohttp's protocol factory, making ``GuardedHandler``s and counting connections."""

    def __init__(self, base: Server, limits: ClientLimits, cap: int) -> None:
        super().__init__(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=asyncio.get_running_loop(),
            **base._kwargs,
        )
        self.limits = limits
        self.cap = cap
        self.active = 0
        self.refused = 0
        self.head_timeouts = 0
        self.malformed = 0
        self._last_warning = -1e9
        self._last_malformed_log = -1e9
        self._malformed_unlogged = 0

    def __call__(self) -> RequestHandler:
        return GuardedHandler(self, loop=asyncio.get_running_loop(), **self._kwargs)

    def admit(self) -> bool:
        if self.active >= self.cap:
            return False
        self.active += 1
        return True

    def release(self) -> None:
        self.active -= 1

    def warn_malformed(self, remote: str | None, exc: BaseException) -> None:
        self.malformed += 1
        now = asyncio.get_running_loop().time()
        if now - self._last_malformed_log < 1.0:  # at most one line a second
            self._malformed_unlogged += 1
            return
        also = (
            f" ({self._malformed_unlogged} more since the last line)"
            if self._malformed_unlogged
            else ""
        )
        self._last_malformed_log, self._malformed_unlogged = now, 0
        log.warning("malformed request from %s refused: %s%s", remote, _describe(exc), also)

    def warn_refused(self) -> None:
        now = asyncio.get_running_loop().time()
        if now - self._last_warning >= 10.0:  # one line per 10 s under a flood
            self._last_warning = now
            log.warning(
                "client connection refused: %d open, the cap is %d "
                "(client_limits.max_connections); %d refused so far",
                self.active,
                self.cap,
                self.refused,
            )


class GuardedRunner(web.AppRunner):
    """``web.AppRunner`` whose server enforces ``ClientLimits`` (see the module docstring)."""

    def __init__(self, app: web.Application, limits: ClientLimits, cap: int, **kwargs: Any) -> None:
        kwargs.setdefault("keepalive_timeout", limits.keepalive_timeout)
        kwargs.setdefault("lingering_time", LINGER)
        super().__init__(app, **kwargs)
        self._limits = limits
        self._cap = cap

    async def _make_server(self) -> Server:
        return GuardedServer(await super()._make_server(), self._limits, self._cap)
