"""Keep the current ``PolicySet``: reload on SIGHUP, ``POST /admin/reload``, and when a
``*.toml`` file changes.

Explicit reloads (SIGHUP, the admin endpoint) read the directory once and take whatever
valid set they find: the operator asked for it.

Automatic reloads (polling every ``interval`` seconds) guard against files caught while
being written (an editor or ``cp`` that truncates a file and rewrites it in place):

- every poll reads all the files (a few KiB); a file set is taken only once two polls in a
  row read exactly the same bytes (stable for at least one interval), and the set is parsed
  from those very bytes, so no read can land in the middle of a later write;
- a set that would widen access (``widening``: the default policy stops requiring a key, or
  a policy that required its key stops) is *held*, not applied: a truncated file loses its
  later lines, whose defaults are the permissive ones, so such a parse may simply have lost
  content. It is logged with what it would open, counted as
  ``speclane_policy_reloads_total{result="held"}`` and applied by SIGHUP or
  ``POST /admin/reload``. Narrowing changes and everything else apply by themselves.
- atomic renames (write elsewhere, ``mv`` over) are ordinary changes.

A reload that fails keeps the last good set, logs the error and counts
``speclane_policy_reloads_total{result="error"}``; so does an OS error while reading (for
example running out of file descriptors): it is logged (once per distinct message), counted
on every poll it happens, and watching goes on. Tests and the app wait on ``wait_reload()``
or an ``on_reload`` callback.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from router.config.policies import (
    PolicyError,
    PolicyFiles,
    PolicySet,
    parse_policies,
    read_policy_files,
)
from router.config.speculation import SpecSettings
from router.metrics import Metrics

log = logging.getLogger("speclane.policy")

Fingerprint = tuple[tuple[str, int, int], ...]
Outcome = str  # "ok", "error" or "held": the metric's label


@dataclass(frozen=True, slots=True)
class ReloadResult:
    attempt: int  # 1 for the first reload after start, counting failures too
    trigger: str  # "sighup", "file-change", "admin", or what the caller passed
    ok: bool
    error: str | None
    policies: PolicySet  # the set in force after this attempt
    held: bool = False  # a valid set that would widen access, waiting for an explicit reload


class PolicyWatcher:
    def __init__(
        self,
        directory: Path,
        initial: PolicySet,
        *,
        presets: Collection[str] | None = None,
        spec: SpecSettings | None = None,
        metrics: Metrics | None = None,
        interval: float = 2.0,
        on_reload: Callable[[ReloadResult], None] | None = None,
    ) -> None:
        """``initial``: the set ``serve`` loaded (and refused to start without)."""
        self.directory = directory
        self.presets = presets
        self.spec = spec
        self.interval = interval
        self._metrics = metrics
        self._on_reload = on_reload
        self._current = initial
        self._seen: PolicyFiles | None = self._read_quietly()  # what the last attempt took
        self._candidate: PolicyFiles | None = None  # changed at the last poll: settling?
        self._last_os_error: str | None = None
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
        """Explicit reload: read the directory now and take any valid set (never raises)."""
        self._candidate = None
        files = self._read(trigger)
        if isinstance(files, ReloadResult):
            return files
        return self._apply(files, trigger, explicit=True)

    def check(self) -> ReloadResult | None:
        """One poll: reload when the files changed and then stayed the same for a poll."""
        files = self._read("file-change")
        if isinstance(files, ReloadResult):
            return files
        if files == self._seen:
            self._candidate = None
            return None
        if files != self._candidate:
            self._candidate = files  # changed (or still changing): look again next poll
            return None
        self._candidate = None
        return self._apply(files, "file-change", explicit=False)

    async def run(self) -> None:
        """Poll for changes until cancelled; no error stops it."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.check()
            except Exception:  # a bug here must not end hot reload for good
                log.exception("policy watcher: unexpected error; watching goes on")
                self._count("error")

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

    # --- internals ----------------------------------------------------------------------

    def _read_quietly(self) -> PolicyFiles | None:
        try:
            return read_policy_files(self.directory) if self.directory.is_dir() else None
        except OSError:
            return None

    def _read(self, trigger: str) -> PolicyFiles | ReloadResult:
        """The directory's files, or the error result of an attempt that could not read."""
        try:
            if not self.directory.is_dir():
                raise NotADirectoryError(f"{self.directory}: not a directory")
            files = read_policy_files(self.directory)
        except OSError as e:
            message = f"cannot read the policy directory {self.directory}: {e}"
            if message != self._last_os_error:  # once per distinct error, not every poll
                log.error("policy reload (%s) failed, keeping the previous policies: %s",
                          trigger, message)
            self._last_os_error = message
            return self._finish(trigger, "error", message)
        if self._last_os_error is not None:
            log.info("policy directory %s is readable again", self.directory)
            self._last_os_error = None
        return files

    def _apply(self, files: PolicyFiles, trigger: str, *, explicit: bool) -> ReloadResult:
        self._seen = files
        try:
            fresh = parse_policies(self.directory, files, presets=self.presets, spec=self.spec)
        except PolicyError as e:
            log.error("policy reload (%s) failed, keeping the previous policies:\n%s", trigger, e)
            return self._finish(trigger, "error", str(e))
        if not explicit and (opens := widening(self._current, fresh)):
            message = (f"policy change held, not applied: it would {'; '.join(opens)}. A file "
                       "caught while being rewritten can read like this. If the change is "
                       "meant, apply it with SIGHUP or POST /admin/reload")
            log.warning("%s", message)
            return self._finish(trigger, "held", message)
        self._current = fresh
        for warning in fresh.warnings:
            log.warning("%s", warning)
        log.info("policies reloaded (%s): %s", trigger,
                 ", ".join(p.client for p in fresh.policies))
        return self._finish(trigger, "ok", None)

    def _finish(self, trigger: str, outcome: Outcome, error: str | None) -> ReloadResult:
        self._attempts += 1
        self._last = ReloadResult(self._attempts, trigger, outcome == "ok", error,
                                  self._current, held=outcome == "held")
        self._count(outcome)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        if self._on_reload:
            self._on_reload(self._last)
        return self._last

    def _count(self, outcome: Outcome) -> None:
        if self._metrics:
            self._metrics.policy_reloads.labels(outcome).inc()


def widening(old: PolicySet, new: PolicySet) -> list[str]:
    """What ``new`` would open to requests that ``old`` refused without a key (empty: nothing).

    A policy that disappears is not widening: under the key rule its name then selects the
    default, which is what a request without its key already got.
    """
    opens = []
    if old.default.require_api_key and not new.default.require_api_key:
        opens.append("serve requests without an API key (the default policy no longer "
                     "requires one)")
    for policy in old:
        after = new.get(policy.client)
        if policy.require_api_key and after is not None and not after.require_api_key \
                and policy.client != old.default.client:
            opens.append(f"let client '{policy.client}' be used without its key")
    return opens


def fingerprint(directory: Path) -> Fingerprint:
    """Name, mtime (ns) and size of every ``*.toml`` (for status displays and tests)."""
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
