"""A stream's response begun before its answer exists, so that a client waiting for a model
to load, or for a long prompt to prefill, sees bytes and does not time out.

Two waits begin it. While a request's model loads (``router.proxy.ondemand``), a streaming
request gets its headers after ``FIRST_TICK`` seconds and then a keep-alive every ``TICK``
seconds. While the relay waits for the upstream's first chunk (``keeping_alive``: a long
prefill, a busy lane, retries), a stream silent for ``client_limits.stream_keepalive``
seconds gets its headers (the decision's ``X-Speclane-*`` among them) and then a keep-alive
every that many seconds. The keep-alive is each door's own no-op (the door's egress
``keep_alive``): an SSE comment (``: loading <model> <n>s``, ``: waiting <n>s``) on the OpenAI
and Responses streams, which every SSE client skips; Anthropic's ``event: ping``, which its
SDK skips; on Ollama's NDJSON, which has no comments, a chunk with empty content (what Ollama
itself sends for a step without text; the ``ollama`` libraries read every line as JSON, so a
blank line would break them).

From then on the relay writes into this response, and a failure that would have been an
HTTP error (the load failed, no lane, the upstream refused, every retry failed) ends the
stream with an error event in the door's shape instead. Retries go on after keep-alives
began: the client has seen nothing of an answer yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping

from aiohttp import web

from router.kernel import sse
from router.kernel.errors import RouterError
from router.proxy import doorerrors
from router.proxy.relay import SSE_HEADERS, Egress

log = logging.getLogger("speclane.relay")

FIRST_TICK = 2.0  # a load shorter than this changes nothing: the answer's own headers go out
TICK = 5.0


class EarlyStream:
    """The response of one streaming request, begun only if a wait goes on (``tick``)."""

    def __init__(
        self,
        request: web.Request,
        content_type: str,
        ending: Callable[[RouterError], bytes],
        keep_alive: Callable[[str], bytes] = sse.comment,
    ) -> None:
        self._request = request
        self._content_type = content_type
        self._ending = ending
        self._keep_alive = keep_alive
        self.response: web.StreamResponse | None = None  # set once the headers went out

    async def _begin(self, headers: Mapping[str, str] | None = None) -> web.StreamResponse:
        if self.response is None:
            out = {**(headers or {}), **SSE_HEADERS, "Content-Type": self._content_type}
            response = web.StreamResponse(status=200, headers=out)
            await response.prepare(self._request)
            self.response = response
        return self.response

    async def tick(self, model: str, waited: float) -> None:
        """Called while the request waits for ``model`` to load, ``waited`` seconds so far."""
        response = await self._begin()
        await response.write(self._keep_alive(f"loading {model} {waited:.0f}s"))

    @contextlib.asynccontextmanager
    async def keeping_alive(self, every: float, headers: Mapping[str, str]) -> AsyncIterator[None]:
        """Around a wait for the upstream's first chunk: once it has lasted ``every``
        seconds, the response begins (with ``headers``) and a keep-alive goes out every
        ``every`` seconds until the block ends. A wait shorter than that costs one timer."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        done = asyncio.Event()
        task: asyncio.Task[None] | None = None

        def start() -> None:
            nonlocal task
            task = loop.create_task(self._keep_alive_loop(every, began, headers, done))

        timer = loop.call_later(every, start)
        try:
            yield
        finally:
            timer.cancel()
            done.set()
            if task is not None:
                # Not cancelled: a response cut inside prepare() could not be written to.
                # It ends after the write it is in, or at once from its wait.
                await asyncio.wait({task})

    async def _keep_alive_loop(
        self, every: float, began: float, headers: Mapping[str, str], done: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            response = await self._begin(headers)
            while True:  # the first keep-alive goes with the headers, whatever came meanwhile
                await response.write(self._keep_alive(f"waiting {loop.time() - began:.0f}s"))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), every)
                    return
        except ConnectionResetError:
            pass  # the client left: its handler is cancelled, or its next write says so
        except Exception:  # nothing waits for this task's result: said here, not lost
            log.exception("keep-alive of a waiting stream failed")

    async def fail(self, err: RouterError) -> web.StreamResponse:
        """End the begun stream with ``err`` in the door's shape (its headers said 200)."""
        assert self.response is not None
        try:
            await self.response.write(self._ending(err))
            await self.response.write_eof()
        except ConnectionResetError:
            pass  # the client left: nobody to tell
        return self.response


def early_stream(
    request: web.Request, api: doorerrors.Api, stream: bool, egress: Egress | None = None
) -> EarlyStream | None:
    """An EarlyStream for a streaming request, else None; framed as the door's ``egress``
    frames its stream (its content type, error event and keep-alive), by default OpenAI's."""
    if not stream:
        return None
    if egress is None:
        return EarlyStream(
            request,
            SSE_HEADERS["Content-Type"],
            lambda err: doorerrors.stream_error(err, api),
            sse.comment,
        )
    return EarlyStream(request, egress.stream_content_type, egress.error, egress.keep_alive)
