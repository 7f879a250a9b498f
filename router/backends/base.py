"""One backend's identity, settings and live state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from router.backends.cooldown import Cooldown
from router.config.names import LaneName
from router.config.settings import BackendSpec, CooldownSettings
from router.routing.types import BackendView

SPECLANE_KIND = "speclane"  # the parser/quirks kind of speclane's own lane workers


@dataclass(slots=True)
class Backend:
    name: str
    kind: str
    base_url: str  # OpenAI base, ends with /v1
    cooldown: Cooldown
    lane: LaneName | None = None
    api_key: str | None = None
    configured_models: frozenset[str] = frozenset()
    connect_timeout: float = 5.0
    read_timeout: float = 120.0
    speculative_requested: bool = False
    drain_on_abort: bool = False
    max_concurrency: int | None = None
    # live state, written by the health monitor / supervisor and the relay
    ready: bool = False
    discovered_models: frozenset[str] = frozenset()
    inflight: int = 0
    started: int = 0  # requests begun, ever: tells whether another began during one
    reported: dict[str, Any] = field(default_factory=dict)  # a lane worker's /health
    speculative_active: bool = False
    last_error: str | None = None
    # speculation status (capability gating and telemetry), shown at /admin/lanes
    draft: str | None = None
    spec_mode: str | None = None  # strict | graceful, for lanes
    spec_reason: str | None = None  # why speculation is not active / not observed
    spec_observed: bool | None = None  # draft counts seen recently (None: nothing to judge)

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
        )

    @property
    def root_url(self) -> str:
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    @property
    def models(self) -> frozenset[str]:
        return self.configured_models or self.discovered_models

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

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
        )
