"""The lane supervisor against real subprocesses of tests/fakes/fake_worker.py.

Every wait is on an event (a state change, a pipe's EOF, a process exit) with a timeout
as a safety net; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from router.config.settings import LanesSettings
from router.lanes.blas import preload_env
from router.lanes.rankgroup import PORT_PLACEHOLDER, RING_START_TRIES
from router.lanes.supervisor import (
    LaneState,
    LaneStatus,
    LaneSupervisor,
    WorkerCommand,
    WorkerStartError,
    build_worker_command,
    start_all,
    stop_all,
)
from router.metrics import Metrics
from tests.conftest import wait_until
from tests.fakes.lane_status import Recorder

FAKE_WORKER = Path(__file__).parents[1] / "fakes" / "fake_worker.py"
WAIT = 20.0  # safety net for event waits on a loaded 2-core machine


def fake_command(*flags: str, lane: str = "speculative") -> WorkerCommand:
    argv = (sys.executable, str(FAKE_WORKER), "--mode", lane, "--port", "0", *flags)
    return WorkerCommand(lane=lane, argv=argv, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def wait_exit(pid: int) -> None:
    """Wait for a process that is not our child to exit (a zombie counts as exited)."""
    proc = psutil.Process(pid)
    if not hasattr(os, "pidfd_open"):  # not Linux: psutil polls; launchd reaps orphans
        await asyncio.to_thread(proc.wait, WAIT)
        return
    fd = os.pidfd_open(pid)  # readable once the process has terminated
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    loop.add_reader(fd, lambda: exited.done() or exited.set_result(None))
    try:
        async with asyncio.timeout(WAIT):
            await exited
    finally:
        loop.remove_reader(fd)
        os.close(fd)


Factory = Callable[..., tuple[LaneSupervisor, Recorder]]


@pytest.fixture
async def make() -> AsyncIterator[Factory]:
    made: list[tuple[LaneSupervisor, Recorder]] = []

    def factory(
        *flags: str, lane: str = "speculative", **kwargs: object
    ) -> tuple[LaneSupervisor, Recorder]:
        rec = Recorder(WAIT)
        options = {
            "startup_timeout": WAIT,
            "health_interval": 0.1,
            "health_timeout": 1.0,
            "kill_grace": 1.0,
            "backoff_initial": 0.02,
            "backoff_max": 0.1,
            **kwargs,
        }
        sup = LaneSupervisor(fake_command(*flags, lane=lane), on_change=rec, **options)
        made.append((sup, rec))
        return sup, rec

    yield factory
    for sup, _ in made:
        async with asyncio.timeout(WAIT):  # a hanging stop() is a failure, not a stuck run
            await sup.stop(grace=0.5)
    for _, rec in made:  # no test may leave a worker behind
        alive = [p.pid for p in rec.procs.values() if not gone(p)]
        assert alive == [], f"orphaned workers: {alive}"


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


# --- start-up ----------------------------------------------------------------------------------


async def test_each_fresh_health_answer_reaches_on_health_not_on_change(make) -> None:
    """What the router shows and routes by (``Backend.reported``: the worker's queue, its
    figures) must follow the worker: before, it was the /health of the last change of state
    (the lane's ready time), for the lane's whole life."""
    fresh: list[int] = []
    seen_thrice = asyncio.Event()

    def on_health(status: LaneStatus) -> None:
        assert status.state is LaneState.READY and status.health is not None
        fresh.append(int(status.health["progress_tokens"]))  # the fake's answers so far
        if len(set(fresh)) >= 3:
            seen_thrice.set()

    sup, rec = make(on_health=on_health)
    await sup.start()
    async with asyncio.timeout(WAIT):
        await seen_thrice.wait()
    assert fresh == sorted(fresh) and len(set(fresh)) >= 3
    assert rec.states == [LaneState.STARTING, LaneState.READY]  # no state changed meanwhile


async def test_start_reports_ready_with_port_health_and_serves(make, caplog):
    caplog.set_level(logging.INFO, logger="router.lanes.supervisor")
    metrics = Metrics()
    sup, rec = make(lane="batching", metrics=metrics)
    await sup.start()

    status = sup.status
    assert status.state is LaneState.READY
    assert rec.states == [LaneState.STARTING, LaneState.READY]
    assert status.base_url is not None and status.base_url.startswith("http://127.0.0.1:")
    assert status.base_url.endswith("/v1") and int(status.base_url.split(":")[2][:-3]) > 0
    assert status.health is not None
    assert status.health["pid"] == status.pid
    assert status.health["capacity"] == 8 and status.health["mode"] == "batching"
    assert sample(metrics, "speclane_worker_up", lane="batching") == 1
    assert any("listening on" in r.getMessage() for r in caplog.records)  # stderr forwarded
    assert any("listening on" in line for line in sup.stderr_tail)

    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{status.base_url}/chat/completions", json={"model": "m", "messages": []}
        ) as resp:
            assert resp.status == 200
            assert (await resp.json())["choices"][0]["message"]["content"] == "ok"

    proc = rec.procs[status.pid]
    started = time.monotonic()
    await sup.stop(grace=10.0)
    assert time.monotonic() - started < 5.0  # exited on SIGTERM, no SIGKILL wait
    assert gone(proc)
    assert sup.status.state is LaneState.STOPPED and sup.status.pid is None
    assert sample(metrics, "speclane_worker_up", lane="batching") == 0


async def test_slow_start_within_the_deadline(make):
    sup, rec = make("--slow-start", "0.5")
    await sup.start()
    assert sup.status.state is LaneState.READY
    assert rec.states == [LaneState.STARTING, LaneState.READY]


async def test_startup_timeout_kills_the_worker(make):
    sup, rec = make("--slow-start", "60", startup_timeout=0.5, kill_grace=0.5)
    started = time.monotonic()
    with pytest.raises(WorkerStartError, match=r"not ready within 0.5s") as info:
        await sup.start()
    assert time.monotonic() - started < 5.0
    assert info.value.returncode is None
    assert gone(rec.procs[info.value.pid])
    assert sup.status.state is LaneState.FAILED
    assert "not ready" in (sup.status.last_error or "")


async def test_early_exit_fails_at_once_with_the_stderr_tail(make):
    sup, rec = make("--exit-early", "7", "--noise-lines", "80", startup_timeout=60.0)
    started = time.monotonic()
    with pytest.raises(WorkerStartError) as info:
        await sup.start()
    assert time.monotonic() - started < 10.0  # far below the 60 s deadline
    err = info.value
    assert err.returncode == 7
    assert "exited with code 7" in str(err)
    assert "cannot load model" in str(err) and "fake failure (exit 7)" in str(err)
    assert len(err.stderr_tail) == 50  # the ring buffer is bounded
    assert not any("loading shard 0" in line for line in err.stderr_tail)
    assert sup.status.state is LaneState.FAILED
    assert gone(rec.procs[err.pid])


async def test_unrunnable_command_is_a_start_error():
    command = WorkerCommand(lane="speculative", argv=("/nonexistent/python",), env={})
    sup = LaneSupervisor(command, startup_timeout=5.0, health_interval=1.0)
    with pytest.raises(WorkerStartError, match="cannot run /nonexistent/python"):
        await sup.start()
    assert sup.status.state is LaneState.FAILED


async def test_cancelled_start_leaves_no_process(make):
    sup, rec = make("--slow-start", "60", kill_grace=0.5)
    task = asyncio.create_task(sup.start())
    starting = await rec.wait_for(LaneState.STARTING)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gone(rec.procs[starting.pid])
    assert sup.status.state is LaneState.STOPPED


async def test_stop_during_start_fails_the_start(make):
    sup, rec = make("--slow-start", "60", kill_grace=0.5)
    task = asyncio.create_task(sup.start())
    starting = await rec.wait_for(LaneState.STARTING)
    await sup.stop(grace=0.5)
    with pytest.raises(WorkerStartError, match="stopped during start-up"):
        await task
    assert gone(rec.procs[starting.pid])
    assert sup.status.state is LaneState.STOPPED


async def test_start_all_fails_fast_and_stops_the_other_lane(make):
    good, good_rec = make("--slow-start", "0.2", lane="speculative")
    bad, _ = make("--exit-early", "3", lane="batching")
    with pytest.raises(WorkerStartError, match="exited with code 3"):
        await start_all([good, bad], grace=0.5)
    assert good.status.state is LaneState.STOPPED
    assert good_rec.procs and all(gone(p) for p in good_rec.procs.values())


# --- a group's launcher: private arguments, fresh ports on a ring's failed start ------------

FAKE_LAUNCHER = Path(__file__).parents[1] / "fakes" / "fake_launcher.py"


def launcher_command(record: Path, *flags: str) -> WorkerCommand:
    """A group's command as build_worker_command makes it, on the fake launcher."""
    worker = (sys.executable, str(FAKE_WORKER), "--mode", "speculative", "--port", "0")
    args = ("--starting-port", PORT_PLACEHOLDER, "--record", str(record), *flags, "--", *worker)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return WorkerCommand(
        "speculative", (sys.executable, str(FAKE_LAUNCHER)), env, ring_ports=2, launch_args=args
    )


def starts(record: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def group_supervisor(record: Path, *flags: str) -> LaneSupervisor:
    command = launcher_command(record, *flags)
    return LaneSupervisor(command, startup_timeout=WAIT, health_interval=1.0)


def left_behind(made: list[dict[str, Any]]) -> list[str]:
    return [m["directory"] for m in made if os.path.exists(m["directory"])]


async def test_a_start_whose_ring_port_was_taken_starts_again_on_fresh_ports(tmp_path, caplog):
    record = tmp_path / "starts.jsonl"
    sup = LaneSupervisor(
        launcher_command(record, "--ring-fails", "2"), startup_timeout=WAIT, health_interval=1.0
    )
    try:
        await sup.start()
        assert sup.status.state is LaneState.READY and sup.status.restarts == 0
    finally:
        await sup.stop(grace=1.0)
    made = starts(record)
    assert len(made) == 3  # two failed (their port taken), the third on fresh ports served
    assert len({m["port"] for m in made}) == 3
    for m in made:
        # The launcher's command line names its private directory and holds no port.
        assert m["cmdline"] == [sys.executable, str(FAKE_LAUNCHER), m["directory"]]
        assert not any(str(m["port"]) in arg for arg in m["cmdline"])
    assert left_behind(made) == []  # each directory removed once its launcher exited
    warned = [r.getMessage() for r in caplog.records if "fresh ports" in r.getMessage()]
    assert len(warned) == 2 and "Couldn't bind socket" in warned[0]


async def test_a_ring_that_keeps_failing_or_another_failure_fails_the_start(tmp_path):
    record = tmp_path / "ring.jsonl"
    sup = LaneSupervisor(
        launcher_command(record, "--ring-fails", "9"), startup_timeout=WAIT, health_interval=1.0
    )
    with pytest.raises(WorkerStartError, match="Couldn't bind socket"):
        await sup.start()
    assert len(starts(record)) == RING_START_TRIES
    other = tmp_path / "other.jsonl"
    sup = LaneSupervisor(
        launcher_command(other, "--other-fails"), startup_timeout=WAIT, health_interval=1.0
    )
    with pytest.raises(WorkerStartError, match="fake failure"):
        await sup.start()
    assert len(starts(other)) == 1  # not the ring's: fresh ports would not help


# --- running -------------------------------------------------------------------------------


async def test_crash_marks_down_then_restarts(make):
    metrics = Metrics()
    sup, rec = make(metrics=metrics)
    await sup.start()
    first = sup.status
    os.kill(first.pid, signal.SIGKILL)

    down = await rec.wait_for(LaneState.DOWN)
    assert down.base_url is None and "exited with code -9" in (down.last_error or "")
    again = await rec.wait_for(LaneState.READY, nth=2)
    assert again.restarts == 1
    assert again.pid != first.pid and again.base_url is not None
    assert gone(rec.procs[first.pid])
    assert rec.states == [
        LaneState.STARTING,
        LaneState.READY,
        LaneState.DOWN,
        LaneState.STARTING,
        LaneState.READY,
    ]
    assert (
        sample(metrics, "speclane_worker_restarts_total", lane="speculative", reason="exited") == 1
    )
    assert sample(metrics, "speclane_worker_up", lane="speculative") == 1


async def test_exit_is_noticed_when_the_pipes_closed_first(make):
    sup, rec = make("--die-after", "0.2", "--close-pipes-first", kill_grace=0.5)
    await sup.start()
    first = sup.status
    down = await rec.wait_for(LaneState.DOWN)
    assert down.last_error == "worker exited with code 3"  # an exit, not a hang
    assert gone(rec.procs[first.pid])


async def test_hung_worker_is_killed_and_restarted(make):
    metrics = Metrics()
    # The start-up health check uses the one answer; afterwards /health never answers.
    sup, rec = make(
        "--hang-health-after",
        "1",
        health_timeout=0.2,
        unhealthy_after=2,
        kill_grace=0.5,
        metrics=metrics,
    )
    await sup.start()
    first = sup.status

    down = await rec.wait_for(LaneState.DOWN)
    assert "hung" in (down.last_error or "")
    assert gone(rec.procs[first.pid])  # killed before the lane went DOWN
    again = await rec.wait_for(LaneState.READY, nth=2)
    assert again.pid != first.pid
    assert sample(metrics, "speclane_worker_restarts_total", lane="speculative", reason="hung") >= 1


async def test_a_worker_busy_without_progress_is_killed_and_restarted(make):
    """Its /health answers, but a request stays active and progress_tokens never move: the
    generation thread is stuck. Past stall_timeout the lane restarts (reason stalled)."""
    metrics = Metrics()
    sup, rec = make("--stall-after", "3", stall_timeout=0.5, metrics=metrics)
    await sup.start()
    first = sup.status
    down = await rec.wait_for(LaneState.DOWN)
    assert "stalled" in (down.last_error or "")
    assert gone(rec.procs[first.pid])
    again = await rec.wait_for(LaneState.READY, nth=2)
    assert again.pid != first.pid
    labels = {"lane": "speculative", "reason": "stalled"}
    assert sample(metrics, "speclane_worker_restarts_total", **labels) >= 1


async def test_a_busy_worker_that_progresses_is_left_alone(make):
    sup, rec = make("--stall-after", "1000000", stall_timeout=0.3)
    await sup.start()
    # health checks well past stall_timeout (0.1 s apart), its progress moving every one
    await wait_until(lambda: (sup.status.health or {}).get("progress_tokens", 0) >= 12, WAIT)
    assert rec.states == [LaneState.STARTING, LaneState.READY]


async def test_worker_that_keeps_dying_is_given_up(make, caplog):
    caplog.set_level(logging.INFO, logger="router.lanes.supervisor")
    metrics = Metrics()
    sup, rec = make("--die-after", "0.1", max_restarts=2, restart_window=60.0, metrics=metrics)
    await sup.start()

    failed = await rec.wait_for(LaneState.FAILED)
    assert failed.restarts == 2
    assert rec.states.count(LaneState.READY) == 3  # the first start and two restarts
    assert sample(metrics, "speclane_worker_given_up", lane="speculative") == 1
    assert sample(metrics, "speclane_worker_up", lane="speculative") == 0
    assert (
        sample(metrics, "speclane_worker_restarts_total", lane="speculative", reason="exited") == 2
    )
    # Only the supervisor's own records: other libraries' errors are not this test's subject.
    errors = [
        r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("router.")
    ]
    assert len(errors) == 1 and "given up" in errors[0].getMessage()
    # No more restarts: the monitor has finished and every worker is gone.
    assert not sup.supervising
    assert len(rec.procs) == 3 and all(gone(p) for p in rec.procs.values())
    assert rec.states[-1] is LaneState.FAILED


async def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(make):
    sup, rec = make("--ignore-sigterm")
    await sup.start()
    proc = rec.procs[sup.status.pid]
    started = time.monotonic()
    await sup.stop(grace=0.3)
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 3.0  # waited the grace, then did not wait any longer
    assert gone(proc)
    assert sup.status.state is LaneState.STOPPED


async def test_stop_is_idempotent(make):
    sup, rec = make()
    await sup.stop(grace=0.5)  # never started
    await sup.start()
    await sup.stop(grace=0.5)
    await sup.stop(grace=0.5)
    assert rec.states == [LaneState.STARTING, LaneState.READY, LaneState.STOPPED]
    assert not sup.supervising


async def test_fake_worker_exits_when_its_parent_is_killed():
    # An intermediate parent spawns the fake worker; both write to our stdout pipe, so we
    # learn the worker's pid and see its ready line (the parent-watch is armed by then).
    parent_code = (
        "import os, subprocess, sys\n"
        f"w = subprocess.Popen([sys.executable, {str(FAKE_WORKER)!r}, '--port', '0',"
        " '--parent-pid', str(os.getpid())])\n"
        "print('CHILD', w.pid, flush=True)\n"
        "w.wait()\n"
    )
    parent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        parent_code,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    assert parent.stdout is not None
    worker_pid, ready = None, False
    worker: psutil.Process | None = None
    try:
        async with asyncio.timeout(WAIT):
            while worker_pid is None or not ready:
                line = (await parent.stdout.readline()).decode()
                assert line, "the parent or the worker exited early"
                if line.startswith("CHILD "):
                    worker_pid = int(line.split()[1])
                ready = ready or line.startswith("SPECLANE_WORKER_READY ")
        worker = psutil.Process(worker_pid)
        assert not gone(worker)

        parent.send_signal(signal.SIGKILL)
        await wait_exit(worker_pid)
        assert gone(worker)
    finally:
        if worker is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()  # psutil checks the create time: never a recycled pid
        with contextlib.suppress(ProcessLookupError):
            parent.kill()
        async with asyncio.timeout(WAIT):  # returns once the worker released our pipe too
            await parent.wait()


def test_lifecycle_under_uvloop():
    # speclane serves on uvloop when it is installed; its subprocess transport orders
    # pipe EOF and process exit differently from asyncio's.
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        options = {
            "startup_timeout": WAIT,
            "health_interval": 0.1,
            "kill_grace": 0.5,
            "backoff_initial": 0.02,
            "backoff_max": 0.1,
        }
        crash_rec, dying_rec, stubborn_rec = Recorder(WAIT), Recorder(), Recorder()
        crash = LaneSupervisor(fake_command(), on_change=crash_rec, **options)
        dying = LaneSupervisor(
            fake_command("--die-after", "0.2", "--close-pipes-first"),
            on_change=dying_rec,
            **options,
        )
        stubborn = LaneSupervisor(
            fake_command("--ignore-sigterm", lane="batching"), on_change=stubborn_rec, **options
        )
        sups = [crash, dying, stubborn]
        try:
            await start_all(sups)
            first = crash.status.pid
            os.kill(first, signal.SIGKILL)
            again = await crash_rec.wait_for(LaneState.READY, nth=2)
            assert again.pid != first and again.restarts == 1
            down = await dying_rec.wait_for(LaneState.DOWN)
            assert down.last_error == "worker exited with code 3"
            started = time.monotonic()
            await stubborn.stop(grace=0.3)
            assert 0.3 <= time.monotonic() - started < 3.0
        finally:
            async with asyncio.timeout(WAIT):
                await stop_all(sups, grace=0.5)
        procs = [p for rec in (crash_rec, dying_rec, stubborn_rec) for p in rec.procs.values()]
        assert len(procs) >= 4 and all(gone(p) for p in procs)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())


# --- the real worker's command line ----------------------------------------------------------


def test_build_worker_command_for_the_speculative_lane(tmp_path):
    settings = LanesSettings(
        num_draft_tokens=4,
        max_batch_size=6,
        env={"FOO": "bar"},
        prompt_cache_dir=tmp_path / "kv",
        prompt_cache_disk_bytes=1 << 30,
    )
    cmd = build_worker_command(
        "speculative",
        settings,
        tmp_path / "model",
        tmp_path / "draft",
        "smol",
        python="/usr/bin/python3",
        max_body_bytes=4096,
    )
    assert cmd.lane == "speculative"
    assert cmd.argv == (
        "/usr/bin/python3",
        "-m",
        "router.worker",
        "--mode",
        "speculative",
        "--model",
        str(tmp_path / "model"),
        "--model-name",
        "smol",
        "--draft-model",
        str(tmp_path / "draft"),
        "--draft-source",
        "auto",  # the default: the lane chooses at every step
        "--lookup-ngram-min",
        "2",
        "--lookup-ngram-max",
        "4",
        "--lookup-max-draft",
        "8",
        "--prediction-max-draft",
        "16",
        "--suffix-max-draft",
        "16",
        "--suffix-bytes",
        str(64 << 20),
        "--draft-position-cost",
        "auto",
        "--prompt-cache-dir",
        str(tmp_path / "kv"),
        "--num-draft-tokens",
        "4",
        "--max-batch-size",
        "6",
        "--prompt-cache-bytes",
        str(1 << 30),
        "--content-special-tokens",
        "text",
        "--prompt-cache-disk-bytes",
        str(1 << 30),
        "--warm-prompts",
        "2",
        "--max-body-bytes",
        "8192",  # what the router accepts, with room for re-encoding
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--parent-pid",
        str(os.getpid()),
    )
    assert cmd.env["FOO"] == "bar" and cmd.env["PYTHONUNBUFFERED"] == "1"
    assert cmd.env.get("LD_PRELOAD") == preload_env().get("LD_PRELOAD")


def test_the_disk_tier_is_sized_for_the_machine_and_off_over_a_group(tmp_path):
    from router.config.group import GroupSpec
    from router.kernel.worker_contract import auto_disk_bytes
    from router.lanes.process import disk_tier_args, free_disk

    auto = disk_tier_args(LanesSettings(prompt_cache_dir=tmp_path / "not-yet" / "kv"), None)
    assert auto["prompt_cache_disk_bytes"] == auto_disk_bytes(free_disk(tmp_path)) > 0
    assert auto["prompt_cache_dir"] == tmp_path / "not-yet" / "kv" and auto["warm_prompts"] == 2
    assert auto_disk_bytes(1 << 40) == 10 << 30 and auto_disk_bytes(10 << 20) == 1 << 20
    group = GroupSpec(hosts=("127.0.0.1", "127.0.0.2"))
    off = disk_tier_args(LanesSettings(prompt_cache_disk_bytes=1 << 30), group)
    assert (off["prompt_cache_disk_bytes"], off["warm_prompts"]) == (0, 0)
    no_memory_cache = disk_tier_args(LanesSettings(prompt_cache_bytes=0), None)
    assert no_memory_cache["prompt_cache_disk_bytes"] == 0


@pytest.mark.parametrize(
    ("source", "with_draft", "passed"),
    [
        # auto: the lane chooses among the sources it has, with or without a draft model
        ("auto", True, "auto"),
        ("auto", False, "auto"),  # the gate refused the draft: the free sources only
        ("draft_model", True, "draft_model"),
        ("draft_model", False, "none"),
        ("prompt_lookup", False, "prompt_lookup"),
        ("prompt_lookup", True, "prompt_lookup"),
        ("suffix", False, "suffix"),
        ("none", True, "none"),
    ],
)
def test_the_speculative_lane_gets_its_draft_source(tmp_path, source, with_draft, passed):
    settings = LanesSettings(draft_source=source, lookup_ngram_max=5, lookup_max_draft=12)
    draft = tmp_path / "draft" if with_draft else None
    argv = build_worker_command("speculative", settings, tmp_path, draft, "m").argv
    assert argv[argv.index("--draft-source") + 1] == passed
    assert argv[argv.index("--lookup-ngram-max") + 1] == "5"
    assert argv[argv.index("--lookup-max-draft") + 1] == "12"
    assert argv[argv.index("--suffix-bytes") + 1] == str(settings.suffix_bytes)
    assert ("--draft-model" in argv) == with_draft


def test_lookup_ngram_sizes_must_be_ordered():
    with pytest.raises(ValueError, match="lookup_ngram_min"):
        LanesSettings(lookup_ngram_min=5, lookup_ngram_max=3)


def test_build_worker_command_batching_lane_has_no_draft(tmp_path):
    cmd = build_worker_command("batching", LanesSettings(), tmp_path, tmp_path / "draft", "m")
    assert cmd.argv[0] == sys.executable
    assert "--draft-model" not in cmd.argv and "--draft-source" not in cmd.argv
    # The free sources' limits: the batching lane drafts from predictions, lookup and suffix.
    assert "--lookup-max-draft" in cmd.argv and "--suffix-bytes" in cmd.argv
    assert cmd.argv[cmd.argv.index("--mode") + 1] == "batching"


def test_build_worker_command_passes_the_prompt_cache_and_prefill_settings(tmp_path):
    settings = LanesSettings(
        prompt_cache_bytes=12345, prefill_step_size=64, prefill_chunk_seconds=0.25
    )
    batching = build_worker_command("batching", settings, tmp_path, None, "m").argv
    assert batching[batching.index("--prompt-cache-bytes") + 1] == "12345"
    assert batching[batching.index("--prefill-step-size") + 1] == "64"
    assert batching[batching.index("--prefill-chunk-seconds") + 1] == "0.25"
    spec = build_worker_command("speculative", settings, tmp_path, None, "m").argv
    assert spec[spec.index("--prompt-cache-bytes") + 1] == "12345"
    assert "--prefill-step-size" not in spec  # one sequence at a time: nothing to interleave


def test_build_worker_command_passes_the_shared_threads_to_the_shared_worker_only(tmp_path):
    shared = build_worker_command("shared", LanesSettings(), tmp_path, None, "m").argv
    assert shared[shared.index("--shared-threads") + 1] == "auto"
    one = build_worker_command("shared", LanesSettings(shared_threads=1), tmp_path, None, "m")
    assert one.argv[one.argv.index("--shared-threads") + 1] == "1"
    for lane in ("speculative", "batching"):
        assert (
            "--shared-threads"
            not in build_worker_command(
                lane, LanesSettings(shared_threads=2), tmp_path, None, "m"
            ).argv
        )
    with pytest.raises(ValueError):
        LanesSettings(shared_threads=3)  # type: ignore[arg-type]


def test_build_worker_command_rejects_unknown_lanes(tmp_path):
    with pytest.raises(ValueError, match="unknown lane"):
        build_worker_command("turbo", LanesSettings(), tmp_path, None, "m")


def test_from_settings_takes_the_lane_settings():
    settings = LanesSettings(
        startup_timeout=12.0, health_interval=0.5, max_restarts=1, restart_window=30.0
    )
    sup = LaneSupervisor.from_settings(fake_command(), settings)
    assert (sup.startup_timeout, sup.health_interval, sup.max_restarts, sup.restart_window) == (
        12.0,
        0.5,
        1,
        30.0,
    )
