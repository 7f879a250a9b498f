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

from router.proxy.connections import read_body
from router.proxy.request import load_object
from router.proxy.services import Services


async def read_raw(services: Services, request: web.Request) -> bytes:
    return await read_body(request, services.settings.client_limits.body_timeout)


async def read_object(services: Services, request: web.Request) -> dict[str, Any]:
    raw = await read_raw(services, request)
    return await services.cpu.run(len(raw), load_object, raw)
