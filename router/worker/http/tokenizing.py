"""The lane's one tokenizer thread, with generation first.

Every use of the shared tokenizer runs on one thread (never two encodes at once on it), but
not in arrival order: preparing a generation request (template, encode, constraint) goes
before counting tokens (``/v1/tokenize``, Anthropic's count_tokens), so a flood of counts
delays another client's generation by at most the one count already running, never by the
whole queue of them. Within a priority, first come first served.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

GENERATION = 0  # preparing a request for the engine
COUNT = 1  # counting a prompt's tokens: nothing waits on it but its own client

_Item = tuple[int, int, Callable[[], Any] | None, "Future[Any] | None"]


class TokenizerThread:
    def __init__(self, name: str = "tokenize") -> None:
        self._queue: queue.PriorityQueue[_Item] = queue.PriorityQueue()
        self._order = itertools.count()  # FIFO within a priority; never compares callables
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, priority: int, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        self._queue.put((priority, next(self._order), lambda: fn(*args), future))
        return future

    async def run(self, priority: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread; a caller that is cancelled leaves the queue (its item
        is skipped when its turn comes)."""
        future = self.submit(priority, fn, *args)
        try:
            return await asyncio.wrap_future(future)
        finally:
            future.cancel()  # a no-op once it ran or is running

    def waiting(self) -> int:
        return self._queue.qsize()

    def shutdown(self) -> None:
        """Stop after the item running now; items still queued are cancelled."""
        while True:
            try:
                _, _, _, future = self._queue.get_nowait()
            except queue.Empty:
                break
            if future is not None:
                future.cancel()
        self._queue.put((-1, -1, None, None))

    def _run(self) -> None:
        while True:
            _, _, fn, future = self._queue.get()
            if fn is None or future is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as e:
                future.set_exception(e)
            else:
                future.set_result(result)
