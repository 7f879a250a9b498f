"""The ``X-Speclane-*`` headers of an answer, built in one place from names defined once
(``router.config.names``): what the decision knows before relaying, then what the relay
learns when an upstream answer opens. Error answers carry what was known when they failed."""

from __future__ import annotations

from router.config.names import (
    ATTEMPTS_HEADER,
    BACKEND_HEADER,
    CLIENT_HEADER,
    DECISION_HEADER,
    LANE_HEADER,
    LOAD_HEADER,
    OVERHEAD_HEADER,
    QUEUE_HEADER,
)
from router.routing.classify import Classification


def decision_headers(
    result: Classification, overhead: float, waited: float, loaded: float = 0.0
) -> dict[str, str]:
    """Known once the request is classified; the lane and backend are the first choice.
    ``loaded``: seconds the request waited for its model to load (the header only then)."""
    first = result.decision.candidates[0]
    headers = {
        LANE_HEADER: first.lane,
        BACKEND_HEADER: first.backend,
        CLIENT_HEADER: result.client,
        DECISION_HEADER: result.decision.reason,
        OVERHEAD_HEADER: f"{overhead * 1000:.3f}",
        QUEUE_HEADER: f"{waited * 1000:.3f}",
    }
    if loaded:
        headers[LOAD_HEADER] = f"{loaded * 1000:.3f}"
    return headers


def served_headers(
    headers: dict[str, str], backend: str, lane: str, attempts: int
) -> dict[str, str]:
    """``headers`` with the backend and lane that answered (a retry may have moved it)."""
    return {**headers, BACKEND_HEADER: backend, LANE_HEADER: lane, ATTEMPTS_HEADER: str(attempts)}
