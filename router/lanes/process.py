"""One lane worker process: its command line, spawning it, reading its pipes, killing it.

The supervisor decides *when*; this module knows *how*. A WorkerProcess runs in its own
session (so a terminal's Ctrl-C reaches only the router, which then stops the workers
in order) and is always signalled as a process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from signal import Signals
from typing import Any

from router.config.group import GroupSpec
from router.config.names import LANE_NAMES
from router.config.settings import LanesSettings
from router.kernel.worker_contract import (
    DEFAULT_MAX_BODY_BYTES,
    SHARED_MODE,
    WORKER_SECRET_ENV,
    WORKER_SECRET_HEADER,
    auto_disk_bytes,
    default_prompt_cache_dir,
    new_worker_secret,
    parse_ready_line,
    worker_argv,
)
from router.lanes.blas import preload_env, shares_cores, thread_env
from router.lanes.rankgroup import PORT_PLACEHOLDER, group_argv, private_launch

log = logging.getLogger("router.lanes.supervisor")

STDERR_TAIL_LINES = 50
_STREAM_LIMIT = 1 << 20  # MLX/tqdm progress lines can be long
_PIPE_DRAIN_TIMEOUT = 1.0  # to collect the last stderr lines of an exited worker


@dataclass(frozen=True)
class WorkerCommand:
    lane: str  # a lane, or SHARED_MODE for the process serving both
    argv: tuple[str, ...]
    # Holds the worker secret (WORKER_SECRET_ENV): never logged, never shown.
    env: Mapping[str, str] = field(default_factory=dict, hash=False, repr=False)
    # The worker secret every request to this worker carries (None: a worker that checks
    # none, e.g. a test's); the same across its restarts.
    secret: str | None = field(default=None, repr=False)
    # A group's launcher (router.lanes.rankgroup): consecutive free ports its ring backend
    # takes, chosen at every spawn (0: none).
    ring_ports: int = 0
    group: GroupSpec | None = field(default=None, hash=False)
    # A group's launcher: mlx.launch's arguments, handed over in a private directory (its
    # name appended to ``argv`` at every spawn), never on a command line.
    launch_args: tuple[str, ...] = field(default=(), repr=False)

    @property
    def fresh_ports(self) -> bool:
        """Every spawn takes a fresh range of ports (none fixed by ``[lanes.group] port``)."""
        return self.ring_ports > 0 and PORT_PLACEHOLDER in self.launch_args

    def auth_headers(self) -> dict[str, str]:
        return worker_auth_headers(self.secret)

    @property
    def lanes(self) -> tuple[str, ...]:
        """The lanes this process serves."""
        return LANE_NAMES if self.lane == SHARED_MODE else (self.lane,)


def build_worker_command(
    lane: str,
    settings: LanesSettings,
    model_dir: Path,
    draft_dir: Path | None,
    model_name: str,
    python: str = sys.executable,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    group: GroupSpec | None = None,
    computing: int = 1,
    core_share: tuple[Path, int] | None = None,
) -> WorkerCommand:
    """``computing``: the lane processes of this model computing at once on this machine (two
    in the separate layout), which share its cores' BLAS threads; ``max_body_bytes``: the
    router's own limit (the worker accepts what the router does);
    ``lane``: a lane, or SHARED_MODE for the one process serving both; ``group``: the
    speculative lane (or with SHARED_MODE both lanes) over a group of ranks, started by
    ``mlx.launch``; ``core_share``: the file the lane processes share their cores through and
    this lane's slot, used where ``blas.shares_cores`` says."""
    if group is not None and lane not in ("speculative", SHARED_MODE):
        raise ValueError("a group of ranks serves the speculative lane or both (shared)")
    if lane not in (*LANE_NAMES, SHARED_MODE):
        raise ValueError(f"unknown lane {lane!r}; expected one of {LANE_NAMES} or {SHARED_MODE!r}")
    env = preload_env()
    env.update(settings.env)
    if group is not None or not shares_cores(settings.blas_threads, computing, env):
        core_share = None
    argv = worker_argv(
        python,
        lane,
        model_dir,
        model_name,
        draft=draft_dir,
        num_draft_tokens=settings.num_draft_tokens,
        max_batch_size=settings.max_batch_size,
        parent_pid=os.getpid(),
        prompt_cache_bytes=settings.prompt_cache_bytes,
        prefill_step_size=settings.prefill_step_size,
        prefill_chunk_seconds=settings.prefill_chunk_seconds,
        speculative=speculative_args(settings, draft_dir),
        max_body_bytes=max_body_bytes,
        shared_threads=str(settings.shared_threads),
        content_special_tokens=settings.content_special_tokens,
        **disk_tier_args(settings, group),
        core_share=core_share,
    )
    if group is None:  # a group's ranks take their environment from rank_env below
        env = thread_env(env, settings.blas_threads, computing, os.cpu_count())
    env["PYTHONUNBUFFERED"] = "1"  # stderr lines must reach the ring buffer as they happen
    # In the environment, not on the command line: /proc/<pid>/environ is readable by this
    # user only, the command line by everyone. A group's launcher passes its environment to
    # rank 0 (this machine, which answers HTTP); never as an --env flag (its command line).
    secret = new_worker_secret()
    env[WORKER_SECRET_ENV] = secret
    if group is not None:
        rank_env = {**settings.env, "PYTHONUNBUFFERED": "1"}
        launcher, launch_args = group_argv(group, argv, rank_env, python)
        ports = group.ranks if "--starting-port" in launch_args else 0
        return WorkerCommand(
            lane, launcher, env, secret, ring_ports=ports, group=group, launch_args=launch_args
        )
    return WorkerCommand(lane=lane, argv=tuple(argv), env=env, secret=secret)


def disk_tier_args(settings: LanesSettings, group: GroupSpec | None) -> dict[str, Any]:
    """The prompt cache's disk tier for a worker: off over a group of ranks (each rank holds
    its own shard of every entry, and rank 0 cannot read the others' files); its bound by
    default a tenth of the free disk, at most 10 GiB."""
    directory = prompt_cache_dir(settings)
    size = settings.prompt_cache_disk_bytes
    if group is not None or not settings.prompt_cache_bytes:
        size = 0
    elif size is None:
        size = auto_disk_bytes(free_disk(directory))
    return {
        "prompt_cache_disk_bytes": size,
        "prompt_cache_dir": directory,
        "warm_prompts": settings.warm_prompts if size else 0,
    }


def prompt_cache_dir(settings: LanesSettings) -> Path:
    return (settings.prompt_cache_dir or default_prompt_cache_dir()).expanduser()


def free_disk(directory: Path) -> int:
    """Free bytes on the file system that holds (or will hold) ``directory``."""
    import shutil

    for place in (directory, *directory.parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(place).free
    return 0


def worker_auth_headers(secret: str | None) -> dict[str, str]:
    return {WORKER_SECRET_HEADER: secret} if secret else {}


def speculative_args(settings: LanesSettings, draft_dir: Path | None) -> tuple[str, ...]:
    """The speculative lane's draft flags: its source for requests that name none. ``auto``
    is the lane's own choice at every step among every source it has
    (``router.worker.drafting.draftchoice``); ``draft_model`` without a draft directory (none
    configured, or the gate refused the pair) means no lane-wide drafting; ``prompt_lookup``
    and ``suffix`` are always honoured."""
    source = settings.draft_source
    if source == "draft_model" and draft_dir is None:
        source = "none"
    return (
        "--draft-source",
        source,
        "--lookup-ngram-min",
        str(settings.lookup_ngram_min),
        "--lookup-ngram-max",
        str(settings.lookup_ngram_max),
        "--lookup-max-draft",
        str(settings.lookup_max_draft),
        "--prediction-max-draft",
        str(settings.prediction_max_draft),
        "--suffix-max-draft",
        str(settings.suffix_max_draft),
        "--suffix-bytes",
        str(settings.suffix_bytes),
        "--draft-position-cost",
        str(settings.draft_position_cost),
    )


class _ExitAwareProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Resolves ``exited`` as soon as the process is reaped.

    ``Process.wait()`` also waits until every pipe is closed (CPython 3.11), so a
    grandchild that inherited stderr would hide the worker's death from the monitor.
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[int] = loop.create_future()
        # Our own reference: the base class drops its transport when the process exits
        # after its pipes closed (the usual order under uvloop), before the code is read.
        # (uvloop's transport is no asyncio.SubprocessTransport: only its method is kept.)
        self._returncode: Callable[[], int | None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._returncode = getattr(transport, "get_returncode", None)
        super().connection_made(transport)

    def process_exited(self) -> None:
        code = self._returncode() if self._returncode is not None else None
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(-1 if code is None else code)


@dataclass(eq=False)
class WorkerProcess:
    """One spawned worker and the tasks that read its pipes.

    ``ready`` resolves to the port of the ready line; ``exited`` to the exit code.
    """

    lane: str
    proc: asyncio.subprocess.Process
    ready: asyncio.Future[int]
    exited: asyncio.Future[int]
    readers: list[asyncio.Task[None]]
    stderr_tail: deque[str]
    _group_killed: bool = False

    @classmethod
    async def spawn(cls, command: WorkerCommand) -> WorkerProcess:
        """Start the process (raises OSError if it cannot be executed)."""
        loop = asyncio.get_running_loop()
        argv, private = command.argv, None
        if command.launch_args:
            private = private_launch(command.launch_args, command.ring_ports)
            argv = (*argv, str(private))
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitAwareProtocol(_STREAM_LIMIT, loop),
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(command.env),
                start_new_session=True,
            )
        except BaseException:
            if private is not None:
                shutil.rmtree(private, ignore_errors=True)
            raise
        if private is not None:  # its ranks have read what they need by then
            protocol.exited.add_done_callback(lambda _: shutil.rmtree(private, ignore_errors=True))
        proc = asyncio.subprocess.Process(transport, protocol, loop)
        assert proc.stdout is not None and proc.stderr is not None
        ready: asyncio.Future[int] = loop.create_future()
        tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        readers = [
            asyncio.create_task(_read_stdout(command.lane, proc.pid, proc.stdout, ready)),
            asyncio.create_task(_read_stderr(command.lane, proc.pid, proc.stderr, tail)),
        ]
        return cls(command.lane, proc, ready, protocol.exited, readers, tail)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.exited.result() if self.exited.done() else None

    def tail(self) -> tuple[str, ...]:
        return tuple(self.stderr_tail)

    async def drain_stderr(self) -> None:
        """Let the readers collect what the process wrote before it exited."""
        await asyncio.wait(self.readers, timeout=_PIPE_DRAIN_TIMEOUT)

    def signal(self, sig: Signals) -> None:
        """Signal the worker's process group (its own session) while the worker lives."""
        if self.exited.done() or self._group_killed:
            return
        self._killpg(sig)

    def _killpg(self, sig: Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def _kill_group_once(self) -> None:
        # Right after the worker is gone its group id cannot have been reused yet: any
        # process still in the group is a straggler the worker left behind.
        if not self._group_killed:
            self._group_killed = True
            self._killpg(signal.SIGKILL)

    async def terminate(self, grace: float) -> None:
        """SIGTERM, wait ``grace``, SIGKILL; then kill stragglers. Kills even when cancelled."""
        try:
            if not self.exited.done():
                self.signal(signal.SIGTERM)
                done, _ = await asyncio.wait({self.exited}, timeout=grace)
                if not done:
                    log.warning(
                        "%s lane: worker pid %d ignored SIGTERM for %gs; sending SIGKILL",
                        self.lane,
                        self.pid,
                        grace,
                    )
                    self.signal(signal.SIGKILL)
                    await self.exited
            self._kill_group_once()
            await self.drain_stderr()
        finally:
            self._kill_group_once()  # only matters when we were interrupted above
            for task in self.readers:
                task.cancel()


async def _read_stdout(
    lane: str, pid: int, stream: asyncio.StreamReader, ready: asyncio.Future[int]
) -> None:
    async for line in _lines(stream):
        port = parse_ready_line(line)
        if port is not None and not ready.done():
            ready.set_result(port)
        else:
            log.debug("%s worker[%d] stdout: %s", lane, pid, line)


async def _read_stderr(lane: str, pid: int, stream: asyncio.StreamReader, tail: deque[str]) -> None:
    async for line in _lines(stream):
        tail.append(line)
        log.info("%s worker[%d]: %s", lane, pid, line)


async def _lines(stream: asyncio.StreamReader) -> AsyncIterator[str]:
    while True:
        try:
            raw = await stream.readline()
        except ValueError:  # longer than the limit: asyncio has dropped it
            yield "<line too long; dropped>"
            continue
        if not raw:
            return
        yield raw.decode("utf-8", "replace").rstrip("\r\n")
