"""The one way every endpoint reads its request body.

``read_raw``: the bytes, under the one size limit (``max_body_bytes``: aiohttp's
``client_max_size``, a 413) and the one deadline (``client_limits.body_timeout``, a 408), a
body that cannot be decoded (broken chunked framing, bad gzip) a 400, each in the caller's
API shape (``router.proxy.connections.read_body``). ``read_object``: those bytes as a JSON
object under the one depth rule (``router.proxy.request.load_object``), decoded off the
event loop when large (``router.proxy.offload``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from router.appkeys import SETTINGS
from router.proxy.connections import read_body
from router.proxy.offload import off_loop
from router.proxy.request import load_object


async def read_raw(request: web.Request) -> bytes:
    return await read_body(request, request.app[SETTINGS].client_limits.body_timeout)


async def read_object(request: web.Request) -> dict[str, Any]:
    raw = await read_raw(request)
    return await off_loop(request.app, len(raw), load_object, raw)
