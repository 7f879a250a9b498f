"""Policy reloads: on file change, on SIGHUP, and keeping the last good set."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import pytest

from router.config.policies import load_policies
from router.metrics import Metrics
from router.proxy.policy_watch import PolicyWatcher, ReloadResult, fingerprint, whole


def sample(metrics: Metrics, result: str) -> float:
    value = metrics.registry.get_sample_value("speclane_policy_reloads_total", {"result": result})
    return 0.0 if value is None else value


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    (tmp_path / "default.toml").write_text("priority = 0\n")
    (tmp_path / "agent.toml").write_text('priority = 1\n[match]\nclient_header = "agent"\n')
    return tmp_path


def watcher_for(directory: Path, **kw: object) -> PolicyWatcher:
    return PolicyWatcher(directory, load_policies(directory), **kw)  # type: ignore[arg-type]


def settled(watcher: PolicyWatcher) -> ReloadResult | None:
    """Two polls: the first sees a change, the second finds it stable and takes it."""
    assert watcher.check() is None
    return watcher.check()


def priority(watcher: PolicyWatcher, client: str) -> int | None:
    policy = watcher.current.get(client)
    return None if policy is None else policy.priority


async def test_a_changed_file_is_reloaded_by_the_poller(directory: Path) -> None:
    metrics = Metrics()
    watcher = watcher_for(directory, metrics=metrics, interval=0.01)
    poller = watcher.poller().start()
    try:
        (directory / "agent.toml").write_text('priority = 42\n[match]\nclient_header = "agent"\n')
        result = await asyncio.wait_for(watcher.wait_reload(0), 10)
    finally:
        poller.cancel()
    assert (result.ok, result.trigger, result.attempt) == (True, "file-change", 1)
    assert priority(watcher, "agent") == 42
    assert result.policies is watcher.current
    assert sample(metrics, "ok") == 1


def test_nothing_changed_means_no_reload(directory: Path) -> None:
    watcher = watcher_for(directory)
    assert watcher.check() is None
    assert watcher.attempts == 0


def test_added_and_removed_files_are_changes(directory: Path) -> None:
    watcher = watcher_for(directory)
    (directory / "new.toml").write_text("priority = 3\n")
    assert settled(watcher) is not None
    assert priority(watcher, "new") == 3
    (directory / "new.toml").unlink()
    assert settled(watcher) is not None
    assert watcher.current.get("new") is None
    assert [name for name, _, _ in fingerprint(directory)] == ["agent.toml", "default.toml"]


async def test_sighup_reloads(directory: Path) -> None:
    watcher = watcher_for(directory)
    loop = asyncio.get_running_loop()
    assert watcher.install_sighup(loop)
    try:
        (directory / "default.toml").write_text("priority = 7\n")
        os.kill(os.getpid(), signal.SIGHUP)
        result = await asyncio.wait_for(watcher.wait_reload(0), 10)
    finally:
        watcher.remove_sighup(loop)
    assert (result.ok, result.trigger) == (True, "sighup")
    assert watcher.current.default.priority == 7


async def test_an_invalid_reload_keeps_the_last_good_set(
    directory: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics, seen = Metrics(), []
    watcher = watcher_for(directory, metrics=metrics, on_reload=seen.append)
    good = watcher.current
    (directory / "agent.toml").write_text('priority = "high"\n')
    with caplog.at_level(logging.ERROR, logger="speclane.policy"):
        result = settled(watcher)
    assert result is not None and not result.ok
    assert result.error is not None
    assert f"{directory / 'agent.toml'}: priority:" in result.error
    assert watcher.current is good and result.policies is good
    assert sample(metrics, "error") == 1 and sample(metrics, "ok") == 0
    assert "keeping the previous policies" in caplog.text
    assert str(directory / "agent.toml") in caplog.text
    # Fixing the file is picked up by the next look, and the waiters see it.
    (directory / "agent.toml").write_text("priority = 9\n")
    waiting = asyncio.create_task(watcher.wait_reload(1))
    assert settled(watcher) is not None
    fixed = await asyncio.wait_for(waiting, 10)
    assert (fixed.ok, fixed.attempt) == (True, 2)
    assert priority(watcher, "agent") == 9
    assert [r.ok for r in seen] == [False, True]
    assert all(isinstance(r, ReloadResult) for r in seen)


async def test_reload_checks_presets(directory: Path) -> None:
    watcher = PolicyWatcher(directory, load_policies(directory), presets=["interactive"])
    (directory / "agent.toml").write_text('default_preset = "turbo"\n')
    result = await watcher.reload("manual")
    assert not result.ok and result.error is not None and "unknown preset 'turbo'" in result.error


def test_a_removed_directory_is_an_error_not_a_crash(directory: Path) -> None:
    watcher = watcher_for(directory)
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
    result = watcher.check()
    assert result is not None and not result.ok
    assert watcher.current.get("agent") is not None


# --- settling: a file being written is never read half way -----------------------------------


async def test_an_explicit_reload_waits_until_the_file_is_whole(directory: Path) -> None:
    watcher = watcher_for(directory, settle=0.5)
    whole_text = b"priority = 5\nmax_concurrency = 3\n"
    with (directory / "default.toml").open("r+b") as f:
        f.truncate(0)
        f.write(whole_text[:13])  # "priority = 5\n": valid on its own
        f.flush()
        reloading = asyncio.create_task(watcher.reload("sighup"))
        await asyncio.sleep(0)  # the reload has read once: too fresh, it waits
        assert not reloading.done()
        f.write(whole_text[13:])
    result = await asyncio.wait_for(reloading, 10)
    assert result.ok and watcher.current.default.max_concurrency == 3


async def test_an_explicit_reload_gives_up_on_files_that_never_settle(directory: Path) -> None:
    watcher = watcher_for(directory, settle=0.2, patience=0.5)
    good = watcher.current
    reloading = asyncio.create_task(watcher.reload("admin"))
    n = 0
    while not reloading.done():  # a writer that never stops
        n += 1
        (directory / "default.toml").write_text(f"priority = {n % 5}\n")
        await asyncio.sleep(0.02)
    result = reloading.result()
    assert not result.ok and "kept changing" in (result.error or "")
    assert watcher.current is good


async def test_a_file_dated_in_the_future_settles_by_watching(directory: Path) -> None:
    """mtime ahead of the clock (a skewed NFS server, touch -d): the watcher counts how
    long it has seen the files unchanged instead."""
    path = directory / "default.toml"
    path.write_text("priority = 4\n")
    ahead = path.stat().st_mtime + 3600
    os.utime(path, (ahead, ahead))
    watcher = watcher_for(directory, settle=0.1)
    result = await asyncio.wait_for(watcher.reload("admin"), 10)
    assert result.ok and watcher.current.default.priority == 4


def test_a_poll_takes_nothing_until_the_directory_settled(directory: Path) -> None:
    watcher = watcher_for(directory, settle=3600)  # nothing counts as settled
    (directory / "default.toml").write_text("priority = 2\n")
    assert [watcher.check() for _ in range(3)] == [None, None, None]
    assert watcher.current.default.priority == 0


def test_a_reading_is_whole_only_if_nothing_moved() -> None:
    before = (1, (("a.toml", 10, 3),))
    assert whole({"a.toml": b"abc"}, before, before)
    assert not whole({"a.toml": b"abc"}, before, (2, (("a.toml", 10, 3),)))  # dir changed
    assert not whole({"a.toml": b"abc"}, before, (1, (("a.toml", 11, 3),)))  # file written
    assert not whole({"a.toml": b"ab"}, before, before)  # listed at 3 bytes, read 2
    assert not whole({"b.toml": b""}, before, before)  # not listed at all
