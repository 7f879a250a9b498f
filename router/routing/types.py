"""The values the routing decision works on: pure data, no I/O.

``router.routing.classify`` takes these in and gives a ``Decision`` out; the relay tries its
candidates in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from router.config.names import LaneName

Endpoint = Literal["chat", "completions", "embeddings"]


@dataclass(frozen=True, slots=True)
class BackendView:
    """A snapshot of one backend as the decision sees it."""

    name: str
    lane: LaneName | None  # None: an external backend
    models: frozenset[str]
    ready: bool
    cooled_down: bool
    inflight: int = 0  # requests speclane is relaying to it right now
    queued: int = 0  # requests the backend itself reports as waiting (lanes only)
    capacity: int | None = None  # concurrent requests it serves at full speed
    speculative: bool = False  # speculation is active on it
    # The lanes: ``[lanes] draft_source`` (auto, draft_model, prompt_lookup, suffix,
    # none) and whether its worker reports a loaded draft model; None for other backends.
    source_setting: str | None = None
    has_draft: bool = False
    # Lanes with the same non-None value share one prompt cache (one worker process).
    cache_domain: str | None = None


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What the decision needs to know about one request (parsed once by protocol)."""

    endpoint: Endpoint
    model: str
    stream: bool = False
    n: int = 1
    max_tokens: int | None = None
    temperature: float | None = None
    prompt_chars: int = 0
    family: str = "chat"  # router.speculation.families: part of the speculative-state key
    draft_source: str | None = None  # the client's own (valid) ``draft_source`` body field


@dataclass(frozen=True, slots=True)
class Candidate:
    backend: str
    lane: str  # shown in X-Speclane-Lane: the lane name, or the backend name if external
    speculative: bool = False  # for the speculative lane: decode with the draft model
    # The speculative lane: the source the request drafts with there (``prediction``,
    # ``draft_model``, ``prompt_lookup``, ``suffix``, ``none``;
    # ``routing.speculate.request_sources``); None for other backends (their own draft model).
    source: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    candidates: tuple[Candidate, ...]
    reason: str
    labels: dict[str, str] = field(default_factory=dict)  # extra facts for the debug log
