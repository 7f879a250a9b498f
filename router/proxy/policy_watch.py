"""Keep the current ``PolicySet``: reload on SIGHUP, ``POST /admin/reload``, and when a
``*.toml`` file changes.

Every reload guards against files caught while being written (an editor or ``cp`` that
truncates a file and rewrites it in place, pausing between writes):

- a reading is taken only once the directory has *settled*: nothing in it (no file's
  mtime or size, no name, the directory's own mtime) has changed for ``settle`` seconds
  (``policy_settle_seconds``), judged by the newest mtime or, when clocks disagree, by
  how long this watcher has seen it unchanged;
- the files' size and mtime are the same before and after the read, and every file read
  has the size it was listed with; otherwise the reading is torn and thrown away;
- the set is parsed from the very bytes read, so no later write lands in it.

So a torn file never replaces a good one, whether it would widen or narrow access.
Automatic reloads (polling every ``interval`` seconds) also need two polls in a row to read
the same bytes. Explicit reloads (SIGHUP, the admin endpoint, ``speclane policy reload``)
wait for the settle time (at most ``patience`` seconds, then fail and keep the set).

A set that would widen access (``widening``: the default policy stops requiring a key, or a
policy that required its key stops) is *held*, not applied, by the poller and by a bare
``POST /admin/reload`` (one that carries neither the admin key nor the local admin token:
any web page could have sent it). It is logged with what it would open, counted as
``speclane_policy_reloads_total{result="held"}``, and applied by SIGHUP, by
``speclane policy reload`` or by ``POST /admin/reload`` with the admin key. Atomic renames
(write elsewhere, ``mv`` over) are ordinary changes.

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
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from router.config.policies import (
    MAX_POLICY_FILE_BYTES,
    PolicyError,
    PolicyFiles,
    PolicySet,
    parse_policies,
    read_policy_files,
)
from router.config.speculation import SpecSettings
from router.metrics import Metrics
from router.periodic import Periodic

log = logging.getLogger("speclane.policy")

Fingerprint = tuple[tuple[str, int, int], ...]
Stamp = tuple[int, Fingerprint]  # the directory's mtime (ns), then its files'
Outcome = str  # "ok", "error" or "held": the metric's label
TORN_RETRY = 0.05  # seconds before reading again a directory caught while changing
MIN_PATIENCE = 10.0  # seconds an explicit reload waits for the files to settle, at least


@dataclass(frozen=True, slots=True)
class Reading:
    """The policy files' bytes, read while nothing changed (``stamp`` before = after)."""

    files: PolicyFiles
    stamp: Stamp


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
        settle: float = 0.0,
        patience: float | None = None,
        on_reload: Callable[[ReloadResult], None] | None = None,
    ) -> None:
        """``initial``: the set ``serve`` loaded (and refused to start without).
        ``settle``: seconds the directory must stay unchanged before a reading is taken;
        ``patience``: how long an explicit reload waits for that."""
        self.directory = directory
        self.presets = presets
        self.spec = spec
        self.interval = interval
        self.settle = settle
        self.patience = patience if patience is not None else max(MIN_PATIENCE, 3 * settle)
        self._metrics = metrics
        self._on_reload = on_reload
        self._current = initial
        self._seen: PolicyFiles | None = self._read_quietly()  # what the last attempt took
        self._candidate: Reading | None = None  # changed at the last poll: settling?
        self._candidate_since = 0.0  # monotonic time the candidate was first read
        self._sighup_task: asyncio.Task[ReloadResult] | None = None
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

    async def reload(self, trigger: str = "manual", *, widen: bool = True) -> ReloadResult:
        """Explicit reload: wait until the directory has settled, then take any valid set
        (a widening one only with ``widen``; else it is held). Never raises."""
        self._candidate = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.patience
        last: Stamp | None = None
        since = time.monotonic()
        while True:
            reading = self._read(trigger)
            if isinstance(reading, ReloadResult):
                return reading
            wait = TORN_RETRY
            if reading is not None:
                if reading.stamp != last:
                    last, since = reading.stamp, time.monotonic()
                wait = self._settle_left(reading.stamp, since)
                if wait <= 0:
                    return self._apply(reading.files, trigger, widen=widen)
            if loop.time() + wait > deadline:
                message = (
                    f"the policy files in {self.directory} kept changing for "
                    f"{self.patience:g} s (they must stay unchanged for "
                    f"{self.settle:g} s); nothing was applied"
                )
                log.error(
                    "policy reload (%s) failed, keeping the previous policies: %s", trigger, message
                )
                return self._finish(trigger, "error", message)
            await asyncio.sleep(wait)

    def check(self) -> ReloadResult | None:
        """One poll: reload when the files changed, then read the same for two polls in a
        row and have settled."""
        reading = self._read("file-change")
        if isinstance(reading, ReloadResult):
            return reading
        if reading is None:  # being written right now
            self._candidate = None
            return None
        if reading.files == self._seen:
            self._candidate = None
            return None
        if reading != self._candidate:
            self._candidate = reading  # changed (or still changing): look again next poll
            self._candidate_since = time.monotonic()
            return None
        if self._settle_left(reading.stamp, self._candidate_since) > 0:
            return None
        self._candidate = None
        return self._apply(reading.files, "file-change", widen=False)

    def poller(self) -> Periodic:
        """The polling task: one check every ``interval`` seconds; no error stops it."""
        return Periodic(
            "speclane-policy-watch",
            self.check,
            self.interval,
            wait_first=True,
            on_error=self._poll_failed,
        )

    def _poll_failed(self, error: Exception) -> None:
        # A bug here must not end hot reload for good.
        log.error("policy watcher: unexpected error; watching goes on", exc_info=error)
        self._count("error")

    def install_sighup(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Reload on SIGHUP; False where the platform has no SIGHUP or loop signal handlers."""
        loop = loop or asyncio.get_running_loop()
        sighup = getattr(signal, "SIGHUP", None)
        if sighup is None:
            return False
        try:
            loop.add_signal_handler(sighup, self._on_sighup)
        except (NotImplementedError, RuntimeError):
            return False
        return True

    def remove_sighup(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        sighup = getattr(signal, "SIGHUP", None)
        if sighup is not None:
            (loop or asyncio.get_running_loop()).remove_signal_handler(sighup)
        if self._sighup_task is not None:
            self._sighup_task.cancel()

    def _on_sighup(self) -> None:
        # Signals arriving while a reload waits for the files to settle join that reload.
        if self._sighup_task is None or self._sighup_task.done():
            self._sighup_task = asyncio.get_running_loop().create_task(
                self.reload("sighup"), name="speclane-policy-sighup"
            )

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

    def _read(self, trigger: str) -> Reading | ReloadResult | None:
        """The directory's files (None: caught changing), or the error result of an attempt
        that could not read."""
        try:
            if not self.directory.is_dir():
                raise NotADirectoryError(f"{self.directory}: not a directory")
            before = stamp(self.directory)
            files = read_policy_files(self.directory)
            after = stamp(self.directory)
        except OSError as e:
            message = f"cannot read the policy directory {self.directory}: {e}"
            if message != self._last_os_error:  # once per distinct error, not every poll
                log.error(
                    "policy reload (%s) failed, keeping the previous policies: %s", trigger, message
                )
            self._last_os_error = message
            return self._finish(trigger, "error", message)
        if self._last_os_error is not None:
            log.info("policy directory %s is readable again", self.directory)
            self._last_os_error = None
        return Reading(files, after) if whole(files, before, after) else None

    def _settle_left(self, seen: Stamp, since: float) -> float:
        """Seconds until the directory counts as settled (<= 0: it has)."""
        newest = max([seen[0], *(mtime for _, mtime, _ in seen[1])]) / 1e9
        unchanged = max(time.time() - newest, time.monotonic() - since)
        return self.settle - unchanged

    def _apply(self, files: PolicyFiles, trigger: str, *, widen: bool) -> ReloadResult:
        self._seen = files
        try:
            fresh = parse_policies(self.directory, files, presets=self.presets, spec=self.spec)
        except PolicyError as e:
            log.error("policy reload (%s) failed, keeping the previous policies:\n%s", trigger, e)
            return self._finish(trigger, "error", str(e))
        if not widen and (opens := widening(self._current, fresh)):
            message = (
                f"policy change held, not applied: it would {'; '.join(opens)}. A file "
                "caught while being rewritten can read like this. If the change is "
                "meant, apply it with 'speclane policy reload', SIGHUP, or "
                "POST /admin/reload with the admin key"
            )
            log.warning("%s", message)
            return self._finish(trigger, "held", message)
        self._current = fresh
        for note in fresh.notes:  # said at start-up already
            log.debug("%s", note)
        for warning in fresh.warnings:
            log.warning("%s", warning)
        log.info("policies reloaded (%s): %s", trigger, ", ".join(p.client for p in fresh.policies))
        return self._finish(trigger, "ok", None)

    def _finish(self, trigger: str, outcome: Outcome, error: str | None) -> ReloadResult:
        self._attempts += 1
        self._last = ReloadResult(
            self._attempts, trigger, outcome == "ok", error, self._current, held=outcome == "held"
        )
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
        opens.append(
            "serve requests without an API key (the default policy no longer requires one)"
        )
    for policy in old:
        after = new.get(policy.client)
        if (
            policy.require_api_key
            and after is not None
            and not after.require_api_key
            and policy.client != old.default.client
        ):
            opens.append(f"let client '{policy.client}' be used without its key")
    return opens


def stamp(directory: Path) -> Stamp:
    """What changes when anything in the directory does; raises OSError when it cannot be
    read (a file added, removed or renamed moves the directory's mtime)."""
    return directory.stat().st_mtime_ns, fingerprint(directory)


def whole(files: PolicyFiles, before: Stamp, after: Stamp) -> bool:
    """Whether a reading between two stamps saw every file as it was listed: nothing moved
    during the read and each file holds the size it was listed with."""
    if before != after:
        return False
    sizes = {name: size for name, _, size in after[1]}
    for name, data in files.items():
        if data is not None and len(data) <= MAX_POLICY_FILE_BYTES and len(data) != sizes.get(name):
            return False
    return True


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
