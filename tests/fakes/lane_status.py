"""An ``on_change`` callback for LaneSupervisor that remembers every status it reported and
every worker process it ran, and lets a test wait for the nth time a state is reached."""

from __future__ import annotations

import asyncio

import psutil

from router.lanes.supervisor import LaneState, LaneStatus


class Recorder:
    def __init__(self, deadline: float = 30.0) -> None:
        self.deadline = deadline
        self.history: list[LaneStatus] = []
        self.procs: dict[int, psutil.Process] = {}  # every worker pid seen, create-time safe
        self._changed = asyncio.Event()

    def __call__(self, status: LaneStatus) -> None:
        self.history.append(status)
        if status.pid is not None and status.pid not in self.procs:
            try:
                self.procs[status.pid] = psutil.Process(status.pid)
            except psutil.NoSuchProcess:
                pass
        self._changed.set()

    @property
    def states(self) -> list[LaneState]:
        return [s.state for s in self.history]

    async def wait_for(self, state: LaneState, nth: int = 1) -> LaneStatus:
        async with asyncio.timeout(self.deadline):
            while True:
                matches = [s for s in self.history if s.state is state]
                if len(matches) >= nth:
                    return matches[nth - 1]
                self._changed.clear()
                await self._changed.wait()

    def survivors(self) -> list[int]:
        """Worker pids still running (zombies excluded)."""
        alive = []
        for pid, proc in self.procs.items():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return alive
