"""What the admin API and the status page show of one backend (its state, load and
speculation), read from the live ``Backend``."""

from __future__ import annotations

from typing import Any

from router.backends.base import Backend
from router.speculation.observed import speculation_status


def backend_state(backend: Backend, supervised: dict[str, str]) -> str:
    if backend.lane is not None:
        return supervised.get(backend.name, "not_ready")
    return "ready" if backend.ready else "not_ready"


# What a lane worker's /health says of itself, shown here: the worker answers only the
# router (its secret), so a tool that wants these reads them from the router.
WORKER_FACTS = (
    "mode",
    "model",
    "draft_model",
    "num_draft_tokens",
    "capacity",
    "pid",
    # what the lane's per-step draft choice measures (router.worker.drafting.draftchoice)
    "draft_source",
    "draft_position_cost",
    "draft_pass_jump",
    "draft_model_cost",
    "evidence_partitions",
)


def backend_status(backend: Backend, supervised: dict[str, str]) -> dict[str, Any]:
    models = sorted(backend.models)
    worker = (
        {k: backend.reported.get(k) for k in WORKER_FACTS}
        if backend.lane is not None and backend.reported
        else None
    )
    return {
        "name": backend.name,
        "kind": backend.kind,
        "lane": backend.lane,
        "url": backend.base_url,
        "model": models[0] if backend.lane is not None and models else None,
        "models": models,
        "draft": backend.draft,
        "state": backend_state(backend, supervised),
        "inflight": backend.inflight,
        "cooled_down": backend.view().cooled_down,
        "last_error": backend.last_error,
        "last_failure": backend.last_failure,
        "worker": worker,
        "speculation": speculation_of(backend),
    }


def speculation_of(backend: Backend) -> dict[str, Any]:
    """What /admin/lanes and /admin/spec say of a backend's speculation."""
    return speculation_status(
        kind=backend.kind,
        lane=backend.lane,
        requested=backend.speculative_requested,
        active=backend.speculative_active,
        observed=backend.spec_observed,
        reason=backend.spec_reason or backend.observed_reason,
        mode=backend.spec_mode,
    )
