"""Forward one request to its candidates and relay the answer back.

Rules (why they are what they are):
- Retries happen only while nothing has reached the client: connection errors, an upstream
  that closes before its first byte, and 429/5xx answers move on to the next candidate
  (tenacity, jittered exponential backoff, bounded). A timeout is not retried: the upstream
  may still be generating, and a second try would double the work.
- A stream's headers are sent only once its first upstream chunk has arrived, so a backend
  that dies before producing anything is still retried. From then on every chunk is written
  as it arrives; only a bounded copy of the tail is kept to read the final statistics.
- After the first byte nothing is retried: a failure ends the stream with an error event in
  the OpenAI error shape, then ``data: [DONE]``.
- A client that goes away closes the upstream request at once (unless the backend is marked
  ``drain_on_abort``, for servers that crash on aborts: then the answer is read to its end
  in the background and discarded).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from router import errors
from router.backends.base import Backend
from router.backends.pool import BackendPool
from router.config import RetrySettings
from router.decision import Candidate, Decision
from router.errors import RouterError
from router.metrics import Metrics
from router.protocol import ParsedRequest, SSETail, looks_like_sse

log = logging.getLogger("speclane.relay")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
CONNECT_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError)
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


class Retryable(Exception):
    def __init__(self, error: RouterError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


@dataclass(slots=True)
class Outcome:
    """What happened to one relayed request; read by metrics and speculative telemetry."""

    endpoint: str
    arrival: float
    status: int = 0
    backend: Backend | None = None
    candidate: Candidate | None = None
    stream: bool = False
    attempts: int = 0
    first_byte_at: float | None = None  # first upstream body byte (monotonic)
    last_byte_at: float | None = None
    finished_at: float | None = None
    completed: bool = False  # the upstream answer arrived whole
    client_gone: bool = False
    error: RouterError | None = None
    body_json: dict[str, Any] | None = None  # non-streaming answer
    tail_events: list[dict[str, Any]] = field(default_factory=list)  # last events of a stream
    tail_malformed: int = 0
    solo: bool = True  # no other request was in flight on the backend meanwhile
    _epoch: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_byte_at is None else self.first_byte_at - self.arrival


BodyFor = Callable[[Backend, Candidate], bytes]


@dataclass(slots=True)
class Opened:
    backend: Backend
    candidate: Candidate
    response: aiohttp.ClientResponse
    first_chunk: bytes  # streams only: already read, not yet written


class Relay:
    def __init__(self, session: aiohttp.ClientSession, pool: BackendPool, retry: RetrySettings,
                 metrics: Metrics) -> None:
        self._session = session
        self._pool = pool
        self._retry = retry
        self._metrics = metrics
        self._drains: set[asyncio.Task[None]] = set()

    async def forward(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        decision: Decision,
        *,
        path: str,
        outcome: Outcome,
        body_for: BodyFor,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        outcome.stream = parsed.route.stream
        opened = await self._open_with_retries(parsed, decision, path, outcome, body_for)
        backend = opened.backend
        outcome.backend, outcome.candidate = backend, opened.candidate
        headers = {
            **headers,
            "X-Speclane-Backend": backend.name,
            "X-Speclane-Lane": opened.candidate.lane,
            "X-Speclane-Decision": decision.reason,
            "X-Speclane-Attempts": str(outcome.attempts),
        }
        self._begin(backend, outcome)
        try:
            if parsed.route.stream:
                return await self._relay_stream(request, opened, outcome, headers)
            return await self._relay_body(opened, outcome, headers)
        finally:
            self._end(backend, opened.response, outcome)

    # --- opening: the only place that retries ------------------------------------------

    async def _open_with_retries(self, parsed: ParsedRequest, decision: Decision, path: str,
                                 outcome: Outcome, body_for: BodyFor) -> Opened:
        candidates = decision.candidates

        async def attempt_next() -> Opened:
            cand = candidates[outcome.attempts % len(candidates)]
            outcome.attempts += 1
            return await self._open(self._pool[cand.backend], cand, parsed, path, body_for)

        # The first try runs without tenacity: its bookkeeping is measurable on the hot path.
        try:
            return await attempt_next()
        except Retryable as first:
            if self._retry.attempts <= 1:
                raise first.error from None
            log.info("retrying after %s: %s", first.reason, first.error.message)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._retry.attempts - 1),
            wait=wait_random_exponential(multiplier=self._retry.backoff_initial,
                                         max=self._retry.backoff_max),
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

    async def _open(self, backend: Backend, cand: Candidate, parsed: ParsedRequest, path: str,
                    body_for: BodyFor) -> Opened:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=backend.connect_timeout,
                                        sock_read=backend.read_timeout)
        headers = {"Content-Type": "application/json", **backend.auth_headers()}
        try:
            resp = await self._session.post(f"{backend.base_url}{path}",
                                            data=body_for(backend, cand),
                                            headers=headers, timeout=timeout)
        except TimeoutError as e:
            self._failed(backend, "timeout")
            raise errors.upstream_timeout(
                f"backend '{backend.name}' did not answer within {backend.read_timeout:g}s") from e
        except CONNECT_ERRORS as e:
            raise self._retryable(backend, "connect",
                                  f"could not reach backend '{backend.name}': {e}") from e
        try:
            if resp.status >= 400:
                body = await resp.content.read(64 * 1024)
                err = errors.from_upstream_body(resp.status, body)
                if resp.status in RETRY_STATUSES:
                    self._failed(backend, f"status_{resp.status}")
                    raise Retryable(err, f"status_{resp.status}")
                raise err
            first = b""
            if parsed.route.stream:
                first = await self._first_chunk(backend, resp)
            backend.cooldown.success()
            return Opened(backend, cand, resp, first)
        except BaseException:
            resp.close()
            raise

    async def _first_chunk(self, backend: Backend, resp: aiohttp.ClientResponse) -> bytes:
        ctype = resp.headers.get("Content-Type", "")
        if "text/event-stream" not in ctype:
            raise errors.upstream_failed(
                f"backend '{backend.name}' answered a streaming request with content type "
                f"'{ctype or 'none'}' instead of text/event-stream", code="upstream_bad_stream")
        try:
            first = await resp.content.readany()
        except TimeoutError as e:
            self._failed(backend, "timeout")
            raise errors.upstream_timeout(
                f"backend '{backend.name}' sent no data for {backend.read_timeout:g}s") from e
        except CONNECT_ERRORS as e:
            raise self._retryable(backend, "disconnect",
                                  f"backend '{backend.name}' closed the stream: {e}") from e
        if not first:
            raise self._retryable(backend, "empty",
                                  f"backend '{backend.name}' closed the stream before any data")
        if not looks_like_sse(first):
            raise errors.upstream_failed(
                f"backend '{backend.name}' sent data that is not server-sent events",
                code="upstream_bad_stream")
        return first

    def _retryable(self, backend: Backend, reason: str, message: str) -> Retryable:
        self._failed(backend, reason)
        return Retryable(errors.upstream_failed(message), reason)

    def _failed(self, backend: Backend, reason: str) -> None:
        backend.last_error = reason
        self._metrics.retries.labels(backend.name, reason).inc()
        if backend.cooldown.failure(time.monotonic()):
            self._metrics.cooldowns.labels(backend.name).inc()
            log.warning("backend %s cooled down for %.1fs after repeated failures (%s)",
                        backend.name, backend.cooldown.seconds, reason)

    # --- relaying -----------------------------------------------------------------------

    async def _relay_stream(self, request: web.Request, opened: Opened, outcome: Outcome,
                            headers: dict[str, str]) -> web.StreamResponse:
        backend, resp = opened.backend, opened.response
        outcome.status = resp.status
        out = web.StreamResponse(status=resp.status, headers={**headers, **SSE_HEADERS})
        tail = SSETail()
        chunk = opened.first_chunk
        outcome.first_byte_at = time.monotonic()
        await out.prepare(request)
        try:
            while chunk:
                tail.feed(chunk)
                try:
                    await out.write(chunk)
                except ConnectionResetError:
                    outcome.client_gone = True  # the client went away; nothing more to send
                    return out
                chunk = await resp.content.readany()
            outcome.last_byte_at = time.monotonic()
        except TimeoutError:
            await self._stream_failed(out, backend, outcome, "timeout", errors.upstream_timeout(
                f"backend '{backend.name}' sent nothing for {backend.read_timeout:g}s mid-stream"))
            return out
        except CONNECT_ERRORS as e:
            await self._stream_failed(out, backend, outcome, "disconnect", errors.upstream_failed(
                f"backend '{backend.name}' closed the stream mid-way: {type(e).__name__}"))
            return out
        outcome.tail_events, outcome.tail_malformed = tail.last_events()
        if tail.saw_done():
            outcome.completed = True
        elif outcome.tail_events and "error" in outcome.tail_events[-1]:
            outcome.completed = True  # the upstream ended its own stream with an error event
            await self._finish(out, b"data: [DONE]\n\n", outcome)
            return out
        else:
            await self._stream_failed(out, backend, outcome, "no_done", errors.upstream_failed(
                f"backend '{backend.name}' ended the stream without data: [DONE]",
                code="upstream_incomplete_stream"))
            return out
        await self._finish(out, b"", outcome)
        return out

    async def _stream_failed(self, out: web.StreamResponse, backend: Backend, outcome: Outcome,
                             reason: str, err: RouterError) -> None:
        log.warning("stream from %s failed after first byte: %s", backend.name, err.message)
        self._metrics.stream_errors.labels(backend.name, reason).inc()
        outcome.error = err
        if reason in ("timeout", "disconnect"):
            self._failed(backend, reason)
        await self._finish(out, errors.sse_error_event(err), outcome)

    async def _finish(self, out: web.StreamResponse, trailer: bytes, outcome: Outcome) -> None:
        try:
            if trailer:
                await out.write(trailer)
            await out.write_eof()
        except ConnectionResetError:
            outcome.client_gone = True

    async def _relay_body(self, opened: Opened, outcome: Outcome,
                          headers: dict[str, str]) -> web.Response:
        backend, resp = opened.backend, opened.response
        try:
            body = await resp.read()
        except TimeoutError as e:
            self._failed(backend, "timeout")
            raise errors.upstream_timeout(
                f"backend '{backend.name}' did not finish within {backend.read_timeout:g}s "
                "of silence") from e
        except CONNECT_ERRORS as e:
            self._failed(backend, "disconnect")
            raise errors.upstream_failed(
                f"backend '{backend.name}' closed the connection before the answer was complete: "
                f"{type(e).__name__}") from e
        outcome.first_byte_at = outcome.last_byte_at = time.monotonic()
        ctype = resp.headers.get("Content-Type", "application/json")
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise errors.upstream_failed(
                f"backend '{backend.name}' answered with {len(body)} bytes of content type "
                f"'{ctype}' that are not valid JSON", code="upstream_bad_json") from None
        outcome.body_json = parsed if isinstance(parsed, dict) else None
        outcome.completed = True
        outcome.status = resp.status
        # Passed through byte for byte: nothing here needs re-serialising.
        return web.Response(status=resp.status, body=body, headers={
            **headers, "Content-Type": "application/json"})

    # --- bookkeeping --------------------------------------------------------------------

    def _begin(self, backend: Backend, outcome: Outcome) -> None:
        outcome.solo = backend.inflight == 0
        backend.started += 1
        outcome._epoch = backend.started
        backend.inflight += 1
        self._metrics.inflight.labels(backend.name).inc()

    def _end(self, backend: Backend, resp: aiohttp.ClientResponse, outcome: Outcome) -> None:
        # Solo: nothing was running when it began and nothing began after it.
        outcome.solo = outcome.solo and backend.started == outcome._epoch
        backend.inflight -= 1
        self._metrics.inflight.labels(backend.name).dec()
        if outcome.completed or not backend.drain_on_abort:
            resp.close()  # a no-op when complete; otherwise this is what cancels upstream
            return
        task = asyncio.create_task(self._drain(backend, resp))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def _drain(self, backend: Backend, resp: aiohttp.ClientResponse) -> None:
        """Let the backend finish an aborted generation instead of cutting it off."""
        try:
            while await resp.content.readany():
                pass
        except (TimeoutError, *CONNECT_ERRORS):
            pass
        finally:
            resp.close()
            log.debug("drained aborted request on %s", backend.name)

    async def close(self) -> None:
        for task in list(self._drains):
            task.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)
