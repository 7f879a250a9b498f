"""The lane's tokenizer threads: short work never waits behind long work.

Tokenizing runs off the event loop on two threads, each a queue with generation first:
preparing a generation request (template, encode, constraint) goes before counting tokens
(``/v1/tokenize``, Anthropic's count_tokens), so a flood of counts delays another client's
generation by at most the one count already running, never by the whole queue of them.
Within a priority, first come first served.

Work on a prompt of ``LONG_CHARS`` characters or more goes to the second thread, so one
client's huge prompt (its size is already bounded by what the context could hold:
``router.worker.request.protocol.fits_context``) never holds up another client's short one.
Both threads share the lane's tokenizer: a fast (Rust) tokenizer's encode is safe from
several threads at once and releases the GIL while it runs; what is not safe is changing its
padding or truncation, which nothing here does.
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
# From this size a prompt's encode takes tens of milliseconds or more (about 3 us a
# character for the default model's tokenizer on this CPU).
LONG_CHARS = 32_768

_Item = tuple[int, int, Callable[[], Any] | None, "Future[Any] | None"]


class _Worker:
    """One thread and its priority queue."""

    def __init__(self, name: str) -> None:
        self.queue: queue.PriorityQueue[_Item] = queue.PriorityQueue()
        self._order = itertools.count()  # FIFO within a priority; never compares callables
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, priority: int, call: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self.queue.put((priority, next(self._order), call, future))
        return future

    def shutdown(self) -> None:
        while True:
            try:
                _, _, _, future = self.queue.get_nowait()
            except queue.Empty:
                break
            if future is not None:
                future.cancel()
        self.queue.put((-1, -1, None, None))

    def _run(self) -> None:
        while True:
            _, _, fn, future = self.queue.get()
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


class TokenizerThread:
    def __init__(self, name: str = "tokenize") -> None:
        self._short = _Worker(name)
        self._long = _Worker(f"{name}-long")

    def submit(self, priority: int, fn: Callable[..., T], *args: Any, size: int = 0) -> Future[T]:
        """``size``: the prompt's characters (``LONG_CHARS`` or more: the long thread)."""
        worker = self._long if size >= LONG_CHARS else self._short
        return worker.submit(priority, lambda: fn(*args))

    async def run(self, priority: int, fn: Callable[..., T], *args: Any, size: int = 0) -> T:
        """``fn(*args)`` on a thread; a caller that is cancelled leaves the queue (its item
        is skipped when its turn comes)."""
        future = self.submit(priority, fn, *args, size=size)
        try:
            return await asyncio.wrap_future(future)
        finally:
            future.cancel()  # a no-op once it ran or is running

    def waiting(self) -> int:
        return self._short.queue.qsize() + self._long.queue.qsize()

    def shutdown(self) -> None:
        """Stop after the items running now; items still queued are cancelled."""
        self._short.shutdown()
        self._long.shutdown()
