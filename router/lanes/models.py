"""Models on demand: the lanes of every servable model (``router.lanes.catalog``), loaded
when a request asks for one and unloaded when idle or when memory is needed.

Each model has a state (``unloaded``, ``loading``, ``loaded``, ``failed``). ``ensure(name)``
loads it once however many requests ask at the same time (they share one load task), after
making room: ``router.lanes.residency`` names the least recently used idle models to unload
so that the new model's layout estimate fits under the limit (``[lanes]
memory_limit_bytes``, else the available memory at start-up less the reserve of
``router.lanes.layout``). When nothing can be unloaded the load waits for a model to become
idle (bounded by ``load_timeout``) and then fails as ``memory_busy`` naming the models that
hold the memory. A model with a request in flight (``hold``, around the whole request
including its stream) is never unloaded; an idle one is unloaded after its TTL (a periodic
check), or after the deadline a request set (Ollama's ``keep_alive``).

Loading starts the model's lanes as ``router.lanes.group.start_model`` does for the
start-up model; unloading takes its backends out of the pool first (no request is routed to
it any more) and then stops its workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from router.backends.base import Backend
from router.backends.pool import BackendPool
from router.config.settings import LanesSettings, Settings
from router.kernel.errors import RouterError
from router.lanes.catalog import Catalog, CatalogModel, build, from_entry, list_dir
from router.lanes.group import (
    LaneModels,
    LaneStartupError,
    StartedLanes,
    layout_choice,
    start_model,
    stop_lanes,
)
from router.lanes.layout import LayoutChoice, default_limit, gib
from router.lanes.loadqueue import LoadQueue
from router.lanes.memory import machine_memory, weights_bytes
from router.lanes.modelprep import models_dir
from router.lanes.residency import (
    Idle,
    Resident,
    RoomPlan,
    check_interval,
    expired,
    make_room,
)
from router.lanes.status import LaneState
from router.lanes.supervisor import LaneSupervisor
from router.metrics import Metrics
from router.periodic import Periodic

log = logging.getLogger("speclane.models")

State = Literal["unloaded", "loading", "loaded", "failed"]
STATES: tuple[State, ...] = ("unloaded", "loading", "loaded", "failed")
UnloadReason = Literal["ttl", "memory", "keep_alive", "shutdown", "failed"]
# A name the catalog does not know makes the models directory be read again, at most this
# often: a model folder added while speclane runs is servable without a restart.
RESCAN_INTERVAL = 2.0


# How long a client is told to wait before trying again after a 503 of a load.
RETRY_AFTER = "5"


class ModelUnavailable(RouterError):
    """A model could not be loaded for a request: a 503 whose ``code`` says how
    (``model_load_failed``, ``model_memory_busy``, ``model_load_timeout``,
    ``model_load_queue_full``), rendered in the caller's API shape like any RouterError."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(
            503,
            message,
            type="service_unavailable",
            code=code,
            headers={"Retry-After": RETRY_AFTER},
        )


class NeverFits(LaneStartupError):
    """The model is larger than the memory limit alone: said to the client as it is."""


def new_error_id() -> str:
    return "load_" + secrets.token_hex(6)


def load_failed(name: str, error_id: str) -> ModelUnavailable:
    """What the client is told of a failed load: the model and an id to find the detail in
    the router's log (a worker's stderr, the server's file paths), never the detail itself."""
    return ModelUnavailable(
        "model_load_failed",
        f"model '{name}' could not be loaded (error id {error_id}: the router's log and "
        "/admin/lanes have the detail)",
    )


def catalog_for(settings: Settings, startup: LaneModels | None) -> Catalog:
    """Every servable model: the start-up model (``startup``), the ``[[lanes.models]]``
    entries and the folders of ``models_dir`` (read once, at start-up)."""
    lanes = settings.lanes
    directory = lanes.models_dir.expanduser() if lanes.models_dir is not None else models_dir()
    entries = [from_entry(e, weights_bytes(e.path)) for e in lanes.models]
    first = None
    if startup is not None:
        first = CatalogModel(
            startup.name,
            startup.model,
            startup.draft,
            group=startup.group,
            size_bytes=weights_bytes(startup.model),
        )
    folders = list_dir(Path(directory))
    if startup is not None:  # its own folder under another name is the same model
        own = os.path.abspath(os.path.expanduser(startup.model))
        folders = [f for f in folders if os.path.abspath(f.path) != own]
    return build(folders, entries, first)


def memory_budget(lanes: LanesSettings) -> int:
    """What all loaded models together may hold: ``memory_limit_bytes``, else the available
    memory less the reserve, read before any model of ours is loaded."""
    if lanes.memory_limit_bytes is not None:
        return lanes.memory_limit_bytes
    return default_limit(machine_memory(lanes.machine_memory_bytes))


@dataclass(eq=False)
class Slot:
    """One servable model's live state (one writer: the manager)."""

    model: CatalogModel
    state: State = "unloaded"
    started: StartedLanes | None = None
    estimate_bytes: int = 0  # of its chosen layout, once planned
    choice: LayoutChoice | None = None
    load: asyncio.Task[None] | None = None  # the one load every waiter shares
    unloading: asyncio.Task[None] | None = None
    last_used: float = 0.0
    in_flight: int = 0
    deadline: float | None = None  # an idle deadline a request set (keep_alive)
    last_error: str | None = None
    last_load_seconds: float | None = None
    reserved: bool = False  # loading, its memory granted (counted against the limit)

    @property
    def backends(self) -> list[Backend]:
        return self.started.backends if self.started is not None else []

    @property
    def supervisors(self) -> list[LaneSupervisor]:
        return self.started.supervisors if self.started is not None else []


@dataclass
class ModelManager:
    settings: Settings
    pool: BackendPool
    metrics: Metrics
    catalog: Catalog
    limit_bytes: int
    clock: Callable[[], float] = time.monotonic
    _slots: dict[str, Slot] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _queue: LoadQueue = field(default_factory=lambda: LoadQueue(0))
    _ttl_check: Periodic | None = None
    _background: set[asyncio.Task[None]] = field(default_factory=set)
    # Reads the catalog again (the models directory); None: the catalog never changes.
    rescan: Callable[[], Catalog] | None = None
    _scanned_at: float = 0.0

    def __post_init__(self) -> None:
        self._slots = {m.name: Slot(m) for m in self.catalog.models}
        for slot in self._slots.values():
            self._publish(slot)
        self._scanned_at = self.clock()

    def refresh(self, *, force: bool = False) -> None:
        """Read the catalog again (at most every ``RESCAN_INTERVAL`` unless ``force``): new
        folders become servable; a model whose folder is gone stays while it is loaded."""
        now = self.clock()
        if self.rescan is None or (not force and now - self._scanned_at < RESCAN_INTERVAL):
            return
        self._scanned_at = now
        try:
            fresh = self.rescan()
        except OSError as e:
            log.warning("models: could not read the models directory again: %s", e)
            return
        kept = [
            s.model
            for s in self._slots.values()
            if s.model.name not in fresh.names() and (s.state != "unloaded" or s.in_flight)
        ]
        for model in fresh.models:
            slot = self._slots.get(model.name)
            if slot is None:
                self._slots[model.name] = slot = Slot(model)
                log.info("models: %s found in the models directory", model.name)
            elif slot.state == "unloaded":
                slot.model = model  # its folder may have changed
            self._publish(slot)
        for name in [n for n in self._slots if n not in fresh.names()]:
            if self._slots[name].model not in kept:
                del self._slots[name]
                for state in STATES:
                    self.metrics.model_state.labels(name, state).set(0)
        self.catalog = Catalog((*fresh.models, *kept))

    # --- the start-up model and the TTL check -----------------------------------------

    async def start(self, startup: StartedLanes | None) -> None:
        """Record the start-up model's lanes (started by ``group.start_lanes``) as loaded
        and start the TTL check."""
        first = self.catalog.models[0] if self.catalog.models else None
        if startup is not None and first is not None and first.origin == "startup":
            slot = self._slots[first.name]
            slot.started, slot.choice = startup, startup.layout
            slot.estimate_bytes = startup.layout.estimate_bytes if startup.layout else 0
            slot.last_used = self.clock()
            self._set_state(slot, "loaded")
        ttls = [self.ttl_of(s.model) for s in self._slots.values()]
        self._ttl_check = Periodic(
            "models-ttl", self.check_ttl, check_interval(ttls), wait_first=True, on_error=_log
        )
        self._ttl_check.start()

    async def stop(self) -> None:
        if self._ttl_check is not None:
            await self._ttl_check.stop()
        for slot in self._slots.values():
            if slot.load is not None and not slot.load.done():
                slot.load.cancel()
                with contextlib.suppress(BaseException):
                    await slot.load
        for task in list(self._background):
            with contextlib.suppress(BaseException):
                await task
        await asyncio.gather(
            *(self._unload(s, "shutdown") for s in self._slots.values() if s.state == "loaded")
        )
        pending = [s.unloading for s in self._slots.values() if s.unloading is not None]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def check_ttl(self) -> None:
        now = self.clock()
        idle = [
            Idle(
                s.model.name,
                s.last_used,
                self.ttl_of(s.model),
                s.in_flight,
                s.model.is_pinned,
                s.deadline,
            )
            for s in self._slots.values()
            if s.state == "loaded"
        ]
        for name in expired(now, idle):
            slot = self._slots[name]
            reason: UnloadReason = "keep_alive" if slot.deadline is not None else "ttl"
            log.info(
                "model %s: idle for %.1f s, unloading (%s)", name, now - slot.last_used, reason
            )
            await self._unload(slot, reason)

    # --- what requests use ------------------------------------------------------------

    def resolve(self, name: str) -> str | None:
        """The servable model ``name`` names (itself or an alias), or None (after reading
        the models directory again, when it was not read just now)."""
        found = self.catalog.canonical(name)
        if found is None and self.rescan is not None:
            self.refresh()
            found = self.catalog.canonical(name)
        return found

    def needs_load(self, name: str) -> bool:
        """Not loaded, or loaded with every lane given up by its supervisor (restarted too
        often): a request then loads it again instead of getting 503s until a restart."""
        slot = self._slots.get(name)
        if slot is None:
            return False
        return slot.state != "loaded" or self._given_up(slot)

    @staticmethod
    def _given_up(slot: Slot) -> bool:
        sups = slot.supervisors
        return bool(sups) and all(s.status.state is LaneState.FAILED for s in sups)

    def state(self, name: str) -> State | None:
        slot = self._slots.get(name)
        return slot.state if slot is not None else None

    def ttl_of(self, model: CatalogModel) -> float:
        return self.settings.lanes.ttl if model.ttl is None else model.ttl

    @contextlib.contextmanager
    def hold(self, name: str, keep_alive: float | None = None) -> Iterator[None]:
        """Count one request on ``name`` from before its load to the end of its answer:
        a model with one in flight is never unloaded. ``keep_alive``: seconds the model
        stays loaded once idle (0: unloaded after this answer; < 0: until speclane stops)."""
        slot = self._slots[name]
        slot.in_flight += 1
        try:
            yield
        finally:
            slot.in_flight -= 1
            slot.last_used = self.clock()
            if keep_alive is not None:
                slot.deadline = slot.last_used + keep_alive if keep_alive >= 0 else float("inf")
            self._signal()
            if slot.in_flight == 0 and keep_alive == 0 and slot.state == "loaded":
                if not slot.model.is_pinned:
                    self._unload_soon(slot, "keep_alive")

    async def ensure(self, name: str, client: str = "") -> float:
        """Load ``name`` unless it is loaded; the seconds this caller waited. Raises
        ModelUnavailable (the load failed, no memory could be freed in time, too many
        waiting, or ``load_timeout`` passed). ``client``: whose request waits; the places
        of ``lanes.load_queue`` are shared fairly between clients (``router.lanes.loadqueue``)."""
        slot = self._slots[name]
        if slot.state == "loaded" and self._given_up(slot):
            log.warning("model %s: every lane was given up; loading it again", name)
            await self._unload(slot, "failed")
        if slot.state == "loaded":
            return 0.0
        lanes = self.settings.lanes
        self._queue.limit = lanes.load_queue  # (settings are fixed; tests may lower it)
        place = self._queue.enter(client)
        if place is None:
            raise self._queue_full(name)
        if slot.load is None or slot.load.done():
            slot.load = asyncio.create_task(self._load(slot), name=f"load-{name}")
            slot.load.add_done_callback(_retrieved)
        load = slot.load
        began = self.clock()
        try:
            # Neither end of the wait cancels the load: other requests share it.
            done, _ = await asyncio.wait(
                {load, place}, timeout=lanes.load_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            self._queue.leave(client, place)
        if load in done:
            try:
                load.result()
            except ModelUnavailable as e:
                # One load, many waiters: each gets its own error (the proxy adds its headers).
                raise ModelUnavailable(str(e.code), e.message) from None
            return self.clock() - began
        if place in done:  # another client's request took this place
            raise self._queue_full(name)
        if slot.state == "loading" and not slot.reserved:  # still waiting for memory
            raise ModelUnavailable(
                "model_memory_busy", self._busy_message(slot, self.room_for(slot))
            )
        raise ModelUnavailable(
            "model_load_timeout",
            f"model '{name}' did not load within lanes.load_timeout "
            f"({lanes.load_timeout:g} s); it is {slot.state}",
        )

    def _queue_full(self, name: str) -> ModelUnavailable:
        return ModelUnavailable(
            "model_load_queue_full",
            f"model '{name}' is not loaded and {len(self._queue)} requests already wait "
            "for models to load (lanes.load_queue, shared fairly between clients); try "
            "again shortly",
        )

    # --- loading and unloading --------------------------------------------------------

    async def _load(self, slot: Slot) -> None:
        name = slot.model.name
        began = self.clock()
        self._set_state(slot, "loading")
        try:
            await self._load_steps(slot, began)
        finally:
            slot.reserved = False
        seconds = self.clock() - began
        slot.last_error, slot.last_load_seconds = None, seconds
        slot.last_used, slot.deadline = self.clock(), None
        self._set_state(slot, "loaded")
        self.metrics.model_loads.labels(name, "loaded").inc()
        self.metrics.model_load_seconds.labels(name).observe(seconds)
        log.info("model %s: loaded in %.1f s", name, seconds)

    async def _load_steps(self, slot: Slot, began: float) -> None:
        name = slot.model.name
        try:
            if slot.unloading is not None:  # its own unload still ending: let it finish
                await asyncio.gather(slot.unloading, return_exceptions=True)
            models = LaneModels(slot.model.path, slot.model.draft, name, slot.model.group)
            choice = layout_choice(self.settings.lanes, models, slot.model.layout)
            slot.choice, slot.estimate_bytes = choice, choice.estimate_bytes
            await self._make_room(slot, began)
            log.info("model %s: loading (%s)", name, choice.summary())
            slot.started = await start_model(
                self.settings,
                self.pool,
                self.metrics,
                models,
                default=False,
                choice=choice,
                first_ready=True,  # its first request goes to the first lane ready
            )
        except ModelUnavailable as e:
            slot.last_error = e.message
            self._set_state(slot, "unloaded")
            self.metrics.model_loads.labels(name, "memory_busy").inc()
            raise
        except NeverFits as e:  # sizes and a setting's name: nothing of the server's
            slot.last_error = str(e)
            self._set_state(slot, "failed")
            self.metrics.model_loads.labels(name, "failed").inc()
            log.warning("model %s: cannot load: %s", name, e)
            raise ModelUnavailable(
                "model_load_failed", f"model '{name}' could not be loaded: {e}"
            ) from None
        except LaneStartupError as e:
            error_id = new_error_id()
            slot.last_error = f"{e} (error id {error_id})"
            self._set_state(slot, "failed")
            self.metrics.model_loads.labels(name, "failed").inc()
            log.warning("model %s: could not load (error id %s): %s", name, error_id, e)
            raise load_failed(name, error_id) from None
        except asyncio.CancelledError:
            self._set_state(slot, "unloaded")
            raise
        except Exception as e:  # any defect: the model is failed, the others keep serving
            error_id = new_error_id()
            log.exception("model %s: load failed (error id %s)", name, error_id)
            slot.last_error = f"{type(e).__name__}: {e} (error id {error_id})"
            self._set_state(slot, "failed")
            self.metrics.model_loads.labels(name, "failed").inc()
            raise load_failed(name, error_id) from None

    async def _make_room(self, slot: Slot, began: float) -> None:
        """Unload idle models until ``slot`` fits, waiting for one to become idle while
        none is, until ``load_timeout``."""
        deadline = began + self.settings.lanes.load_timeout
        while True:
            plan = self.room_for(slot)
            if plan.never_fits:
                raise NeverFits(
                    f"its lanes need about {gib(plan.need_bytes)} (layout "
                    f"{slot.choice.layout if slot.choice else '?'}) but only "
                    f"{gib(plan.limit_bytes)} may be used (lanes.memory_limit_bytes)"
                )
            if plan.fits and not plan.evict:
                slot.reserved = True  # from here a concurrent load counts it
                return
            if plan.fits:
                for other in plan.evict:
                    log.info("model %s: unloading %s to make room", slot.model.name, other)
                    await self._unload(self._slots[other], "memory")
                continue  # plan again: a model may have got a request meanwhile
            remaining = deadline - self.clock()
            if remaining <= 0 or plan.blocked_by_pinned:  # pinned: no wait can end well
                raise ModelUnavailable("model_memory_busy", self._busy_message(slot, plan))
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                raise ModelUnavailable(
                    "model_memory_busy", self._busy_message(slot, self.room_for(slot))
                ) from None

    def room_for(self, slot: Slot) -> RoomPlan:
        residents = [
            Resident(
                s.model.name,
                s.estimate_bytes,
                s.last_used,
                s.in_flight,
                s.model.is_pinned,
                loading=s.state == "loading" or s.unloading is not None,
            )
            for s in self._slots.values()
            if s is not slot and (s.state == "loaded" or s.reserved or s.unloading is not None)
        ]
        return make_room(slot.estimate_bytes, self.limit_bytes, residents)

    def _busy_message(self, slot: Slot, plan: RoomPlan) -> str:
        holders = ", ".join(
            f"{h} ({self._slots[h].in_flight} in flight"
            + (", pinned" if self._slots[h].model.is_pinned else "")
            + ")"
            for h in plan.holders
        )
        if plan.blocked_by_pinned:
            return (
                f"model '{slot.model.name}' needs about {gib(plan.need_bytes)} and does not "
                f"fit in {gib(plan.limit_bytes)} beside the pinned models, which are never "
                f"unloaded: {holders or 'none'}; it cannot load while they are pinned"
            )
        return (
            f"model '{slot.model.name}' needs about {gib(plan.need_bytes)} but "
            f"{gib(plan.used_bytes)} of {gib(plan.limit_bytes)} is held by models that cannot "
            f"be unloaded now: {holders or 'none'}; try again when they are idle"
        )

    async def _unload(self, slot: Slot, reason: UnloadReason) -> None:
        """Out of the pool at once (synchronously: no request is routed to it after this
        line), then its workers stop; the slot counts as holding memory until they have.
        Never a model with a request in flight (but at shutdown)."""
        if slot.state != "loaded" or slot.started is None:
            return
        if slot.in_flight > 0 and reason not in ("shutdown", "failed"):
            return  # (a failed model's requests fail on their own: its lanes are gone)
        started, slot.started = slot.started, None
        for backend in started.backends:
            self.pool.remove(backend.name)
        slot.deadline = None
        self._set_state(slot, "unloaded")
        self.metrics.model_unloads.labels(slot.model.name, reason).inc()
        stopping = asyncio.create_task(
            self._stop_workers(slot, started, reason), name=f"unload-{slot.model.name}"
        )
        slot.unloading = stopping
        await asyncio.shield(stopping)

    async def _stop_workers(self, slot: Slot, started: StartedLanes, reason: str) -> None:
        try:
            await stop_lanes(started.supervisors, self.settings)
            log.info("model %s: unloaded (%s)", slot.model.name, reason)
        finally:
            if slot.unloading is asyncio.current_task():
                slot.unloading = None
            self._signal()

    def _unload_soon(self, slot: Slot, reason: UnloadReason) -> None:
        task = asyncio.create_task(self._unload(slot, reason), name=f"unload-{slot.model.name}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- what admin, listings and metrics show -----------------------------------------

    def _set_state(self, slot: Slot, state: State) -> None:
        slot.state = state
        self._publish(slot)
        self._signal()

    def _publish(self, slot: Slot) -> None:
        for state in STATES:
            self.metrics.model_state.labels(slot.model.name, state).set(
                1 if state == slot.state else 0
            )

    def _signal(self) -> None:
        """Wake whatever waits for memory: a model became idle or was unloaded."""
        self._changed.set()
        self._changed = asyncio.Event()

    def supervisors(self) -> list[LaneSupervisor]:
        return [sup for s in self._slots.values() for sup in s.supervisors]

    def supervised_states(self) -> dict[str, str]:
        """Each loaded lane's state, by backend name."""
        out = {}
        for s in self._slots.values():
            for backend in s.backends:
                for sup in s.supervisors:
                    if backend.lane in sup.lanes:
                        out[backend.name] = sup.status.state.value
        return out

    def models(self) -> list[dict[str, Any]]:
        """``/admin/lanes`` ``models``: one entry per servable model (a contract with the
        status page and ``speclane status``: fields are added, never renamed)."""
        self.refresh()
        now = self.clock()
        return [
            {
                "name": s.model.name,
                "aliases": list(s.model.aliases),
                "state": s.state,
                "size_bytes": s.model.size_bytes,
                "estimate_bytes": s.estimate_bytes or None,
                "pinned": s.model.is_pinned,
                "ttl": self.ttl_of(s.model),
                "idle_seconds": round(now - s.last_used, 3)
                if s.state == "loaded" and s.in_flight == 0
                else None,
                "in_flight": s.in_flight,
                "layout": s.choice.layout if s.choice is not None else None,
                "lanes": [b.name for b in s.backends],
                "pids": [p.status.pid for p in s.supervisors if p.status.pid is not None],
                "last_error": s.last_error,
                "path": s.model.path,
                "draft": s.model.draft,
                "origin": s.model.origin,
                "load_seconds": s.last_load_seconds,
                "expires_in": _expires_in(s, self.ttl_of(s.model), now),
            }
            for s in self._slots.values()
        ]


def _expires_in(slot: Slot, ttl: float, now: float) -> float | None:
    """Seconds until an idle loaded model is unloaded (None: not counting down)."""
    if slot.state != "loaded" or slot.in_flight or slot.model.is_pinned:
        return None
    if slot.deadline is not None:
        return None if slot.deadline == float("inf") else max(0.0, slot.deadline - now)
    return max(0.0, slot.last_used + ttl - now) if ttl > 0 else None


def _retrieved(task: asyncio.Task[None]) -> None:
    """Every waiter may have timed out: the load's own error is then read here (it was
    logged and recorded in the slot), not reported as never retrieved."""
    if not task.cancelled():
        task.exception()


def _log(error: Exception) -> None:
    log.error("models: TTL check failed: %s", error)
