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

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from router.backends.pool import BackendPool
from router.config.policies import Policy
from router.errors import RouterError
from router.proxy.request import ParsedRequest

if TYPE_CHECKING:  # the manager is handed in (router.app): lanes/ sits beside proxy/
    from router.lanes.models import ModelManager


def target(manager: ModelManager, requested: str, policy: Policy) -> tuple[str, str] | None:
    """(the servable model's name, the ``@preset`` suffix or "") that ``requested`` names
    for this policy, or None when it names none."""
    aliases = policy.models.aliases
    name = aliases.get(requested, requested)
    canonical = manager.resolve(name)
    if canonical is not None:
        return canonical, ""
    base, at, suffix = name.rpartition("@")
    if at and base:
        canonical = manager.resolve(aliases.get(base, base))
        if canonical is not None:
            return canonical, at + suffix
    return None


def served_elsewhere(pool: BackendPool, model: str) -> bool:
    return any(b.lane is None and model in b.models for b in pool)


@contextlib.asynccontextmanager
async def model_loaded(
    manager: ModelManager | None, pool: BackendPool, parsed: ParsedRequest, policy: Policy
) -> AsyncIterator[None]:
    """Around the whole request: load its model if needed (raises 403 or 503 in speclane's
    terms), and hold it until the answer has ended."""
    found = target(manager, parsed.route.model, policy) if manager is not None else None
    if manager is None or found is None:
        yield
        return
    name, suffix = found
    loaded = manager.state(name) == "loaded"
    if not policy.allows_model(name) or (not loaded and served_elsewhere(pool, name)):
        yield
        return
    if parsed.route.model != name + suffix:
        # an alias: the workers serve the model under its own name
        parsed.set_field("model", name + suffix)
        parsed.route = dataclasses.replace(parsed.route, model=name + suffix)
    with manager.hold(name, parsed.keep_alive):
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
            parsed.load_seconds = await manager.ensure(name)
        yield
