from __future__ import annotations

import asyncio
import threading

import pytest

from router.worker.engines.jobs import Job, JobQueue
from router.worker.request.protocol import GenerationRequest


def job() -> Job:
    loop = asyncio.new_event_loop()
    loop.close()  # never used: these jobs are only queued, never answered
    return Job(GenerationRequest(kind="chat"), [1], loop)


def test_job_queue_is_fifo_and_removes_cancelled_jobs() -> None:
    queue = JobQueue()
    a, b, c = job(), job(), job()
    for j in (a, b, c):
        queue.put(j)
    assert queue.remove(b) and not queue.remove(b)
    assert len(queue) == 2
    assert queue.get(block=False) is a
    assert queue.get(block=False) is c
    assert queue.get(block=False) is None


def test_closing_wakes_a_waiting_thread_and_returns_the_unstarted_jobs() -> None:
    queue = JobQueue()
    got: list[Job | None] = []
    waiter = threading.Thread(target=lambda: got.append(queue.get(block=True)))
    waiter.start()
    assert queue.close() == []
    waiter.join(5)
    assert got == [None]
    with pytest.raises(RuntimeError):
        queue.put(job())


def test_close_hands_back_what_never_ran() -> None:
    queue = JobQueue()
    a = job()
    queue.put(a)
    assert queue.close() == [a]
    assert queue.get(block=True) is None


def test_a_queue_wait_with_a_timeout_says_whether_a_job_came() -> None:
    queue = JobQueue()
    assert queue.wait(0.01) is False  # nothing came
    threading.Timer(0.05, lambda: queue.put(object())).start()  # type: ignore[arg-type]
    assert queue.wait(5.0) is True
    queue.close()
    assert queue.wait(0.01) is False and queue.wait() is False
