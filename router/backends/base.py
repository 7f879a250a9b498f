"""One backend's identity, settings and live state.

Live state has one writer per field, through the methods below, so each field has one meaning:
the health monitor or the lane supervisor says whether it is ready (``last_error``: why not);
the relay counts requests and their failures (``last_failure``); capability gating says whether
speculation is active (``spec_reason``: why not); telemetry says whether drafts are seen
(``observed_reason``: why not).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from router.backends.cooldown import Cooldown
from router.config.kinds import SPECLANE
from router.config.names import LaneName
from router.config.settings import BackendSpec, CooldownSettings
from router.kernel.worker_contract import WORKER_SECRET_HEADER
from router.routing.types import BackendView

SPECLANE_KIND = SPECLANE  # the parser/quirks kind of speclane's own lane workers


@dataclass(slots=True)
class Backend:
    name: str
    kind: str
    base_url: str  # OpenAI base, ends with /v1
    cooldown: Cooldown
    lane: LaneName | None = None
    api_key: str | None = field(default=None, repr=False)
    # A lane: the secret its worker answers to (router.kernel.worker_contract), sent on every
    # request to it; never shown (the admin views list fields by name, none of them this).
    worker_secret: str | None = field(default=None, repr=False)
    configured_models: frozenset[str] = frozenset()
    connect_timeout: float = 5.0
    read_timeout: float = 120.0
    speculative_requested: bool = False
    drain_on_abort: bool = False
    max_concurrency: int | None = None
    # Late system messages folded before forwarding (``system_messages = "fold"``).
    fold_system: bool = False
    # For one request: an async "is it still working?" asked when its silence deadline
    # passes (lanes: the worker's progress counter), so a long prefill is not a 504.
    still_working: Callable[[Backend], Callable[[], Awaitable[bool]]] | None = None
    # Lanes served by one worker process share its prompt cache: the same non-None value
    # (the shared layout), so routing does not hold a conversation to one of them.
    cache_domain: str | None = None
    # live state, written by the health monitor / supervisor and the relay
    ready: bool = False
    discovered_models: frozenset[str] = frozenset()
    inflight: int = 0
    started: int = 0  # requests begun, ever: tells whether another began during one
    # inflight integrated over time (request-seconds) up to ``rows_since`` (monotonic): a
    # request's average company while it ran, for the lanes' measured pace
    rows_area: float = 0.0
    rows_since: float = 0.0
    reported: dict[str, Any] = field(default_factory=dict)  # a lane worker's /health
    speculative_active: bool = False
    # The speculative lane: ``[lanes] draft_source`` as configured, and whether its worker
    # reports a loaded draft model (the gate may have refused the pair): together they say
    # which source the router asks the lane for, per request family.
    source_setting: str | None = None
    has_draft: bool = False
    last_error: str | None = None  # why it is not ready (health probe or lane supervisor)
    last_failure: str | None = None  # the reason of the last failed request (the relay)
    # speculation status (capability gating and telemetry), shown at /admin/lanes
    draft: str | None = None
    spec_mode: str | None = None  # strict | graceful, for lanes
    spec_reason: str | None = None  # why speculation is not active (capability gating)
    spec_observed: bool | None = None  # draft counts seen recently (None: nothing to judge)
    observed_reason: str | None = None  # why drafts are not observed (telemetry)

    @classmethod
    def from_spec(cls, spec: BackendSpec, cooldown: CooldownSettings) -> Backend:
        return cls(
            name=spec.name,
            kind=spec.kind,
            base_url=spec.base_url,
            cooldown=Cooldown(cooldown.allowed_fails, cooldown.seconds),
            api_key=spec.api_key.get_secret_value() if spec.api_key else None,
            configured_models=frozenset(spec.models),
            connect_timeout=spec.connect_timeout,
            read_timeout=spec.read_timeout,
            speculative_requested=spec.speculative,
            drain_on_abort=spec.drain_on_abort,
            max_concurrency=spec.max_concurrency,
            fold_system=spec.system_messages == "fold",
        )

    @property
    def root_url(self) -> str:
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    @property
    def models(self) -> frozenset[str]:
        return self.configured_models or self.discovered_models

    @property
    def context_length(self) -> int | None:
        """The context a lane's worker reports (its model's), None when unknown (an
        external backend, a worker not answering)."""
        value = self.reported.get("context_length")
        return value if type(value) is int and value > 0 else None

    @property
    def architecture(self) -> str | None:
        """The model's architecture (its config's model_type) a lane's worker reports."""
        value = self.reported.get("architecture")
        return value if isinstance(value, str) and value else None

    def auth_headers(self) -> dict[str, str]:
        headers = {WORKER_SECRET_HEADER: self.worker_secret} if self.worker_secret else {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    # --- writers -------------------------------------------------------------------------

    def probe_succeeded(self, models: frozenset[str]) -> None:
        """The health monitor reached it (external backends)."""
        self.ready, self.discovered_models, self.last_error = True, models, None

    def probe_failed(self, error: str) -> None:
        self.ready, self.last_error = False, error

    def lane_status(
        self, ready: bool, base_url: str | None, health: dict[str, Any] | None, error: str | None
    ) -> None:
        """The lane supervisor's view of its worker (lanes). Without a health answer the
        last known speculation state is kept while the worker restarts."""
        self.ready, self.last_error = ready, error
        if base_url:
            self.base_url = base_url
        self.reported = dict(health or {})
        if health is not None:
            self.speculative_active = bool(self.reported.get("speculative"))
            self.has_draft = bool(self.reported.get("draft_model"))

    def gated(self, draft: str | None, mode: str | None, reason: str | None) -> None:
        """Capability gating's verdict on the draft/target pair (the speculative lane)."""
        self.draft, self.spec_mode, self.spec_reason = draft, mode, reason

    def observed(self, observed: bool | None, reason: str | None) -> bool:
        """Telemetry's verdict on whether drafts are seen; True when it changed."""
        if observed is self.spec_observed and reason == self.observed_reason:
            return False
        self.spec_observed = observed
        self.observed_reason = reason if observed is False else None
        return True

    def request_started(self) -> tuple[bool, int]:
        """(nothing else was running, the start's epoch) for one request sent to it."""
        solo = self.inflight == 0
        self._account(time.monotonic())
        self.started += 1
        self.inflight += 1
        return solo, self.started

    def request_ended(self, epoch: int) -> bool:
        """True when no other request began while this one ran."""
        self._account(time.monotonic())
        self.inflight -= 1
        return self.started == epoch

    def rows_mark(self, now: float) -> float:
        """The request-seconds served up to ``now``: the difference of two marks over the
        time between them is the average number of requests in flight."""
        return self.rows_area + self.inflight * (now - self.rows_since)

    def _account(self, now: float) -> None:
        self.rows_area, self.rows_since = self.rows_mark(now), now

    def request_failed(self, reason: str, now: float) -> bool:
        """Counts towards the cooldown; True when this failure starts one."""
        self.last_failure = reason
        return self.cooldown.failure(now)

    def request_succeeded(self) -> None:
        self.cooldown.success()

    def view(self, now: float | None = None) -> BackendView:
        now = time.monotonic() if now is None else now
        return BackendView(
            name=self.name,
            lane=self.lane,
            models=self.models,
            ready=self.ready,
            cooled_down=self.cooldown.active(now),
            inflight=self.inflight,
            queued=int(self.reported.get("queued", 0) or 0),
            capacity=self.reported.get("capacity") or self.max_concurrency,
            speculative=self.speculative_active,
            source_setting=self.source_setting,
            has_draft=self.has_draft,
            cache_domain=self.cache_domain,
        )
