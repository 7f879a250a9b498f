"""Spawn, health-check, restart and stop the MLX lane workers.

Lifecycle of one lane (the worker's side of the contract: ``router.kernel.worker_contract``):

- ``start()`` spawns the worker in its own session, reads its stdout until the ready
  line announces the port, then polls ``GET /health`` until it answers, all against
  one start-up deadline. An exit during start-up fails at once with the exit code and
  the stderr tail; a missed deadline kills the process. Either raises WorkerStartError,
  but for a group whose ring could not set up its sockets: that start is tried again on
  fresh ports (``router.lanes.rankgroup``).
- A monitor task then checks ``/health`` every ``health_interval``; each answer goes to
  ``on_health`` (the lane's backends mirror it: its queue, its figures), each change of state
  to ``on_change``. A worker that exits,
  or fails ``unhealthy_after`` checks in a row (hung: killed), takes the lane DOWN and is
  restarted after a jittered exponential backoff. More than ``max_restarts`` restarts
  within ``restart_window`` gives the lane up (FAILED) with one ERROR log line.
- ``stop(grace)`` sends SIGTERM, waits ``grace``, then SIGKILLs. Every path that
  abandons a process (failure, timeout, cancellation) kills it: no orphans.

One supervisor watches one process. In the shared layout that process serves both lanes
(``WorkerCommand.lanes``): its state is both lanes' state (a crash or hang takes both DOWN
and one restart brings both back), its gauges and restart counters are set for each lane, and
each lane's figures come from its own block of the worker's ``/health`` (``lane_health``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from router.config.settings import LanesSettings
from router.kernel.worker_contract import RING_SETUP_FAILED
from router.lanes.figures import WorkerFigures
from router.lanes.memory import process_memory, tree_memory
from router.lanes.process import WorkerCommand, WorkerProcess, build_worker_command
from router.lanes.rankgroup import RING_START_TRIES, host_memory, ring_setup_failed
from router.lanes.status import (
    LaneState,
    LaneStatus,
    RestartBudget,
    RestartReason,
    StallWatch,
    backoff_delay,
    check_transition,
    lane_health,
)
from router.metrics import Metrics

__all__ = [
    "LaneState",
    "LaneStatus",
    "LaneSupervisor",
    "WorkerCommand",
    "WorkerStartError",
    "build_worker_command",
    "start_all",
    "start_first",
    "stop_all",
]

log = logging.getLogger(__name__)

_STARTUP_POLL = 0.05  # between /health polls while starting


class WorkerStartError(Exception):
    """The worker did not become ready: it exited, timed out or could not be spawned."""

    def __init__(
        self,
        lane: str,
        reason: str,
        *,
        returncode: int | None = None,
        pid: int | None = None,
        stderr_tail: tuple[str, ...] = (),
    ) -> None:
        self.lane = lane
        self.reason = reason
        self.returncode = returncode
        self.pid = pid
        self.stderr_tail = stderr_tail
        message = f"{lane} lane worker failed to start: {reason}"
        if stderr_tail:
            message += "\nlast stderr lines:\n" + "\n".join(f"  {line}" for line in stderr_tail)
        super().__init__(message)


class WorkerLost(Exception):
    """A running worker died or hung; the monitor's retry loop restarts it."""

    def __init__(self, reason: RestartReason, summary: str) -> None:
        super().__init__(summary)
        self.reason = reason
        self.summary = summary


StatusCallback = Callable[[LaneStatus], None]


class LaneSupervisor:
    """Keeps one lane's worker process running; see the module docstring."""

    def __init__(
        self,
        command: WorkerCommand,
        *,
        startup_timeout: float,
        health_interval: float,
        health_timeout: float = 5.0,
        unhealthy_after: int = 3,
        max_restarts: int = 5,
        restart_window: float = 300.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        kill_grace: float = 5.0,
        stall_timeout: float = 0.0,
        metrics: Metrics | None = None,
        on_change: StatusCallback | None = None,
        on_health: StatusCallback | None = None,
        label_suffix: str = "",
    ) -> None:
        if unhealthy_after < 1:
            raise ValueError("unhealthy_after must be >= 1")
        self.command = command
        self.lane = command.lane
        self.lanes = command.lanes
        self.startup_timeout = startup_timeout
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.unhealthy_after = unhealthy_after
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.kill_grace = kill_grace  # for workers we abandon (start-up timeout, hung)
        self.stall_timeout = stall_timeout  # busy without progress this long: stuck (0: off)
        self._metrics = metrics
        self._on_change = on_change  # each change of state
        # Each fresh /health answer while READY: what the router shows and routes by (the
        # worker's queue, its figures) follows the worker, not its state at the last change.
        self._on_health = on_health
        self._status = LaneStatus(lane=self.lane)
        # The lanes' names in metrics: a model loaded on demand has "<lane>@<model>", so its
        # workers never write the start-up model's series (router.lanes.models).
        self._labels = tuple(lane + label_suffix for lane in self.lanes)
        self._figures = {lane: WorkerFigures(lane + label_suffix, metrics) for lane in self.lanes}
        self.memory: dict[str, int] | None = None  # the worker's last RSS and PSS
        self._worker: WorkerProcess | None = None
        self._session: aiohttp.ClientSession | None = None
        self._launch_task: asyncio.Task[None] | None = None
        self._monitor_task: asyncio.Task[None] | None = None
        self._budget = RestartBudget(max_restarts, restart_window)
        self._stopping = False
        self._last_loss: WorkerLost | None = None  # set by _lost(); the next attempt restarts
        self._set_gauge("worker_up", 0)
        self._set_gauge("worker_given_up", 0)

    @classmethod
    def from_settings(
        cls,
        command: WorkerCommand,
        settings: LanesSettings,
        *,
        metrics: Metrics | None = None,
        on_change: StatusCallback | None = None,
        on_health: StatusCallback | None = None,
        label_suffix: str = "",
    ) -> LaneSupervisor:
        return cls(
            command,
            startup_timeout=settings.startup_timeout,
            health_interval=settings.health_interval,
            max_restarts=settings.max_restarts,
            restart_window=settings.restart_window,
            stall_timeout=settings.stall_timeout,
            metrics=metrics,
            on_change=on_change,
            on_health=on_health,
            label_suffix=label_suffix,
        )

    # --- public surface ---------------------------------------------------------------

    @property
    def status(self) -> LaneStatus:
        return self._status

    @property
    def stderr_tail(self) -> tuple[str, ...]:
        """The last stderr lines of the current (or last) worker process."""
        return self._worker.tail() if self._worker else ()

    @property
    def supervising(self) -> bool:
        """True while the monitor task watches (and would restart) the worker."""
        return self._monitor_task is not None and not self._monitor_task.done()

    async def start(self) -> None:
        """Spawn the worker and return once it is READY; raise WorkerStartError otherwise."""
        if self._status.state in (LaneState.STARTING, LaneState.READY, LaneState.DOWN):
            raise RuntimeError(f"{self.lane} lane is already started")
        self._stopping = False
        self._budget = RestartBudget(self.max_restarts, self.restart_window)
        self._last_loss = None
        self._set_gauge("worker_given_up", 0)
        await self._close_session()
        self._session = aiohttp.ClientSession()
        self._launch_task = asyncio.create_task(self._launch(), name=f"{self.lane}-start")
        try:
            await self._launch_task
        except WorkerStartError as e:
            self._update(state=LaneState.FAILED, last_error=e.reason)
            await self._close_session()
            raise
        except asyncio.CancelledError:  # _launch has killed the process already
            self._update(state=LaneState.STOPPED, pid=None, base_url=None, health=None)
            await self._close_session()
            current = asyncio.current_task()
            if self._stopping and not (current and current.cancelling()):
                raise WorkerStartError(self.lane, "stopped during start-up") from None
            raise
        self._monitor_task = asyncio.create_task(self._supervise(), name=f"{self.lane}-monitor")

    async def stop(self, grace: float = 10.0) -> None:
        """Stop the worker (SIGTERM, ``grace`` seconds, SIGKILL). Safe to call repeatedly."""
        self._stopping = True
        tasks = [t for t in (self._launch_task, self._monitor_task) if t and not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)  # their own clean-up kills what they spawned
        if self._worker is not None:
            await self._worker.terminate(grace)
        await self._close_session()
        self._update(state=LaneState.STOPPED, pid=None, base_url=None, health=None)

    # --- start-up ---------------------------------------------------------------------

    async def _launch(self) -> None:
        """One start (``_launch_once``); a group's whose ring could not set up its sockets
        (a port taken since it was found free, a stranger's connection) is started again
        on fresh ports, up to ``RING_START_TRIES`` times, each with its own deadline."""
        for attempt in range(1, RING_START_TRIES + 1):
            try:
                await self._launch_once()
                return
            except WorkerStartError as e:
                again = self.command.fresh_ports and ring_setup_failed(e.stderr_tail)
                if not again or attempt == RING_START_TRIES:
                    raise
                log.warning(
                    "%s lane: the group's ring could not set up its sockets (%s); starting "
                    "again on fresh ports (try %d of %d)",
                    self.lane,
                    next(line for line in e.stderr_tail if RING_SETUP_FAILED in line).strip(),
                    attempt + 1,
                    RING_START_TRIES,
                )

    async def _launch_once(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout
        worker = await self._spawn()
        self._worker = worker
        self._update(state=LaneState.STARTING, pid=worker.pid, base_url=None, health=None)
        try:
            port = await self._await_ready_line(worker, deadline)
            root = f"http://127.0.0.1:{port}"
            health = await self._await_healthy(worker, root, deadline)
        except BaseException:
            await worker.terminate(self.kill_grace)
            raise
        log.info("%s lane: worker pid %d ready on port %d", self.lane, worker.pid, port)
        self._update(state=LaneState.READY, base_url=f"{root}/v1", health=health)

    async def _spawn(self) -> WorkerProcess:
        try:
            return await WorkerProcess.spawn(self.command)
        except OSError as e:
            raise WorkerStartError(self.lane, f"cannot run {self.command.argv[0]}: {e}") from e

    async def _await_ready_line(self, worker: WorkerProcess, deadline: float) -> int:
        timeout = max(0.0, deadline - asyncio.get_running_loop().time())
        done, _ = await asyncio.wait(
            {worker.ready, worker.exited}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if worker.exited in done:
            raise await self._exit_error(worker)
        if not done:
            raise self._timeout_error(worker, "no ready line on stdout")
        return worker.ready.result()

    async def _await_healthy(
        self, worker: WorkerProcess, root: str, deadline: float
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        while True:
            remaining = deadline - loop.time()
            if worker.exited.done():
                raise await self._exit_error(worker)
            if remaining <= 0:
                raise self._timeout_error(worker, "GET /health did not answer")
            health = await self._check_health(root, min(self.health_timeout, remaining))
            if health is not None:
                return health
            await asyncio.wait({worker.exited}, timeout=min(_STARTUP_POLL, max(0.0, remaining)))

    async def _exit_error(self, worker: WorkerProcess) -> WorkerStartError:
        await worker.drain_stderr()
        code = worker.returncode
        return WorkerStartError(
            self.lane,
            f"exited with code {code} during start-up",
            returncode=code,
            pid=worker.pid,
            stderr_tail=worker.tail(),
        )

    def _timeout_error(self, worker: WorkerProcess, what: str) -> WorkerStartError:
        reason = f"not ready within {self.startup_timeout:g}s ({what}); killed"
        return WorkerStartError(self.lane, reason, pid=worker.pid, stderr_tail=worker.tail())

    # --- running ----------------------------------------------------------------------

    async def _supervise(self) -> None:
        """The monitor: serve until lost, then restart with backoff until the budget is spent."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(WorkerLost),
            stop=self._budget_spent,
            wait=self._restart_delay,
            before_sleep=self._log_restart_wait,
            reraise=True,
        )
        try:
            await retrying(self._run_once)
        except WorkerLost as e:
            self._give_up(e)
        except Exception as e:  # a bug here must not leave the lane READY and unwatched
            log.exception("%s lane: supervisor failed", self.lane)
            if self._worker is not None:
                await self._worker.terminate(self.kill_grace)
            self._give_up(WorkerLost("exited", f"supervisor error: {e!r}"))

    async def _run_once(self) -> None:
        """Watch the current worker; on later attempts first spawn a new one."""
        lost = self._last_loss
        if lost is not None:
            self._budget.record(asyncio.get_running_loop().time())
            self._update(restarts=self._status.restarts + 1)
            if self._metrics is not None:
                for label in self._labels:
                    self._metrics.worker_restarts.labels(label, lost.reason).inc()
            try:
                await self._launch()
            except WorkerStartError as e:
                raise self._lost("start_failed", f"restart failed: {e.reason}") from e
        await self._watch(self._require_worker())

    async def _watch(self, worker: WorkerProcess) -> None:
        failures = 0
        stall = StallWatch()
        loop = asyncio.get_running_loop()
        while True:
            done, _ = await asyncio.wait({worker.exited}, timeout=self.health_interval)
            if done:
                await worker.terminate(0)  # collects the stderr tail, kills stragglers
                raise self._lost("exited", f"worker exited with code {worker.returncode}")
            health = await self._check_health(self._root_url(), self.health_timeout)
            if health is not None:
                failures = 0
                self._status = dataclasses.replace(self._status, health=health)
                self._tell(self._on_health, self._status)
                for lane, figures in self._figures.items():
                    figures.observe(lane_health(health, lane))
                self._observe_memory(worker.pid)
                stuck = stall.observe(
                    [lane_health(health, lane) for lane in self.lanes], loop.time()
                )
                if self.stall_timeout and stuck > self.stall_timeout:
                    await worker.terminate(self.kill_grace)
                    raise self._lost(
                        "stalled",
                        f"worker stalled: busy without progress for {stuck:.0f}s "
                        f"(lanes.stall_timeout {self.stall_timeout:g}s)",
                    )
                continue
            if worker.exited.done():
                continue  # reported as an exit on the next turn
            failures += 1
            log.warning(
                "%s lane: health check %d/%d failed (pid %d)",
                self.lane,
                failures,
                self.unhealthy_after,
                worker.pid,
            )
            if failures >= self.unhealthy_after:
                await worker.terminate(self.kill_grace)
                raise self._lost("hung", f"worker hung: {failures} health checks failed in a row")

    async def _check_health(self, root: str, seconds: float) -> dict[str, Any] | None:
        assert self._session is not None
        try:
            async with self._session.get(
                f"{root}/health",
                timeout=aiohttp.ClientTimeout(total=seconds),
                headers=self.command.auth_headers(),
            ) as resp:
                if resp.status != 200:
                    return None
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    # --- restart policy (tenacity hooks) -------------------------------------------------

    def _lost(self, reason: RestartReason, summary: str) -> WorkerLost:
        log.warning("%s lane: %s", self.lane, summary)
        self._update(state=LaneState.DOWN, pid=None, base_url=None, health=None, last_error=summary)
        self._last_loss = WorkerLost(reason, summary)
        return self._last_loss

    def _budget_spent(self, retry_state: RetryCallState) -> bool:
        return self._budget.exhausted(asyncio.get_running_loop().time())

    def _restart_delay(self, retry_state: RetryCallState) -> float:
        recent = self._budget.recent(asyncio.get_running_loop().time())
        return backoff_delay(recent, self.backoff_initial, self.backoff_max, random.random())

    def _log_restart_wait(self, retry_state: RetryCallState) -> None:
        delay = retry_state.next_action.sleep if retry_state.next_action else 0.0
        log.info(
            "%s lane: restarting the worker in %.2fs (%d of %d restarts allowed per %gs)",
            self.lane,
            delay,
            self._budget.recent(asyncio.get_running_loop().time()) + 1,
            self.max_restarts,
            self.restart_window,
        )

    def _give_up(self, lost: WorkerLost) -> None:
        log.error(
            "%s lane: worker given up after %d restarts within %gs; last error: %s",
            self.lane,
            self._status.restarts,
            self.restart_window,
            lost.summary,
        )
        self._set_gauge("worker_given_up", 1)
        self._update(state=LaneState.FAILED)

    # --- plumbing -----------------------------------------------------------------------

    def _require_worker(self) -> WorkerProcess:
        assert self._worker is not None
        return self._worker

    def _root_url(self) -> str:
        base = self._status.base_url
        assert base is not None
        return base.removesuffix("/v1")

    def _update(self, **changes: Any) -> None:
        old = self._status
        new = dataclasses.replace(old, **changes)
        check_transition(self.lane, old.state, new.state)
        self._status = new
        if new.state is old.state:
            return
        self._set_gauge("worker_up", 1 if new.ready else 0)
        self._tell(self._on_change, new)

    def _tell(self, callback: StatusCallback | None, status: LaneStatus) -> None:
        if callback is not None:
            try:
                callback(status)
            except Exception:
                log.exception("%s lane: status callback failed", self.lane)

    def _set_gauge(self, name: str, value: float) -> None:
        if self._metrics is not None:
            for label in self._labels:
                getattr(self._metrics, name).labels(label).set(value)

    def _observe_memory(self, pid: int) -> None:
        # a group's launcher: its ranks on this machine are its children
        self.memory = tree_memory(pid) if self.command.group is not None else process_memory(pid)
        if self.memory is not None and self._metrics is not None:
            label = "+".join(self._labels)
            for kind in ("rss", "pss"):
                self._metrics.worker_memory.labels(label, kind).set(self.memory[f"{kind}_bytes"])
        group = self.command.group
        if group is not None and self._metrics is not None:
            label = "+".join(self._labels)
            for host, value in host_memory(group.rank_hosts, self._status.health).items():
                self._metrics.group_host_memory.labels(label, host).set(value)

    async def _close_session(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def start_all(supervisors: Iterable[LaneSupervisor], *, grace: float = 5.0) -> None:
    """Start the lanes concurrently; if one fails, stop them all and raise its error."""
    sups = list(supervisors)
    tasks = [asyncio.create_task(s.start(), name=f"{s.lane}-start-all") for s in sups]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        await stop_all(sups, grace=grace)
        raise
    failed = [e for t in done if not t.cancelled() and (e := t.exception()) is not None]
    if failed:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        await stop_all(sups, grace=grace)
        raise failed[0]


async def start_first(supervisors: Iterable[LaneSupervisor], *, grace: float = 5.0) -> None:
    """Start the first lane and return once it is READY; the others then start in the
    background (a model loaded on demand serves its first request as soon as one lane can,
    and that lane does not share the machine with its siblings' start-ups meanwhile; a
    sibling that fails to come up ends FAILED, logged). A first lane that fails hands over to
    the next. All failing: stop them all, raise the first error. ``stop`` ends a start still
    running."""
    sups = list(supervisors)
    failed: list[BaseException] = []
    for i, sup in enumerate(sups):
        try:
            await sup.start()
        except WorkerStartError as e:
            failed.append(e)
            continue
        except asyncio.CancelledError:
            await stop_all(sups, grace=grace)
            raise
        for rest in sups[i + 1 :]:
            task = asyncio.create_task(rest.start(), name=f"{rest.lane}-start-later")
            _STARTING.add(task)
            task.add_done_callback(_late_start)
        return
    await stop_all(sups, grace=grace)
    raise failed[0]


_STARTING: set[asyncio.Task[None]] = set()  # the running starts of start_first (held here)


def _late_start(task: asyncio.Task[None]) -> None:
    _STARTING.discard(task)
    if task.cancelled():
        return
    if (e := task.exception()) is not None:
        log.warning("a lane that was still starting did not come up: %s", e)


async def stop_all(supervisors: Iterable[LaneSupervisor], *, grace: float = 10.0) -> None:
    await asyncio.gather(*(s.stop(grace) for s in supervisors))
