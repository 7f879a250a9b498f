"""The progress line: cells done, the cell in flight, elapsed time and the time left.

On a terminal one line is redrawn in place (and every second, so the clock moves while a
slow cell runs); elsewhere (a log, CI) one line is printed per finished cell.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from router.bench.scorecard.plan import Cell, eta
from router.bench.scorecard.records import CellRun, Measurement

BAR_WIDTH = 24


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def render(done: int, total: int, cell: Cell | None, requests: str, elapsed: float,
           left: float | None) -> str:
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    what = f" {cell.label} {requests}" if cell else ""
    return f"[{bar}] {done}/{total} cells{what} | {clock(elapsed)} elapsed, ~{clock(left)} left"


class Progress:
    def __init__(self, estimates: Sequence[float] | None, total: int,
                 out: TextIO | None = None, enabled: bool = True) -> None:
        self.estimates = list(estimates) if estimates else None
        self.total = total
        self.out = out or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.out.isatty()
        self.started = time.monotonic()
        self.done = 0
        self.done_seconds = 0.0
        self.cell: Cell | None = None
        self.cell_t0 = self.started
        self.cell_requests = (0, 0)
        self._ticker: asyncio.Task[None] | None = None

    def time_left(self, now: float) -> float | None:
        in_cell = now - self.cell_t0 if self.cell else 0.0
        if self.estimates is None:
            if not self.done:
                return None
            per_cell = self.done_seconds / self.done
            return max(0.0, per_cell * (self.total - self.done) - in_cell)
        done_estimate = sum(self.estimates[: self.done])
        remaining = sum(self.estimates[self.done:])
        return max(0.0, eta(remaining, done_estimate, self.done_seconds) - in_cell)

    def line(self) -> str:
        now = time.monotonic()
        finished, expected = self.cell_requests
        requests = f"({finished}/{expected} requests)" if self.cell else ""
        return render(self.done, self.total, self.cell, requests, now - self.started,
                      self.time_left(now))

    def cell_started(self, index: int, cell: Cell, expected_requests: int) -> None:
        self.cell = cell
        self.cell_t0 = time.monotonic()
        self.cell_requests = (0, expected_requests)
        self._draw()

    def request_done(self, m: Measurement) -> None:
        finished, expected = self.cell_requests
        self.cell_requests = (finished + 1, expected)
        self._draw()

    def cell_done(self, index: int, run: CellRun) -> None:
        self.done = index + 1
        self.done_seconds += run.seconds
        self.cell = None
        if self.enabled and not self.tty:
            print(f"  {run.cell.label}: {len(run.measurements)} requests in "
                  f"{run.seconds:.1f}s | {self.line()}", file=self.out, flush=True)
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
            self._ticker = None
        if self.tty:
            self.out.write("\r\033[K" + self.line() + "\n")
            self.out.flush()

    def _draw(self) -> None:
        if self.tty:
            self.out.write("\r\033[K" + self.line())
            self.out.flush()
