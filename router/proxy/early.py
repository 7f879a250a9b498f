"""A stream's response begun before its answer exists, so that a client waiting for a model
to load sees bytes and does not time out.

While a request's model loads (``router.proxy.ondemand``), a streaming request on an SSE
door (OpenAI, Anthropic, Responses) gets its headers after ``FIRST_TICK`` seconds and then a
comment line (``: loading <model> <n>s``) every ``TICK`` seconds: every SSE client skips
comments. From then on the relay writes into this response, and a failure that would have
been an HTTP error (the load failed, no lane, the upstream refused) ends the stream with an
error event in the door's shape instead. Ollama's NDJSON has no comments: its streams wait
without bytes (Ollama's own clients set no read timeout).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from router import errors
from router.errors import RouterError
from router.proxy.relay import SSE_HEADERS

FIRST_TICK = 2.0  # a load shorter than this changes nothing: the answer's own headers go out
TICK = 5.0


class EarlyStream:
    """The response of one streaming request, begun only if a wait goes on (``tick``)."""

    def __init__(
        self,
        request: web.Request,
        content_type: str,
        ending: Callable[[RouterError], bytes],
    ) -> None:
        self._request = request
        self._content_type = content_type
        self._ending = ending
        self.response: web.StreamResponse | None = None  # set once the headers went out

    async def tick(self, model: str, waited: float) -> None:
        """Called while the request waits for ``model`` to load, ``waited`` seconds so far."""
        if self.response is None:
            headers = {**SSE_HEADERS, "Content-Type": self._content_type}
            self.response = web.StreamResponse(status=200, headers=headers)
            await self.response.prepare(self._request)
        await self.response.write(f": loading {model} {waited:.0f}s\n\n".encode())

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
    request: web.Request,
    api: errors.Api,
    stream: bool,
    content_type: str | None = None,
    ending: Callable[[RouterError], bytes] | None = None,
) -> EarlyStream | None:
    """An EarlyStream for a streaming request on an SSE door, else None. ``content_type``
    and ``ending``: the door's (its egress'), by default OpenAI's."""
    if not stream or api == "ollama":
        return None
    return EarlyStream(
        request,
        content_type or SSE_HEADERS["Content-Type"],
        ending or (lambda err: errors.stream_error(err, api)),
    )
