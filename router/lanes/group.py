"""speclane's own two MLX lanes as backends of the pool.

The supervisor owns the worker processes; this module resolves which model they serve,
chooses their layout (``router.lanes.layout``: one process per lane, or one shared by both)
and refuses to start when they would not fit in memory, registers one ``Backend`` per enabled
lane, and mirrors every supervisor status change (ready, port, the worker's reported load,
speculation active) into that backend, so the decision step sees lanes exactly like any other
backend, in either layout. In the shared layout both backends follow the one process, each
under its own path prefix (``contract.lane_prefix``) and share one ``cache_domain``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from router.backends.base import SPECLANE_KIND, Backend
from router.backends.cooldown import Cooldown
from router.backends.pool import BackendPool
from router.config.group import GroupSpec
from router.config.names import LANE_NAMES, LaneName
from router.config.settings import LanesSettings, Settings
from router.kernel.errors import LoadError
from router.kernel.grouplaunch import check_split
from router.kernel.worker_contract import SHARED_MODE, lane_prefix
from router.lanes.blas import core_share_file
from router.lanes.gating.decide import GateDecision, check_pair, decide
from router.lanes.layout import LayoutChoice, Sizes, choose, refusal
from router.lanes.memory import machine_memory, weights_bytes
from router.lanes.modelprep import DEFAULT_MODEL_NAME, PrepareError, ensure_default_models
from router.lanes.progress import for_lane
from router.lanes.rankgroup import LauncherMissing, local_ranks
from router.lanes.status import lane_health
from router.lanes.supervisor import (
    LaneStatus,
    LaneSupervisor,
    WorkerCommand,
    WorkerStartError,
    build_worker_command,
    start_all,
    start_first,
    stop_all,
)
from router.metrics import Metrics

log = logging.getLogger("speclane.lanes")

# The gate's finding the shipped default pair gives on a CPU, said at info, not as a warning:
# the newcomer did not choose it, and drafting that does not pay is measured and stopped.
SHIPPED_PAIR_EXPECTS = "draft_not_smaller"


class LaneStartupError(Exception):
    """A lane could not be brought up; serve refuses to start and shows why."""


@dataclass(frozen=True)
class LaneModels:
    model: str  # a local mlx-lm directory, or a Hugging Face repo id (on a Mac)
    draft: str | None
    name: str  # the id clients send in "model"
    group: GroupSpec | None = None  # its lane spans a group of ranks (router.lanes.rankgroup)
    # The embedded default target and draft (``speclane models prepare``), as shipped.
    shipped: bool = False


def resolve_models(lanes: LanesSettings) -> LaneModels:
    """The configured model, or the embedded default prepared on first use."""
    if lanes.model is None:
        model_dir, draft_dir = ensure_default_models()
        draft = lanes.draft_model or str(draft_dir)
        name = lanes.model_name or DEFAULT_MODEL_NAME
        return LaneModels(
            str(model_dir), draft, name, lanes.group, shipped=lanes.draft_model is None
        )
    local = Path(lanes.model).expanduser()
    name = lanes.model_name or (local.name if local.exists() else lanes.model)
    path = str(local) if local.exists() else lanes.model
    return LaneModels(path, lanes.draft_model, name, lanes.group)


def enabled_lanes(lanes: LanesSettings) -> list[LaneName]:
    """The lanes to start (over a group of ranks too: its one process serves both)."""
    return [lane for lane in LANE_NAMES if getattr(lanes, lane).enabled]


def group_shares(models: LaneModels, lanes: list[LaneName]) -> bool:
    """A group of ranks serving the batching lane runs the shared worker (``--mode shared``):
    rank 0 serves both lanes on the group's one copy of the model."""
    return models.group is not None and "batching" in lanes


def lane_backend(
    lane: LaneName,
    settings: Settings,
    model_name: str,
    cache_domain: str | None = None,
    *,
    name: str | None = None,
) -> Backend:
    return Backend(
        name=name or lane,
        kind=SPECLANE_KIND,
        base_url="http://127.0.0.1:0/v1",  # replaced by the worker's port once it is ready
        cooldown=Cooldown(settings.cooldown.allowed_fails, settings.cooldown.seconds),
        lane=lane,
        configured_models=frozenset({model_name}),
        connect_timeout=5.0,
        read_timeout=settings.lanes.read_timeout,
        speculative_requested=lane == "speculative",
        source_setting=settings.lanes.draft_source,
        still_working=lambda b: for_lane(b.base_url, b.reported, b.auth_headers()),
        cache_domain=cache_domain,
    )


def apply_status(
    backend: Backend, status: LaneStatus, metrics: Metrics | None = None, shared: bool = False
) -> None:
    """Mirror the supervisor's view into the lane's backend; ``shared``: the process serves
    both lanes, each under its prefix, and reports each in its own /health block."""
    base_url, health = status.base_url, status.health
    if shared and backend.lane is not None:
        health = lane_health(health, backend.lane)
        if base_url is not None:
            base_url = base_url.removesuffix("/v1") + lane_prefix(backend.lane) + "/v1"
    backend.lane_status(status.ready, base_url, health, status.last_error)
    if health is not None:
        if metrics is not None and backend.speculative_requested:
            metrics.spec_active.labels(backend.name).set(1 if backend.speculative_active else 0)


async def gate_speculation(settings: Settings, models: LaneModels) -> GateDecision:
    """Check the draft/target pair before the speculative lane starts (issue: speculation
    configured but silently stripped, or crashing the lane at load)."""
    # On the event loop thread, not to_thread: MLX arrays built in a short-lived thread
    # made the process abort at exit. Nothing is served yet, so blocking is harmless.
    report = check_pair(models.model, models.draft)
    presets = [n for n, p in settings.presets.items() if p.lane == "speculative"]
    gate = decide(
        report, settings.gating, models.model, models.draft, lane="speculative", presets=presets
    )
    if gate.fatal:
        raise LaneStartupError(gate.message)
    if not gate.active:
        fallback = (
            "; requests draft by prompt lookup instead (draft_source auto)"
            if settings.lanes.draft_source == "auto"
            else ""
        )
        log.warning(
            "speculative lane starts WITHOUT speculation by a draft model (requested=true, "
            "active=false, mode=%s): %s%s",
            gate.mode,
            gate.reason,
            fallback,
        )
    for warning in gate.warnings:
        if models.shipped and warning.startswith(SHIPPED_PAIR_EXPECTS):
            # Known of the shipped pair on a CPU (its draft is stored as large as the target,
            # router.lanes.modelprep): the lanes measure whether drafting pays, and stop.
            log.info("speculative lane, the shipped default pair (as expected here): %s", warning)
            continue
        log.warning("speculative lane: %s", warning)
    return gate


@dataclass(frozen=True)
class StartedLanes:
    supervisors: list[LaneSupervisor]
    layout: LayoutChoice | None  # None: no lanes
    backends: list[Backend] = field(default_factory=list)
    models: LaneModels | None = None


def layout_choice(
    lanes: LanesSettings, models: LaneModels, layout: str | None = None
) -> LayoutChoice:
    """The layout (``layout``: the model's own, else ``lanes.layout``) and the numbers behind
    it, guard not applied."""
    weights = weights_bytes(models.model)
    if models.group is not None:  # this machine holds its ranks' shares of the weights
        weights = weights * local_ranks(models.group) // models.group.ranks
    sizes = Sizes(weights, weights_bytes(models.draft), lanes.prompt_cache_bytes)
    enabled = enabled_lanes(lanes)
    choice = choose(
        "shared" if group_shares(models, enabled) else layout or lanes.layout,
        sizes,
        machine_memory(lanes.machine_memory_bytes),
        frozenset(enabled),
        lanes.memory_limit_bytes,
    )
    if group_shares(models, enabled) and choice.layout == "shared":
        return replace(choice, reason="a group of ranks holds one copy for both lanes")
    return choice


def plan_layout(
    lanes: LanesSettings, models: LaneModels, layout: str | None = None
) -> LayoutChoice:
    """The layout and the numbers behind it; raises LaneStartupError when the lanes would
    not fit (the guard: nothing has been started yet)."""
    choice = layout_choice(lanes, models, layout)
    log.info("%s", choice.summary())
    refused = refusal(choice, lanes.memory_limit_bytes is not None)
    if refused is not None:
        raise LaneStartupError(refused)
    return choice


async def start_lanes(settings: Settings, pool: BackendPool, metrics: Metrics) -> StartedLanes:
    """Resolve the start-up model, choose the layout (or refuse: too big), gate the draft,
    register one backend per enabled lane in ``pool`` and start the workers; raises
    LaneStartupError (serve refuses to start and says why)."""
    if not settings.lanes.enabled or not enabled_lanes(settings.lanes):
        return StartedLanes([], None)
    try:
        models = resolve_models(settings.lanes)  # may convert with MLX: main thread (above)
    except PrepareError as e:
        raise LaneStartupError(f"the default model could not be prepared: {e}") from e
    return await start_model(settings, pool, metrics, models, default=True)


def backend_name(lane: LaneName, model: str, default: bool) -> str:
    """The start-up model's lanes keep the bare lane names (everything that names a lane
    stays as it was); a model loaded on demand has ``<lane>@<model>``."""
    return lane if default else f"{lane}@{model}"


async def start_model(
    settings: Settings,
    pool: BackendPool,
    metrics: Metrics,
    models: LaneModels,
    *,
    default: bool,
    choice: LayoutChoice | None = None,
    first_ready: bool = False,
) -> StartedLanes:
    """Start one model's lanes: the layout (``choice``, else planned here; may refuse), the
    draft gate, one backend per enabled lane in ``pool`` (``backend_name``) and the workers.
    ``first_ready``: return once one lane is ready (the others go on starting). On failure
    its backends leave the pool again and LaneStartupError says why."""
    if choice is None:
        choice = plan_layout(settings.lanes, models)
    metrics.lanes_layout.labels(choice.layout).set(1)
    backends: list[Backend] = []
    try:
        supervisors = await _start_workers(
            settings, pool, metrics, models, default, choice, backends, first_ready
        )
    except BaseException:
        for backend in backends:
            pool.remove(backend.name)
        raise
    ready = [b.name for b in backends if b.ready]
    log.info("model %s: lanes %s ready (of %s)", models.name, ready, [b.name for b in backends])
    return StartedLanes(supervisors, choice, backends, models)


async def _start_workers(
    settings: Settings,
    pool: BackendPool,
    metrics: Metrics,
    models: LaneModels,
    default: bool,
    choice: LayoutChoice,
    backends: list[Backend],
    first_ready: bool = False,
) -> list[LaneSupervisor]:
    shared = choice.layout == "shared" or group_shares(models, enabled_lanes(settings.lanes))
    draft = None
    if models.group is not None:
        check_group_split(models)
    for lane in enabled_lanes(settings.lanes):
        name = backend_name(lane, models.name, default)
        backend = lane_backend(
            lane, settings, models.name, SHARED_MODE if shared else None, name=name
        )
        if lane == "speculative":
            gate = await gate_speculation(settings, models)
            backend.gated(models.draft, gate.mode, gate.reason)
            draft = Path(models.draft) if gate.active and models.draft else None
            metrics.spec_requested.labels(name).set(1)
            metrics.spec_active.labels(name).set(0)
        pool.add(backend)
        backends.append(backend)
    model_dir = Path(models.model)

    def follow(lane_backends: list[Backend]) -> Callable[[LaneStatus], None]:
        def on_change(status: LaneStatus) -> None:
            for backend in lane_backends:
                apply_status(backend, status, metrics, shared=shared)

        return on_change

    computing = 1 if shared else len(enabled_lanes(settings.lanes))
    # The separate layout's lane processes share the cores as they work
    # (router.worker.engines.cores).
    cores = core_share_file(len(LANE_NAMES)) if computing > 1 else None

    def command(lane: str, lane_draft: Path | None, lane_backends: list[Backend]) -> WorkerCommand:
        slot = (cores, LANE_NAMES.index(lane)) if cores is not None and lane in LANE_NAMES else None
        try:
            made = build_worker_command(
                lane,
                settings.lanes,
                model_dir,
                lane_draft,
                models.name,
                max_body_bytes=settings.max_body_bytes,
                group=models.group,
                computing=computing,
                core_share=slot,
            )
        except LauncherMissing as e:
            raise LaneStartupError(f"lanes.group: {e}") from e
        for backend in lane_backends:  # what the router sends reaches the worker
            backend.worker_secret = made.secret
        return made

    suffix = "" if default else f"@{models.name}"  # as backend_name: its own metric series
    if shared:
        supervisors = [
            LaneSupervisor.from_settings(
                command(SHARED_MODE, draft, backends),
                settings.lanes,
                metrics=metrics,
                on_change=follow(backends),
                on_health=follow(backends),
                label_suffix=suffix,
            )
        ]
    else:
        supervisors = [
            LaneSupervisor.from_settings(
                command(b.lane or "", draft if b.lane == "speculative" else None, [b]),
                settings.lanes,
                metrics=metrics,
                on_change=follow([b]),
                on_health=follow([b]),
                label_suffix=suffix,
            )
            for b in backends
        ]
    log.info(
        "starting lanes %s (%s) on %s (draft: %s)",
        enabled_lanes(settings.lanes),
        choice.layout,
        models.model,
        models.draft,
    )
    try:
        await (start_first if first_ready else start_all)(supervisors)
    except WorkerStartError as e:
        raise LaneStartupError(str(e)) from e
    return supervisors


def check_group_split(models: LaneModels) -> None:
    """Refuse before launching anything a tensor split the model's heads do not allow (the
    ranks would each say so, among the launcher's lines)."""
    group = models.group
    local = Path(models.model)
    if group is None or not (local / "config.json").is_file():
        return  # a hub id: each rank downloads it and checks
    try:
        check_split(local, group.ranks, group.parallel)
    except LoadError as e:
        raise LaneStartupError(f"lanes.group: {e}") from e


async def stop_lanes(supervisors: list[LaneSupervisor], settings: Settings) -> None:
    await stop_all(supervisors, grace=max(5.0, settings.shutdown_grace / 2))
