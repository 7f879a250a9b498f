"""A request travelling from the aiohttp loop to the generation thread and its answer coming back.

The loop creates a ``Job`` and puts it into a ``JobQueue``; the generation thread takes it, and
sends events back through ``Job.emit`` (thread-safe: it schedules ``put_nowait`` on the loop).
Cancelling is a flag the generation thread reads once per decoding step, plus removal from the
queue so that a job that never started is gone at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass

from router.kernel.errors import RouterError
from router.worker.engines.logprobs import TokenLogprob
from router.worker.engines.promptcache import Segment
from router.worker.request.protocol import GenerationRequest


@dataclass(frozen=True)
class TextDelta:
    text: str
    # The log-probabilities of the tokens whose text this delta completes (a request that
    # asked; ``router.worker.engines.logprobs.Aligner``).
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop" | "length"
    usage: dict[str, object]
    stop_string: str | None = None  # the stop string that ended generation, if one did


@dataclass(frozen=True)
class Failed:
    error: RouterError


Event = TextDelta | Finished | Failed


def aborted() -> Failed:
    error = RouterError(503, "generation aborted", type="service_unavailable", code="aborted")
    return Failed(error)


class Job:
    def __init__(
        self,
        request: GenerationRequest,
        prompt_ids: list[int],
        loop: asyncio.AbstractEventLoop,
        *,
        partition: str = "",
        segments: tuple[Segment, ...] = (),
    ) -> None:
        self.request = request
        self.prompt_ids = prompt_ids
        self.partition = partition  # the prompt cache's partition: entries of others are unseen
        # Prompt positions stored as prompt-cache entries of their own (the system prompt's end).
        self.segments = segments
        # Set on the generation thread when the decoding constraint fails mid-answer: the
        # answer then ends with an error (``Engine._answer``), never a clean finish.
        self.constraint_error: str | None = None
        self.prediction_ids: list[int] = []  # the tokenized ``prediction``, if any
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = threading.Event()
        # ``n > 1``: the first choice's job leaves its prompt's KV state in the prompt cache
        # once prefilled, and says so (``prefilled``, also set when it ends), so that the
        # others start from it instead of prefilling the prompt again.
        self.shares_prefill = False
        self.prefilled = asyncio.Event()
        self._loop = loop

    def constraint_failed(self, message: str) -> None:
        self.constraint_error = message

    def emit(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            pass  # the loop is closed: the worker is exiting and nobody is listening

    def prefill_done(self) -> None:
        """Its prompt is in the prompt cache, or it never will be (from any thread)."""
        try:
            self._loop.call_soon_threadsafe(self.prefilled.set)
        except RuntimeError:
            pass


class JobQueue:
    """A FIFO the generation thread blocks on, from which a cancelled job can be removed.

    ``cond``: shared by several queues (the shared worker's two lanes), so that one thread can
    sleep until any of them has work (``wait_any``)."""

    def __init__(self, cond: threading.Condition | None = None) -> None:
        self._items: deque[Job] = deque()
        self._cond = cond if cond is not None else threading.Condition()
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put(self, job: Job) -> None:
        with self._cond:
            if self.closed:
                raise RuntimeError("the worker is shutting down")
            self._items.append(job)
            self._cond.notify()

    def get(self, block: bool) -> Job | None:
        """The next job; None when empty and not blocking, or when closed."""
        with self._cond:
            while block and not self._items and not self.closed:
                self._cond.wait()
            return self._items.popleft() if self._items and not self.closed else None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a job is queued (True) or the queue is closed (False); ``timeout``:
        at most that many seconds (False if none came)."""
        with self._cond:
            if timeout is None:
                while not self._items and not self.closed:
                    self._cond.wait()
            else:
                self._cond.wait_for(lambda: bool(self._items) or self.closed, timeout)
            return bool(self._items) and not self.closed

    def remove(self, job: Job) -> bool:
        with self._cond:
            try:
                self._items.remove(job)
            except ValueError:
                return False
            return True

    def close(self) -> list[Job]:
        """Refuse new jobs, wake the waiting thread, and hand back the jobs that never started."""
        with self._cond:
            self.closed = True
            left = list(self._items)
            self._items.clear()
            self._cond.notify_all()
            return left


def wait_any(queues: list[JobQueue], timeout: float | None = None) -> None:
    """Block until one of ``queues`` (sharing one condition) holds a job or all are closed;
    ``timeout``: at most that many seconds."""
    cond = queues[0]._cond
    assert all(q._cond is cond for q in queues), "the queues must share one condition"
    with cond:
        cond.wait_for(
            lambda: any(q._items for q in queues) or all(q.closed for q in queues), timeout
        )
