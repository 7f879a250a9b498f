"""One background task that runs a step every ``interval`` seconds until stopped: the
health checks, the counter scraping, the status history and the policy watcher.

The next step starts ``interval`` seconds after the previous one ended (a slow step delays
the next rather than piling up). A step that raises ends the task (its owner sees the
exception in ``task``) unless ``on_error`` is given: then the error is handed to it and
the steps go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable

Step = Callable[[], Awaitable[object] | object]


class Periodic:
    def __init__(
        self,
        name: str,
        step: Step,
        interval: float,
        *,
        wait_first: bool = False,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.name = name
        self.interval = interval
        self.task: asyncio.Task[None] | None = None
        self._step = step
        self._wait_first = wait_first  # the first step after one interval, not at once
        self._on_error = on_error

    def start(self) -> asyncio.Task[None]:
        if self.task is None:
            self.task = asyncio.create_task(self.run(), name=self.name)
        return self.task

    async def stop(self) -> None:
        """Cancel the task and wait for it; an error it ended with is raised here."""
        task, self.task = self.task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def run(self) -> None:
        if self._wait_first:
            await asyncio.sleep(self.interval)
        while True:
            try:
                result = self._step()
                if inspect.isawaitable(result):
                    await result
            except Exception as e:
                if self._on_error is None:
                    raise
                self._on_error(e)
            await asyncio.sleep(self.interval)
