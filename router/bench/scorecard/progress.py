"""The progress line: cells done, the cell in flight, elapsed time and the time left. On a
terminal one line is redrawn in place, every second so that the clock moves while a slow
cell runs; elsewhere (a log, CI) one line is printed per finished cell."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from router.bench.scorecard.plan import Cell
from router.bench.scorecard.records import CellRun, Measurement

BAR_WIDTH = 24


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    hours, rest = divmod(max(0, round(seconds)), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def eta(remaining_estimate: float, done_estimate: float, done_actual: float) -> float:
    """Seconds left: the remaining estimate, scaled by how far off the estimate was so far."""
    if done_estimate <= 0 or done_actual <= 0:
        return remaining_estimate
    return remaining_estimate * done_actual / done_estimate


def render(
    done: int, total: int, cell: Cell | None, requests: str, elapsed: float, left: float | None
) -> str:
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    what = f" {cell.label} {requests}" if cell else ""
    return f"[{bar}] {done}/{total} cells{what} | {clock(elapsed)} elapsed, ~{clock(left)} left"


class Progress:
    def __init__(
        self,
        estimates: Sequence[float] | None,
        total: int,
        out: TextIO | None = None,
        enabled: bool = True,
    ) -> None:
        self.estimates, self.total, self.out = list(estimates or ()), total, out or sys.stderr
        self.enabled, self.tty = enabled, enabled and self.out.isatty()
        self.started = self.cell_t0 = time.monotonic()
        self.done, self.done_seconds = 0, 0.0
        self.cell: Cell | None = None
        self.finished = self.expected = 0  # requests of the cell in flight
        self._ticker: asyncio.Task[None] | None = None

    def time_left(self, now: float) -> float | None:
        """The estimates left, scaled by how far off they were so far; without estimates,
        the average cell so far."""
        if self.estimates:
            done, left = self.estimates[: self.done], self.estimates[self.done :]
            left_s = eta(sum(left), sum(done), self.done_seconds)
        elif self.done:
            left_s = self.done_seconds / self.done * (self.total - self.done)
        else:
            return None
        return max(0.0, left_s - (now - self.cell_t0 if self.cell else 0.0))

    def line(self) -> str:
        now = time.monotonic()
        requests = f"({self.finished}/{self.expected} requests)" if self.cell else ""
        elapsed = now - self.started
        return render(self.done, self.total, self.cell, requests, elapsed, self.time_left(now))

    def cell_started(self, index: int, cell: Cell, expected_requests: int) -> None:
        self.cell, self.cell_t0 = cell, time.monotonic()
        self.finished, self.expected = 0, expected_requests
        self._draw()

    def request_done(self, m: Measurement) -> None:
        self.finished += 1
        self._draw()

    def cell_done(self, index: int, run: CellRun) -> None:
        self.done, self.cell = index + 1, None
        self.done_seconds += run.seconds
        if self.enabled and not self.tty:
            print(
                f"  {run.cell.label}: {len(run.measurements)} requests in "
                f"{run.seconds:.1f}s | {self.line()}",
                file=self.out,
                flush=True,
            )
        self._draw()

    def start_ticking(self) -> None:
        if self.tty and self._ticker is None:
            self._ticker = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._draw()

    def close(self) -> None:
        if self._ticker:
            self._ticker.cancel()
        self._draw("\n")

    def _draw(self, end: str = "") -> None:
        if self.tty:
            self.out.write("\r\033[K" + self.line() + end)
            self.out.flush()
