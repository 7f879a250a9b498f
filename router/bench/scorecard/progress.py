"""The progress line: cells done, the cell in flight, elapsed time and the time left. On a
terminal one line is redrawn in place every second, so that the clock moves while a slow cell
runs; elsewhere (a log, CI) one line is printed per finished cell."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from router.bench.scorecard.plan import Cell
from router.bench.scorecard.records import CellRun

BAR_WIDTH = 24


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    hours, rest = divmod(max(0, round(seconds)), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    def __init__(self, estimates: Sequence[float], total: int, out: TextIO | None = None) -> None:
        self.estimates, self.total, self.out = estimates, total, out or sys.stderr
        self.tty = self.out.isatty()
        self.started = self.cell_started = time.monotonic()
        self.done, self.done_seconds = 0, 0.0
        self.cell: Cell | None = None
        self.finished = self.expected = 0  # requests of the cell in flight
        self.ticker: asyncio.Task[None] | None = None

    def time_left(self, now: float) -> float | None:
        """The estimates left, scaled by how far off they were so far; without estimates, the
        average cell so far."""
        done_estimate = sum(self.estimates[: self.done])
        if self.estimates and done_estimate > 0 and self.done_seconds > 0:
            left = sum(self.estimates[self.done :]) * self.done_seconds / done_estimate
        elif self.estimates:
            left = sum(self.estimates[self.done :])
        elif self.done:
            left = self.done_seconds / self.done * (self.total - self.done)
        else:
            return None
        return max(0.0, left - (now - self.cell_started if self.cell else 0.0))

    def line(self) -> str:
        now = time.monotonic()
        filled = BAR_WIDTH * self.done // self.total if self.total else BAR_WIDTH
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        what = f" {self.cell.label} ({self.finished}/{self.expected} requests)" if self.cell else ""
        elapsed, left = clock(now - self.started), clock(self.time_left(now))
        return f"[{bar}] {self.done}/{self.total} cells{what} | {elapsed} elapsed, ~{left} left"

    def start_cell(self, cell: Cell, expected_requests: int) -> None:
        self.cell, self.cell_started = cell, time.monotonic()
        self.finished, self.expected = 0, expected_requests
        self.draw()

    def request_done(self) -> None:
        self.finished += 1
        self.draw()

    def cell_done(self, run: CellRun) -> None:
        self.done, self.cell = self.done + 1, None
        self.done_seconds += run.seconds
        if not self.tty:
            text = f"  {run.cell.label}: {len(run.measurements)} requests in {run.seconds:.1f}s"
            print(f"{text} | {self.line()}", file=self.out, flush=True)
        self.draw()

    def start_ticking(self) -> None:
        if self.tty:
            self.ticker = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.draw()

    def close(self) -> None:
        if self.ticker:
            self.ticker.cancel()
        self.draw("\n")

    def draw(self, end: str = "") -> None:
        if self.tty:
            self.out.write("\r\033[K" + self.line() + end)
            self.out.flush()
