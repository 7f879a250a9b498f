"""Keep the current ``PolicySet``: reload on SIGHUP and when a ``*.toml`` file changes.

A reload that fails keeps the last good set, logs the error and counts
``speclane_policy_reloads_total{result="error"}``. Changes are found by polling each
file's mtime and size every ``interval`` seconds (no new dependency; a handful of small
files). Tests and the app wait on ``wait_reload()`` or an ``on_reload`` callback.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from router.config.policies import PolicyError, PolicySet, load_policies
from router.metrics import Metrics

log = logging.getLogger("speclane.policy")

Fingerprint = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class ReloadResult:
    attempt: int  # 1 for the first reload after start, counting failures too
    trigger: str  # "sighup", "file-change", or what the caller passed
    ok: bool
    error: str | None
    policies: PolicySet  # the set in force after this attempt


class PolicyWatcher:
    def __init__(
        self,
        directory: Path,
        initial: PolicySet,
        *,
        presets: Collection[str] | None = None,
        metrics: Metrics | None = None,
        interval: float = 2.0,
        on_reload: Callable[[ReloadResult], None] | None = None,
    ) -> None:
        """``initial``: the set ``serve`` loaded (and refused to start without)."""
        self.directory = directory
        self.presets = presets
        self.interval = interval
        self._metrics = metrics
        self._on_reload = on_reload
        self._current = initial
        self._seen = fingerprint(directory)
        self._attempts = 0
        self._last: ReloadResult | None = None
        self._changed = asyncio.Event()  # replaced after each set: one event per attempt

    @property
    def current(self) -> PolicySet:
        return self._current

    @property
    def attempts(self) -> int:
        return self._attempts

    def reload(self, trigger: str = "manual") -> ReloadResult:
        """Load the directory now; swap the set in only when it is valid."""
        self._seen = fingerprint(self.directory)  # taken first: a later write is seen again
        try:
            fresh = load_policies(self.directory, presets=self.presets)
        except PolicyError as e:
            log.error("policy reload (%s) failed, keeping the previous policies:\n%s", trigger, e)
            result = self._record(trigger, False, str(e))
        else:
            self._current = fresh
            for warning in fresh.warnings:
                log.warning("%s", warning)
            log.info("policies reloaded (%s): %s", trigger,
                     ", ".join(p.client for p in fresh.policies))
            result = self._record(trigger, True, None)
        if self._on_reload:
            self._on_reload(result)
        return result

    def check(self) -> ReloadResult | None:
        """Reload when a file was added, removed or changed since the last look."""
        if fingerprint(self.directory) == self._seen:
            return None
        return self.reload("file-change")

    async def run(self) -> None:
        """Poll for changes until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            self.check()

    def install_sighup(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Reload on SIGHUP; False where the platform has no SIGHUP or loop signal handlers."""
        loop = loop or asyncio.get_running_loop()
        sighup = getattr(signal, "SIGHUP", None)
        if sighup is None:
            return False
        try:
            loop.add_signal_handler(sighup, self.reload, "sighup")
        except (NotImplementedError, RuntimeError):
            return False
        return True

    def remove_sighup(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        sighup = getattr(signal, "SIGHUP", None)
        if sighup is not None:
            (loop or asyncio.get_running_loop()).remove_signal_handler(sighup)

    async def wait_reload(self, after: int = 0) -> ReloadResult:
        """Wait until more than ``after`` reload attempts have happened; the latest result."""
        while self._attempts <= after:
            await self._changed.wait()
        assert self._last is not None
        return self._last

    def _record(self, trigger: str, ok: bool, error: str | None) -> ReloadResult:
        self._attempts += 1
        self._last = ReloadResult(self._attempts, trigger, ok, error, self._current)
        if self._metrics:
            self._metrics.policy_reloads.labels("ok" if ok else "error").inc()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return self._last


def fingerprint(directory: Path) -> Fingerprint:
    """Name, mtime (ns) and size of every ``*.toml``: any edit, addition or removal shows."""
    entries = []
    try:
        paths = sorted(directory.glob("*.toml"))
    except OSError:
        return ()
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue  # removed between the listing and the stat
        entries.append((path.name, st.st_mtime_ns, st.st_size))
    return tuple(entries)
