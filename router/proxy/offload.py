"""A request's CPU work off the event loop: decoding a large body, translating it, encoding
the request to forward.

Every transform of a request is linear in its size, but a large one still takes long in
Python (a translated 8 MiB conversation, a follow-up that replays a long stored
conversation), and the loop that runs it answers nothing else meanwhile (``/healthz``, every
other client's stream). So work over more than ``INLINE_BYTES`` runs on a small pool of
threads (``CpuPool``); smaller work runs inline, where it costs less than the hop to a
thread.

What a thread does not give back: the GIL. Python code in a thread yields it to the loop
every few milliseconds (``sys.getswitchinterval``), but one C call holds it until it returns:
an orjson parse or encode of the whole body. Those are linear and fast (tens of
milliseconds for the largest body ``max_body_bytes`` admits, made of tiny containers);
they are the bound on how long a request can hold the loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

INLINE_BYTES = 64 * 1024
# Threads of the pool: more would only queue on the GIL; waiting work waits in the pool's
# queue, which holds at most one item per request in flight (bounded by max_connections).
WORKERS = max(1, min(4, os.cpu_count() or 1))

P = ParamSpec("P")
T = TypeVar("T")


class CpuPool:
    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="speclane-cpu")
        self.offloaded = 0  # calls run on a thread (tests read it)

    async def run(self, size: int, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)``, on a thread when ``size`` (the bytes it works over) is
        more than ``INLINE_BYTES``. ``fn`` must touch nothing the loop changes meanwhile (the
        translators are pure). Its exception is raised here; a caller that goes away leaves
        the thread to finish its call and throw the result away."""
        if size <= INLINE_BYTES:
            return fn(*args, **kwargs)
        self.offloaded += 1
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
