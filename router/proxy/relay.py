"""Forward one request to its candidates and relay the answer back.

Rules (why they are what they are):
- Retries happen only while nothing has reached the client: connection errors, an upstream
  that closes before its first byte, and 429/5xx answers move on to the next candidate
  (tenacity, jittered exponential backoff, bounded). A timeout is not retried: the upstream
  may still be generating, and a second try would double the work. A lane's 500 is not
  retried either (a defect for that request: the same worker would fail it again).
- Only what says a backend is unwell counts towards its cooldown (``UNWELL_STATUSES``,
  connection failures, timeouts, malformed answers): a 4xx is the client's, a 500 and a 429
  are about one request or the load, so no client's requests can cool a backend down for
  the others.
- A stream's headers are sent only once its first upstream chunk has arrived, so a backend
  that dies before producing anything is still retried. From then on every chunk is written
  as it arrives; only a bounded copy of the tail is kept to read the final statistics.
  Unless that wait is long (a long prompt's prefill): after ``keepalive`` seconds without a
  first chunk the stream's response begins with the door's keep-alives
  (``router.proxy.early``), so no client takes the prefill for a hang. Retries go on
  behind them (the client has no answer's byte yet), and a failure then ends the begun
  stream with an error event in the door's shape.
- After the first byte nothing is retried: a failure ends the stream with an error event in
  the OpenAI error shape, then ``data: [DONE]``. A stream ends once: after the upstream's
  ``data: [DONE]`` nothing more is read or written (its trailers cannot add an ending).
- An answer that breaks HTTP/1.1 or a bound (``UpstreamProtocolError``) is not a connection
  failure: the upstream ran the request, so it is answered 502 and not retried (reason
  ``malformed``, or ``too_large``).
- Only whole events are written: an incomplete event waits for its end (it is useless to a
  client until then), so an error event is never glued onto half an event.
- A client that goes away closes the upstream request at once (unless the backend is marked
  ``drain_on_abort``, for servers that crash on aborts: then the answer, even one that has
  not started yet, is read to its end in the background and discarded).
- A stream is complete once its final events (``data: [DONE]``) reached the client: its
  outcome and statistics are settled at that moment, before the upstream's end of body is
  awaited. Clients (the official OpenAI SDK among them) close as soon as they read
  ``[DONE]``, and that close cancels the handler: what is left to read then is read in the
  background (bounded) so the connection can be reused, and the request stays a 200 with
  its statistics counted, never a 499.
- A request its client stops from elsewhere (``Stop``: the Responses API's cancel) has its
  upstream closed at once, which frees the lane's slot; a stream begun ends with its door's
  ending for a stopped answer, and the request is booked as one its client left (499), never
  as a backend failure.
- On shutdown (``shutdown(grace)``, run from the app's on_shutdown) new requests get 503;
  those in flight have ``grace`` seconds, then each stream still running ends with an error
  event and each request not yet answered gets a 503. Left to itself, aiohttp would cut them
  only after twice its shutdown timeout, with no word to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiohttp import web
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from router.backends.base import Backend
from router.backends.pool import BackendPool
from router.config.settings import RetrySettings
from router.kernel import errors
from router.kernel.errors import RouterError
from router.kernel.sse import (
    HELD_LIMIT,
    SSETail,
    done_tail,
    first_event_is_json,
    looks_like_sse,
    only_done_after,
    split_events,
)
from router.metrics import Metrics
from router.proxy.headers import served_headers
from router.proxy.outcome import Outcome
from router.proxy.partition import CACHE_PARTITION_HEADER
from router.proxy.request import ParsedRequest
from router.routing.speculate import asked_source
from router.routing.types import Candidate, Decision
from router.upstream.client import (
    HeadTimeout,
    Http1Pool,
    Response,
    UpstreamProtocolError,
    UpstreamTooLarge,
)

log = logging.getLogger("speclane.relay")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# What says a backend is unwell (counted towards its cooldown, as Envoy's outlier detection
# counts gateway errors): it could not take the request or could not be reached. A 500 is
# the backend's answer about that one request (its content may have caused it: a client
# must never cool a backend down for others) and a 429 is backpressure, which the load gate
# handles; both are still counted as failures (speclane_upstream_failures_total).
UNWELL_STATUSES = frozenset({502, 503, 504})
# router.upstream.client raises UpstreamConnectionError (a ConnectionError) for every connection
# failure; OSError-derived resets are ConnectionErrors too.
CONNECT_ERRORS = (ConnectionError,)
# After [DONE] an upstream has nothing more to say than the end of its body: wait that long
# and read that much at most, then drop the connection instead of reusing it.
TAIL_GRACE = 5.0
TAIL_LIMIT = 64 * 1024
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


class _StreamFailure(Exception):
    """A stream that failed after its first byte, for a reason the relay found itself."""

    def __init__(self, reason: str, error: RouterError) -> None:
        super().__init__(error.message)
        self.reason = reason
        self.error = error


class Retryable(Exception):
    def __init__(self, error: RouterError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


def upstream_body(parsed: ParsedRequest, backend: Backend, cand: Candidate) -> bytes:
    """The body each backend gets. The lanes: ``num_draft_tokens: 0`` to decode plainly, or
    the ``draft_source`` chosen for the request's family (on each lane its own, judged
    apart). An external backend: as validated, with late system messages folded when it is
    set to (``system_messages = "fold"``, the default of every kind but ``openai``)."""
    if backend.lane is None:
        return parsed.body(fold_system=backend.fold_system)
    return parsed.body(plain=not cand.speculative, draft_source=asked_source(cand))


class Egress(Protocol):
    """How a front door other than OpenAI's reshapes the upstream's OpenAI answer for its
    client (``router.frontdoors``). Without one the answer is relayed byte for byte.

    Statistics, telemetry and the tail the relay keeps all stay OpenAI-shaped: only what is
    written to the client changes.
    """

    stream_content_type: str

    def events(self, data: bytes) -> bytes:
        """Whole upstream SSE events in, bytes for the client out (possibly none)."""
        ...

    def finish(self) -> bytes:
        """The end of a stream that ended well (after ``[DONE]`` or an upstream error event)."""
        ...

    def error(self, err: RouterError) -> bytes:
        """What ends a stream that failed after bytes reached the client."""
        ...

    def keep_alive(self, note: str) -> bytes:
        """A no-op for the client while its stream waits (``note`` says why, where the
        door's framing has room for words)."""
        ...

    def body(self, answer: Any) -> bytes:
        """A whole non-streaming upstream answer (parsed JSON) in, the client's body out;
        raises RouterError when the answer is not one it can translate."""
        ...


class Begun(Protocol):
    """A stream's response that may begin before its answer (``router.proxy.early``)."""

    response: web.StreamResponse | None  # set once its headers went out

    def keeping_alive(
        self, every: float, headers: Mapping[str, str]
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Around a wait: begin the response and send keep-alives once it lasts."""
        ...


@dataclass(slots=True)
class Opened:
    backend: Backend
    candidate: Candidate
    response: Response
    first_chunk: bytes  # streams only: already read, not yet written


@dataclass(slots=True, eq=False)
class _Live:
    """One request inside ``forward``, as the shutdown (and a ``Stop``) sees it."""

    task: asyncio.Task[Any] | None
    response: Response | None = None  # set once a stream has begun
    aborted: bool = False


class Stop:
    """A request that its client may stop from elsewhere (the Responses API's cancel).

    ``request()``: a stream already begun has its upstream closed (the relay then writes
    ``ending()``, the door's last events for a stopped answer); anything before that has its
    handler ``task`` cancelled. Either way the upstream request is closed, which is what
    stops the generation and frees the backend's slot.
    """

    def __init__(self, task: asyncio.Task[Any] | None, ending: Callable[[], bytes]) -> None:
        self.task = task
        self.ending = ending
        self.requested = False
        self._live: _Live | None = None

    def request(self) -> None:
        if self.requested:
            return
        self.requested = True
        live = self._live
        if live is not None and live.response is not None:
            live.response.close()
        elif self.task is not None and not self.task.done():
            self.task.cancel()


def shutting_down(message: str = "speclane is shutting down") -> RouterError:
    return errors.unavailable(message, code="shutting_down")


class Relay:
    def __init__(
        self,
        client: Http1Pool,
        pool: BackendPool,
        retry: RetrySettings,
        metrics: Metrics,
        keepalive: float = 2.0,
    ) -> None:
        self._keepalive = keepalive  # seconds a stream waits silent for its first chunk
        self._client = client
        self._pool = pool
        self._retry = retry
        self._metrics = metrics
        self._drains: set[asyncio.Task[None]] = set()
        self._live: set[_Live] = set()
        self._idle = asyncio.Event()
        self._closing = False

    async def forward(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        decision: Decision,
        *,
        path: str,
        outcome: Outcome,
        headers: dict[str, str],
        egress: Egress | None = None,
        begun: Begun | None = None,
        stop: Stop | None = None,
    ) -> web.StreamResponse:
        """``begun``: a stream's response that may begin early (its headers may already be
        out, while its model loaded; or go out with keep-alives while the upstream's first
        chunk is awaited, ``router.proxy.early``): the answer's events are then written into
        it. ``stop``: how the client may stop it from elsewhere."""
        outcome.stream = parsed.route.stream
        if self._closing:
            raise shutting_down()
        live = _Live(asyncio.current_task())
        if stop is not None:
            stop._live = live
        self._live.add(live)
        try:
            if begun is not None and parsed.route.stream:
                async with begun.keeping_alive(self._keepalive, headers):
                    opened = await self._open_with_retries(parsed, decision, path, outcome)
            else:
                opened = await self._open_with_retries(parsed, decision, path, outcome)
            backend = opened.backend
            outcome.backend, outcome.candidate = backend, opened.candidate
            headers = served_headers(headers, backend.name, opened.candidate.lane, outcome.attempts)
            try:
                if parsed.route.stream:
                    out = begun.response if begun is not None else None
                    return await self._relay_stream(
                        request, opened, outcome, headers, live, egress, out, stop
                    )
                return await self._relay_body(opened, outcome, headers, egress)
            finally:
                self._end(backend, opened.response, outcome)
        except RouterError as e:
            _known_headers(e, headers, decision, outcome)
            raise
        except asyncio.CancelledError:
            # Cancelled by shutdown() before any byte reached the client: answer 503.
            if live.aborted and live.task is not None and live.task.uncancel() == 0:
                raise shutting_down(
                    "speclane is shutting down; the request was not "
                    "answered within the shutdown grace period"
                ) from None
            raise
        finally:
            self._live.discard(live)
            if not self._live:
                self._idle.set()

    # --- opening: the only place that retries ------------------------------------------

    async def _open_with_retries(
        self,
        parsed: ParsedRequest,
        decision: Decision,
        path: str,
        outcome: Outcome,
    ) -> Opened:
        candidates = decision.candidates

        failed: list[tuple[str, str]] = []  # (backend, reason) of the attempt that failed

        async def attempt_next() -> Opened:
            cand = candidates[outcome.attempts % len(candidates)]
            if failed:
                # Only now is the failed attempt repeated: a failure that ends the
                # request is a failure (speclane_upstream_failures_total), not a retry.
                self._metrics.retries.labels(*failed.pop()).inc()
            outcome.attempts += 1
            backend = outcome.tried = self._pool[cand.backend]
            # Counted as in flight from the moment it is sent, not from the upstream's
            # headers: a lane worker answers only with its first token, and requests
            # arriving meanwhile must already see the lane as busy.
            self._begin(backend, outcome)
            try:
                return await self._open(backend, cand, parsed, path)
            except Retryable as e:
                self._unbegin(backend, outcome)
                failed.append((backend.name, e.reason))
                raise
            except BaseException:
                self._unbegin(backend, outcome)
                raise

        # The first try runs without tenacity: its bookkeeping is measurable on the hot path.
        try:
            return await attempt_next()
        except Retryable as first:
            if self._retry.attempts <= 1:
                raise first.error from None
            log.info("retrying after %s: %s", first.reason, first.error.message)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._retry.attempts - 1),
            wait=wait_random_exponential(
                multiplier=self._retry.backoff_initial, max=self._retry.backoff_max
            ),
            retry=retry_if_exception_type(Retryable),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await attempt_next()
        except Retryable as e:
            raise e.error from None
        raise AssertionError("unreachable: tenacity either returned or raised")

    async def _open(
        self, backend: Backend, cand: Candidate, parsed: ParsedRequest, path: str
    ) -> Opened:
        headers = {"Content-Type": "application/json", **backend.auth_headers()}
        if backend.lane is not None and parsed.cache_partition:  # never to external backends
            headers[CACHE_PARTITION_HEADER] = parsed.cache_partition
        try:
            resp = await self._post(
                backend,
                f"{backend.base_url}{path}",
                body=upstream_body(parsed, backend, cand),
                headers=headers,
                connect_timeout=backend.connect_timeout,
                read_timeout=backend.read_timeout,
                still_working=(backend.still_working(backend) if backend.still_working else None),
            )
        except TimeoutError as e:
            self._failed(backend, "timeout")
            raise errors.upstream_timeout(
                f"backend '{backend.name}' did not answer within {backend.read_timeout:g}s"
                + (f" ({e})" if str(e) else "")
            ) from e
        except UpstreamProtocolError as e:
            raise self._malformed(backend, e) from e
        except CONNECT_ERRORS as e:
            raise self._retryable(
                backend, "connect", f"could not reach backend '{backend.name}': {e}"
            ) from e
        try:
            if resp.status >= 400:
                try:
                    body = await resp.read(limit=64 * 1024)
                except TimeoutError as e:
                    self._failed(backend, "timeout")
                    raise errors.upstream_timeout(
                        f"backend '{backend.name}' answered {resp.status} but its body did not "
                        f"arrive within {backend.read_timeout:g}s of silence"
                    ) from e
                except UpstreamProtocolError as e:
                    raise self._malformed(backend, e) from e
                except CONNECT_ERRORS:
                    body = b""  # the status says enough
                err = errors.from_upstream_body(resp.status, body)
                if resp.status not in RETRY_STATUSES:
                    raise err  # the client's own fault (4xx): its answer, never counted
                reason = f"status_{resp.status}"
                self._failed(backend, reason, unwell=resp.status in UNWELL_STATUSES)
                if resp.status == 500 and backend.lane is not None:
                    # A lane's 500 is a defect for this request (the worker checked it first):
                    # the same code on the same model would fail it again.
                    raise err
                raise Retryable(err, reason)
            first = b""
            if parsed.route.stream:
                first = await self._first_chunk(backend, resp)
            backend.request_succeeded()
            return Opened(backend, cand, resp, first)
        except asyncio.CancelledError:
            self._abandon(backend, resp)
            raise
        except BaseException:
            resp.close()
            raise

    async def _post(self, backend: Backend, url: str, **kwargs: Any) -> Response:
        if not backend.drain_on_abort:
            return await self._client.request("POST", url, **kwargs)
        # A backend that crashes on aborts must not see one even when the client leaves
        # before the answer starts: the request goes on, and its answer is drained.
        sending = asyncio.ensure_future(self._client.request("POST", url, **kwargs))
        try:
            return await asyncio.shield(sending)
        except asyncio.CancelledError:
            self._track(asyncio.create_task(self._drain_when_answered(backend, sending)))
            raise

    async def _drain_when_answered(
        self, backend: Backend, sending: asyncio.Future[Response]
    ) -> None:
        try:
            resp = await sending
        except (TimeoutError, *CONNECT_ERRORS):
            return
        await self._drain(backend, resp)

    async def _first_chunk(self, backend: Backend, resp: Response) -> bytes:
        ctype = resp.headers.get("Content-Type") or ""
        if "text/event-stream" not in ctype:
            raise errors.upstream_failed(
                f"backend '{backend.name}' answered a streaming request with content type "
                f"'{ctype or 'none'}' instead of text/event-stream",
                code="upstream_bad_stream",
            )
        first = b""
        try:
            # Up to the end of the first event (bounded): it may come in pieces.
            while len(first) < HELD_LIMIT and b"\n\n" not in first and b"\n\r\n" not in first:
                more = await resp.readany()
                if not more:
                    break
                first += more
        except TimeoutError as e:
            self._failed(backend, "timeout")
            raise errors.upstream_timeout(
                f"backend '{backend.name}' sent no data for {backend.read_timeout:g}s"
            ) from e
        except UpstreamProtocolError as e:
            raise self._malformed(backend, e) from e
        except CONNECT_ERRORS as e:
            raise self._retryable(
                backend, "disconnect", f"backend '{backend.name}' closed the stream: {e}"
            ) from e
        if not first:
            raise self._retryable(
                backend, "empty", f"backend '{backend.name}' closed the stream before any data"
            )
        if not looks_like_sse(first):
            raise errors.upstream_failed(
                f"backend '{backend.name}' sent data that is not server-sent events",
                code="upstream_bad_stream",
            )
        if not first_event_is_json(first):
            raise errors.upstream_failed(
                f"backend '{backend.name}' began its stream with an event that is not JSON",
                code="upstream_bad_stream",
            )
        return first

    def _malformed(self, backend: Backend, e: ConnectionError) -> RouterError:
        """An answer that broke HTTP/1.1 or a bound: the request ran upstream, so it is not
        retried; counted under its own reason."""
        reason = "too_large" if isinstance(e, UpstreamTooLarge) else "malformed"
        self._failed(backend, reason)
        return errors.upstream_failed(
            f"backend '{backend.name}' sent an invalid answer: {e}", code=f"upstream_{reason}"
        )

    def _retryable(self, backend: Backend, reason: str, message: str) -> Retryable:
        self._failed(backend, reason)
        return Retryable(errors.upstream_failed(message), reason)

    def _failed(self, backend: Backend, reason: str, *, unwell: bool = True) -> None:
        """A failed attempt, counted; ``unwell``: it also counts towards the cooldown."""
        self._metrics.failures.labels(backend.name, reason).inc()
        if unwell and backend.request_failed(reason, time.monotonic()):
            self._metrics.cooldowns.labels(backend.name).inc()
            log.warning(
                "backend %s cooled down for %.1fs after repeated failures (%s)",
                backend.name,
                backend.cooldown.seconds,
                reason,
            )

    # --- relaying -----------------------------------------------------------------------

    async def _relay_stream(
        self,
        request: web.Request,
        opened: Opened,
        outcome: Outcome,
        headers: dict[str, str],
        live: _Live,
        egress: Egress | None,
        begun: web.StreamResponse | None = None,
        stop: Stop | None = None,
    ) -> web.StreamResponse:
        backend, resp = opened.backend, opened.response
        outcome.status = resp.status
        tail = SSETail()
        chunk = opened.first_chunk
        held = b""  # the incomplete event at the end of what was read
        outcome.first_byte_at = time.monotonic()
        if begun is None:
            out_headers = {**headers, **SSE_HEADERS}
            if egress is not None:
                out_headers["Content-Type"] = egress.stream_content_type
            out = web.StreamResponse(status=resp.status, headers=out_headers)
            await out.prepare(request)
        else:
            out = begun
        live.response = resp
        # Keep-alive comments are bytes, not progress: a backend that sends only those for
        # its read timeout has stalled as surely as one that sends nothing.
        last_data = outcome.first_byte_at
        try:
            while chunk:
                if b"data:" in chunk:
                    last_data = time.monotonic()
                elif time.monotonic() - last_data > backend.read_timeout:
                    raise _StreamFailure(
                        "timeout",
                        errors.upstream_timeout(
                            f"backend '{backend.name}' sent only keep-alive comments for "
                            f"{backend.read_timeout:g}s mid-stream"
                        ),
                    )
                whole, held = split_events(held + chunk)
                after = done_tail(whole)
                if after:  # nothing after the end reaches a client
                    whole = whole[: len(whole) - len(after)]
                tail.feed(whole)
                sent = whole if egress is None or not whole else egress.events(whole)
                try:
                    if sent:
                        await out.write(sent)
                except ConnectionResetError:
                    outcome.client_left()  # the client went away; nothing more to send
                    return out
                if after is not None:
                    self._delivered(backend, outcome, tail)
                    end = b"" if egress is None else egress.finish()
                    await self._after_done(out, backend, resp, outcome, after + held, end)
                    return out
                chunk = await resp.readany()
            tail.feed(held)
            outcome.last_byte_at = time.monotonic()
            outcome.tail_events, _, saw_done = tail.finish()
            self._upstream_failed_it(backend, outcome)
            if saw_done:
                if held and egress is None:  # "data: [DONE]" without its blank line: as it came
                    await self._write(out, held, outcome)
                outcome.completed = True
                await self._finish(out, b"" if egress is None else egress.finish(), outcome)
            elif outcome.tail_events and "error" in outcome.tail_events[-1]:
                outcome.completed = True  # the upstream ended its own stream with an error event
                trailer = b"data: [DONE]\n\n" if egress is None else egress.finish()
                await self._finish(out, trailer, outcome)
            else:
                raise _StreamFailure(
                    "no_done",
                    errors.upstream_failed(
                        f"backend '{backend.name}' ended the stream without data: [DONE]",
                        code="upstream_incomplete_stream",
                    ),
                )
        except Exception as e:  # the one exit of a stream that failed after its first byte
            if stop is not None and stop.requested and not outcome.completed:
                # Its client stopped it (closing the upstream is what raised): not a failure.
                outcome.client_left()
                await self._finish(out, stop.ending(), outcome)
                return out
            # Headers (200) and events are out: whatever went wrong, the client gets an
            # ending in its API's shape, and the request is booked with the error.
            reason, err = self._stream_failure(e, backend, live)
            await self._stream_failed(out, backend, outcome, reason, err, egress)
        return out

    def _stream_failure(
        self, e: Exception, backend: Backend, live: _Live
    ) -> tuple[str, RouterError]:
        """(reason, error) of a stream that failed after its first byte reached the client."""
        if live.aborted:  # shutdown() closed the upstream: whatever reading it then raised
            return "shutdown", shutting_down(
                "speclane is shutting down; the stream was cut after the grace period"
            )
        if isinstance(e, _StreamFailure):
            return e.reason, e.error
        if isinstance(e, TimeoutError):
            return "timeout", errors.upstream_timeout(
                f"backend '{backend.name}' sent nothing for {backend.read_timeout:g}s mid-stream"
            )
        if isinstance(e, UpstreamProtocolError):
            err = self._malformed(backend, e)
            return "too_large" if isinstance(e, UpstreamTooLarge) else "malformed", err
        if isinstance(e, CONNECT_ERRORS):
            return "disconnect", errors.upstream_failed(
                f"backend '{backend.name}' closed the stream mid-way: {type(e).__name__}"
            )
        if isinstance(e, RouterError):  # e.g. a front door that cannot translate an event
            return "invalid", e
        log.error("stream from %s failed on an unexpected error", backend.name, exc_info=e)
        return "internal", errors.internal_error()

    def _delivered(self, backend: Backend, outcome: Outcome, tail: SSETail) -> None:
        """[DONE] reached the client: settle the outcome now, so that nothing the client
        does next (closing, which cancels this handler) can lose it."""
        outcome.last_byte_at = time.monotonic()
        outcome.tail_events, _, _ = tail.finish()
        outcome.completed = outcome.delivered = True
        self._upstream_failed_it(backend, outcome)

    def _upstream_failed_it(self, backend: Backend, outcome: Outcome) -> None:
        """The upstream ended its own stream with an error event (passed on to the client,
        in its API's shape): a failure after the first byte like the others, counted and
        booked with that error, not as a clean 200."""
        last = outcome.tail_events[-1] if outcome.tail_events else None
        err = errors.from_upstream_event(last) if last is not None else None
        if err is None:
            return
        log.warning("stream from %s ended with its error: %s", backend.name, err.message)
        self._metrics.stream_errors.labels(backend.name, "upstream_error").inc()
        outcome.error, outcome.status = err, err.status

    async def _after_done(
        self,
        out: web.StreamResponse,
        backend: Backend,
        resp: Response,
        outcome: Outcome,
        rest: bytes,
        trailer: bytes,
    ) -> None:
        """Read the upstream's end of body; whatever came after [DONE] (``rest`` and more)
        is not the client's: it is dropped, and with it the connection unless it was only
        blank lines, comments or a repeated [DONE]."""
        # Usually the end of body came in the same read as [DONE]: nothing to wait for, so
        # no timer is armed (the connection goes back to the pool in ``_end``).
        if not resp.complete:
            try:
                async with asyncio.timeout(TAIL_GRACE):
                    while len(rest) <= TAIL_LIMIT and (chunk := await resp.readany()):
                        rest += chunk
            except (TimeoutError, *CONNECT_ERRORS):
                pass
        if not resp.complete or (rest and not only_done_after(rest)):
            if resp.complete:
                log.warning(
                    "backend %s sent %d bytes after data: [DONE]: dropped, and its connection",
                    backend.name,
                    len(rest),
                )
            resp.discard()  # silent, broken, endless or talking after [DONE]: not reused
        await self._finish(out, trailer, outcome)

    async def _stream_failed(
        self,
        out: web.StreamResponse,
        backend: Backend,
        outcome: Outcome,
        reason: str,
        err: RouterError,
        egress: Egress | None,
    ) -> None:
        if outcome.completed:
            # Its ending was already written ([DONE] or the upstream's own error event):
            # a second ending would break the stream the client already has whole.
            log.warning("stream from %s: %s after its end", backend.name, err.message)
            return
        log.warning("stream from %s failed after first byte: %s", backend.name, err.message)
        self._metrics.stream_errors.labels(backend.name, reason).inc()
        # Booked with the error's status, not the 200 its headers carried: the client did
        # not get its answer, and metrics, access log and status page must say so.
        outcome.error, outcome.status = err, err.status
        if reason in ("timeout", "disconnect"):
            self._failed(backend, reason)
        trailer = errors.sse_error_event(err) if egress is None else egress.error(err)
        await self._finish(out, trailer, outcome)

    async def _write(self, out: web.StreamResponse, data: bytes, outcome: Outcome) -> None:
        try:
            await out.write(data)
        except ConnectionResetError:
            outcome.client_left()

    async def _finish(self, out: web.StreamResponse, trailer: bytes, outcome: Outcome) -> None:
        try:
            if trailer:
                await out.write(trailer)
            await out.write_eof()
        except ConnectionResetError:
            outcome.client_left()

    async def _relay_body(
        self, opened: Opened, outcome: Outcome, headers: dict[str, str], egress: Egress | None
    ) -> web.Response:
        backend, resp = opened.backend, opened.response
        try:
            body = await resp.read()
        except TimeoutError as e:
            self._failed(backend, "timeout")
            raise errors.upstream_timeout(
                f"backend '{backend.name}': {e}"
                if isinstance(e, HeadTimeout)
                else f"backend '{backend.name}' did not finish within {backend.read_timeout:g}s "
                "of silence"
            ) from e
        except UpstreamProtocolError as e:
            raise self._malformed(backend, e) from e
        except CONNECT_ERRORS as e:
            self._failed(backend, "disconnect")
            raise errors.upstream_failed(
                f"backend '{backend.name}' closed the connection before the answer was complete: "
                f"{type(e).__name__}"
            ) from e
        outcome.first_byte_at = outcome.last_byte_at = time.monotonic()
        ctype = resp.headers.get("Content-Type") or "application/json"
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise errors.upstream_failed(
                f"backend '{backend.name}' answered with {len(body)} bytes of content type "
                f"'{ctype}' that are not valid JSON",
                code="upstream_bad_json",
            ) from None
        if not isinstance(parsed, dict):  # every OpenAI answer is an object
            raise errors.upstream_failed(
                f"backend '{backend.name}' answered with JSON that is not an object "
                f"({type(parsed).__name__})",
                code="upstream_bad_json",
            )
        outcome.body_json = parsed
        outcome.completed = True
        outcome.status = resp.status
        if egress is not None:
            return web.Response(
                status=resp.status,
                body=egress.body(parsed),
                headers={**headers, "Content-Type": "application/json"},
            )
        # Passed through byte for byte: nothing here needs re-serialising.
        return web.Response(
            status=resp.status, body=body, headers={**headers, "Content-Type": "application/json"}
        )

    # --- bookkeeping --------------------------------------------------------------------

    def _begin(self, backend: Backend, outcome: Outcome) -> None:
        outcome.solo, outcome._epoch = backend.request_started()
        now = time.monotonic()
        outcome._rows_mark = (backend.rows_mark(now), now)
        self._metrics.inflight.labels(backend.name).inc()

    def _unbegin(self, backend: Backend, outcome: Outcome) -> bool:
        self._metrics.inflight.labels(backend.name).dec()
        return backend.request_ended(outcome._epoch)

    def _end(self, backend: Backend, resp: Response, outcome: Outcome) -> None:
        # Solo: nothing was running when it began and nothing began after it.
        now = time.monotonic()
        area, since = outcome._rows_mark
        if now > since:
            outcome.rows = (backend.rows_mark(now) - area) / (now - since)
        alone = self._unbegin(backend, outcome)
        outcome.solo = outcome.solo and alone
        if resp.complete or (outcome.completed and not outcome.delivered):
            resp.close()  # the answer arrived whole: its connection is kept alive
        elif outcome.delivered and not self._closing:
            # The client left between [DONE] and the upstream's end of body: read that end
            # here, without the client, so the connection goes back to the pool.
            self._track(asyncio.create_task(self._read_tail(resp)))
        else:
            self._abandon(backend, resp)

    def _abandon(self, backend: Backend, resp: Response) -> None:
        """Stop reading an answer nobody waits for: close it (which is what cancels the work
        upstream), or drain it in the background for a backend that crashes on aborts."""
        if backend.drain_on_abort and not self._closing:
            self._track(asyncio.create_task(self._drain(backend, resp)))
        else:
            resp.close()

    def _track(self, task: asyncio.Task[None]) -> None:
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def _read_tail(self, resp: Response) -> None:
        rest = b""
        try:
            async with asyncio.timeout(TAIL_GRACE):
                while len(rest) <= TAIL_LIMIT and (chunk := await resp.readany()):
                    rest += chunk
        except (TimeoutError, *CONNECT_ERRORS):
            pass
        finally:
            if only_done_after(rest):
                resp.close()  # given back to the pool only if the body ended
            else:
                resp.discard()

    async def _drain(self, backend: Backend, resp: Response) -> None:
        """Let the backend finish an aborted generation instead of cutting it off."""
        try:
            while await resp.readany():
                pass
        except (TimeoutError, *CONNECT_ERRORS):
            pass
        finally:
            resp.close()
            log.debug("drained aborted request on %s", backend.name)

    async def shutdown(self, grace: float, *, settle: float = 2.0) -> None:
        """Refuse new requests, give those in flight ``grace`` seconds, then end the rest:
        streams with an error event (their upstream is closed, the relay loop writes it),
        requests not answered yet with a 503. Waits up to ``settle`` seconds for that."""
        self._closing = True
        if self._live:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
                return
            except TimeoutError:
                pass
        if not self._live:
            return
        log.warning(
            "shutdown: ending %d request(s) still running after %.1fs", len(self._live), grace
        )
        for live in list(self._live):
            live.aborted = True
            if live.response is not None:
                live.response.close()
            elif live.task is not None:
                live.task.cancel()
        if self._live:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), settle)

    async def close(self) -> None:
        for task in list(self._drains):
            task.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)


def _known_headers(
    err: RouterError, headers: dict[str, str], decision: Decision, outcome: Outcome
) -> None:
    """An error answer carries the X-Speclane-* headers known when it happened (its own,
    such as the error source, win)."""
    known = {
        **headers,
        "X-Speclane-Decision": decision.reason,
        "X-Speclane-Attempts": str(outcome.attempts),
    }
    if outcome.attempts and decision.candidates:
        tried = decision.candidates[(outcome.attempts - 1) % len(decision.candidates)]
        known["X-Speclane-Backend"], known["X-Speclane-Lane"] = tried.backend, tried.lane
    for name, value in known.items():
        err.headers.setdefault(name, value)
