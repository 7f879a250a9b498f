"""speclane's own two MLX lanes as backends of the pool.

The supervisor owns the worker processes; this module resolves which model they serve,
registers one ``Backend`` per enabled lane, and mirrors every supervisor status change
(ready, port, the worker's reported load, speculation active) into that backend, so the
decision step sees lanes exactly like any other backend.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from router.appkeys import METRICS, POOL, SETTINGS, SUPERVISORS
from router.backends.base import SPECLANE_KIND, Backend
from router.backends.cooldown import Cooldown
from router.config import LANE_NAMES, LanesSettings, Settings
from router.decision import LaneName
from router.supervisor import (
    LaneStatus,
    LaneSupervisor,
    WorkerStartError,
    build_worker_command,
    start_all,
    stop_all,
)

log = logging.getLogger("speclane.lanes")


class LaneStartupError(Exception):
    """A lane could not be brought up; serve refuses to start and shows why."""


@dataclass(frozen=True)
class LaneModels:
    model: str  # a local mlx-lm directory, or a Hugging Face repo id (on a Mac)
    draft: str | None
    name: str  # the id clients send in "model"


def resolve_models(lanes: LanesSettings) -> LaneModels:
    """The configured model, or the embedded default prepared on first use."""
    if lanes.model is None:
        from router.modelprep import DEFAULT_MODEL_NAME, ensure_default_models

        model_dir, draft_dir = ensure_default_models()
        draft = lanes.draft_model or str(draft_dir)
        return LaneModels(str(model_dir), draft, lanes.model_name or DEFAULT_MODEL_NAME)
    local = Path(lanes.model).expanduser()
    name = lanes.model_name or (local.name if local.exists() else lanes.model)
    return LaneModels(str(local) if local.exists() else lanes.model, lanes.draft_model, name)


def enabled_lanes(lanes: LanesSettings) -> list[LaneName]:
    return [lane for lane in LANE_NAMES if getattr(lanes, lane).enabled]  # type: ignore[misc]


def lane_backend(lane: LaneName, settings: Settings, model_name: str) -> Backend:
    return Backend(
        name=lane,
        kind=SPECLANE_KIND,
        base_url="http://127.0.0.1:0/v1",  # replaced by the worker's port once it is ready
        cooldown=Cooldown(settings.cooldown.allowed_fails, settings.cooldown.seconds),
        lane=lane,
        configured_models=frozenset({model_name}),
        connect_timeout=5.0,
        read_timeout=settings.lanes.read_timeout,
        speculative_requested=lane == "speculative",
    )


def apply_status(backend: Backend, status: LaneStatus) -> None:
    backend.ready = status.ready
    if status.base_url:
        backend.base_url = status.base_url
    backend.reported = dict(status.health or {})
    backend.speculative_active = bool(backend.reported.get("speculative"))
    backend.last_error = status.last_error


async def lanes_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    app[SUPERVISORS] = []
    if not settings.lanes.enabled or not enabled_lanes(settings.lanes):
        yield
        return
    models = await asyncio.to_thread(resolve_models, settings.lanes)
    supervisors = []
    for lane in enabled_lanes(settings.lanes):
        backend = lane_backend(lane, settings, models.name)
        app[POOL].add(backend)
        draft = Path(models.draft) if lane == "speculative" and models.draft else None
        command = build_worker_command(lane, settings.lanes, Path(models.model), draft, models.name)
        supervisors.append(LaneSupervisor.from_settings(
            command, settings.lanes, metrics=app[METRICS],
            on_change=lambda status, b=backend: apply_status(b, status)))
    app[SUPERVISORS] = supervisors
    log.info("starting lanes %s on %s (draft: %s)", enabled_lanes(settings.lanes), models.model,
             models.draft)
    try:
        await start_all(supervisors)
    except WorkerStartError as e:
        raise LaneStartupError(str(e)) from e
    yield
    await stop_all(supervisors, grace=max(5.0, settings.shutdown_grace / 2))
