"""Models on demand, at the edge: before a request is classified, load the servable model
it names (``router.lanes.models``) when it is not loaded and the client may load it, and
hold the model for the whole request (its stream included) so it is never unloaded under it.

The model is named as classification will name it: the policy's alias first, then a
catalog alias (rewritten to the model's own name, which the lane workers check), with an
``@<preset>`` suffix kept. A name the catalog does not know, a model the policy may not use
(classification answers that 403) and a model an external backend already serves are left
to classification as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from router.backends.pool import BackendPool
from router.config.policies import Policy
from router.kernel.errors import RouterError
from router.proxy.early import FIRST_TICK, TICK
from router.proxy.request import ParsedRequest
from router.routing.modelname import resolve_name

if TYPE_CHECKING:  # the manager is handed in (router.app): lanes/ sits beside proxy/
    from router.lanes.models import ModelManager


def target(manager: ModelManager, requested: str, policy: Policy) -> tuple[str, str] | None:
    """(the servable model's name, the ``@preset`` suffix or "") that ``requested`` names
    for this policy (``router.routing.modelname``), or None when it names none."""
    found = resolve_name(requested, policy.models.aliases, manager.resolve)
    if found is None:
        return None
    model, suffix = found
    return model, "" if suffix is None else "@" + suffix


def served_elsewhere(pool: BackendPool, model: str) -> bool:
    return any(b.lane is None and model in b.models for b in pool)


@dataclasses.dataclass(slots=True)
class Held:
    model: str  # the name to route: the model's own, with the request's @preset suffix
    load_seconds: float = 0.0  # this request's wait for the model to load


@contextlib.asynccontextmanager
async def holding(
    manager: ModelManager | None,
    pool: BackendPool,
    requested: str,
    policy: Policy,
    keep_alive: float | None = None,
    waiting: Waiting | None = None,
) -> AsyncIterator[Held | None]:
    """Around a whole request for ``requested``: load its model if needed (raises 403 or
    503 in speclane's terms) and hold it until the block ends; None when it is none of the
    servable models (or one the policy may not use, or an external backend serves)."""
    found = target(manager, requested, policy) if manager is not None else None
    if manager is None or found is None:
        yield None
        return
    name, suffix = found
    loaded = not manager.needs_load(name)
    if not policy.allows_model(name) or (not loaded and served_elsewhere(pool, name)):
        yield None
        return
    held = Held(name + suffix)
    with manager.hold(name, lifetime(policy, name, keep_alive)):
        if not loaded:
            if not policy.allows_load(name):
                raise RouterError(
                    403,
                    f"client '{policy.client}' may not load model '{name}' (it is not loaded; "
                    "the policy's models.load does not match it)",
                    type="permission_error",
                    param="model",
                    code="model_load_forbidden",
                )
            # a 503 (router.lanes.models.ModelUnavailable) when it cannot load in time
            load = manager.ensure(name, policy.client)
            held.load_seconds = await _wait(load, name, waiting)
        yield held


def lifetime(policy: Policy, name: str, keep_alive: float | None) -> float | None:
    """The ``keep_alive`` a request may set on ``name``: changing a model's lifetime (an
    unload with 0, a pin with < 0, any deadline) needs the right to load it, or another
    client's model could be unloaded or held forever by a client that may not load it (403);
    the policy's ``models.max_keep_alive`` bounds it (a longer one, or "forever", is lowered
    to the bound)."""
    if keep_alive is None:
        return None
    if not policy.allows_load(name):
        raise RouterError(
            403,
            f"client '{policy.client}' may not change how long model '{name}' stays loaded "
            "(keep_alive needs the right to load it: the policy's models.load does not match "
            "it); leave keep_alive out",
            type="permission_error",
            param="keep_alive",
            code="keep_alive_forbidden",
        )
    bound = policy.models.max_keep_alive
    if bound is not None and (keep_alive < 0 or keep_alive > bound):
        return bound
    return keep_alive


# Told, while a request waits for a model to load, the model and the seconds waited so far
# (router.proxy.early: a stream's keep-alive comments).
Waiting = Callable[[str, float], Awaitable[None]]


async def _wait(load: Awaitable[float], name: str, waiting: Waiting | None) -> float:
    if waiting is None:
        return await load
    began = time.monotonic()
    task = asyncio.ensure_future(load)
    try:
        pause = FIRST_TICK
        while not (await asyncio.wait({task}, timeout=pause))[0]:
            await waiting(name, time.monotonic() - began)
            pause = TICK
        return task.result()
    finally:
        task.cancel()  # the caller went away (or ``waiting`` failed): stop waiting


# One shared no-op: a request with nothing to load costs no generator.
NOTHING_TO_LOAD: contextlib.nullcontext[None] = contextlib.nullcontext()


def model_loaded(
    manager: ModelManager | None,
    pool: BackendPool,
    parsed: ParsedRequest,
    policy: Policy,
    waiting: Waiting | None = None,
) -> contextlib.AbstractAsyncContextManager[None]:
    """``holding`` for a parsed request: an alias is rewritten to the model's own name (the
    workers serve it under that name) and the load's wait recorded."""
    if manager is None or parsed.endpoint == "embeddings":  # the lanes do not embed
        return NOTHING_TO_LOAD
    return _model_loaded(manager, pool, parsed, policy, waiting)


@contextlib.asynccontextmanager
async def _model_loaded(
    manager: ModelManager,
    pool: BackendPool,
    parsed: ParsedRequest,
    policy: Policy,
    waiting: Waiting | None,
) -> AsyncIterator[None]:
    async with holding(
        manager, pool, parsed.route.model, policy, parsed.keep_alive, waiting
    ) as held:
        if held is not None:
            if parsed.route.model != held.model:
                parsed.set_field("model", held.model)
                parsed.route = dataclasses.replace(parsed.route, model=held.model)
            parsed.load_seconds = held.load_seconds
        yield
