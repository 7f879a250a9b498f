"""Is a lane that has gone quiet still working? Read from its progress counter.

A lane worker answers a request only with its first token, and the batching lane prefills a
long prompt in chunks between decoding steps: minutes of silence on the request's own
connection while the lane works. The worker's ``/health`` carries ``progress_tokens``
(prompt tokens prefilled plus tokens generated, all requests), which only grows while its
generation thread works. ``still_working_callback`` gives the upstream client's optional
``still_working()`` hook for one request: consulted when the silence deadline passes, it
says True when the counter moved since the previous look, so the router does not answer
504 for a lane that is prefilling, and does for one that hangs.

``progress_moved`` is the decision (pure); the callback only adds the HTTP read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp

PROGRESS_FIELD = "progress_tokens"
HEALTH_TIMEOUT = 5.0  # /health is answered by the worker's event loop, never by generation

StillWorking = Callable[[], Awaitable[bool]]


def progress_of(health: Mapping[str, Any] | None) -> int | None:
    """The progress counter of a /health body, or None when absent or malformed."""
    if not isinstance(health, Mapping):
        return None
    value = health.get(PROGRESS_FIELD)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def progress_moved(last: int | None, current: int | None, busy: bool) -> bool:
    """Whether the lane worked since ``last`` (None: no earlier reading).

    Without an earlier reading, a lane that reports work in hand (``busy``) gets the benefit
    of the doubt once: the next silence period decides. A counter that went down means a
    new worker process (a restart): the request's own worker is gone.
    """
    if current is None:
        return False
    if last is None:
        return busy
    return current > last


def still_working_callback(
    root_url: str,
    baseline: int | None = None,
    timeout: float = HEALTH_TIMEOUT,
    headers: Mapping[str, str] | None = None,
) -> StillWorking:
    """The ``still_working()`` hook for one request to the lane worker at ``root_url``
    (``http://127.0.0.1:PORT``, without ``/v1``).

    ``baseline``: the counter when the request was sent, if known (e.g. from the
    supervisor's last /health snapshot); otherwise the first look sets it. ``headers``:
    sent with each look (the worker secret).
    """
    last = baseline

    async def still_working() -> bool:
        nonlocal last
        health = await read_health(root_url, timeout, headers)
        current = progress_of(health)
        busy = bool(health) and (_count(health, "active") + _count(health, "queued")) > 0
        moved = progress_moved(last, current, busy)
        if current is not None:
            last = current
        return moved

    return still_working


def for_lane(
    base_url: str, reported: Mapping[str, Any] | None, headers: Mapping[str, str] | None = None
) -> StillWorking:
    """The hook for a request to a lane backend: ``base_url`` is its OpenAI base (``/v1``),
    ``reported`` the supervisor's last /health snapshot of it (``Backend.reported``), whose
    counter is the baseline. The relay passes this to the upstream client for lane backends
    (``still_working=for_lane(backend.base_url, backend.reported) if backend.lane else
    None``); ``headers``: the backend's (its worker secret)."""
    return still_working_callback(
        base_url.removesuffix("/v1"), progress_of(reported), headers=headers
    )


async def read_health(
    root_url: str, seconds: float = HEALTH_TIMEOUT, headers: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """GET /health (a fresh connection: this runs once per silence period at most)."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=seconds)) as s:
            async with s.get(f"{root_url.rstrip('/')}/health", headers=headers) as resp:
                if resp.status != 200:
                    return None
                body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _count(health: Mapping[str, Any] | None, key: str) -> int:
    value = (health or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
