"""What the scorecard measures: scenarios x prompt families x concurrency levels (pure).

A scenario is a way of sending the same request to the router:

- ``spec-on``: ``X-Speclane-Lane: speculative``: the speculative lane with its draft model.
- ``spec-off``: the same lane with ``"num_draft_tokens": 0``: the same model, plain
  decoding; the baseline speculation must beat.
- ``batching``: ``X-Speclane-Lane: batching``: the continuous-batching lane.
- ``auto``: no lane header: the router decides (its choice is read from the response's
  ``X-Speclane-Lane`` and ``X-Speclane-Decision`` headers).

The three forced scenarios identify as the ``speclane-bench`` client (``X-Speclane-Client``);
a router the bench starts itself gives that client a policy that allows lane overrides and
turns the speculative auto-disable off, so speculation stays on when the header asks for it
while ``auto`` sees the router's ordinary behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from router.bench.prompts import FAMILIES, prompt_for

BENCH_CLIENT = "speclane-bench"
SCENARIO_NAMES = ("spec-on", "spec-off", "batching", "auto")
FAMILY_NAMES = tuple(FAMILIES)
# Above the router's short-output rule (16 tokens by default): shorter answers go to the
# batching lane whatever speculation would do, and decode speeds of so few tokens are noise.
MIN_MAX_TOKENS = 24


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    lane_header: str | None
    body_extra: dict[str, Any] = field(default_factory=dict)

    @property
    def forced(self) -> bool:
        return self.lane_header is not None

    @property
    def how(self) -> str:
        parts = [f"`X-Speclane-Lane: {self.lane_header}`" if self.lane_header else
                 "no lane header (the router decides)"]
        parts += [f"`\"{k}\": {v}`" for k, v in self.body_extra.items()]
        return " + ".join(parts)


SCENARIOS: dict[str, Scenario] = {
    "spec-on": Scenario("spec-on", "Speculative lane, speculation on", "speculative"),
    "spec-off": Scenario("spec-off", "Speculative lane, speculation off", "speculative",
                         {"num_draft_tokens": 0}),
    "batching": Scenario("batching", "Batching lane", "batching"),
    "auto": Scenario("auto", "Router's automatic routing", None),
}


@dataclass(frozen=True, order=True)
class Cell:
    scenario: str
    family: str
    concurrency: int

    @property
    def label(self) -> str:
        return f"{self.scenario} · {self.family} · c={self.concurrency}"


@dataclass(frozen=True)
class MatrixSpec:
    """The matrix asked for: every scenario x family x concurrency level, ``runs`` requests
    per concurrent client loop (a cell at concurrency c sends c x runs requests)."""

    scenarios: tuple[str, ...] = SCENARIO_NAMES
    families: tuple[str, ...] = FAMILY_NAMES
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    runs: int = 2
    max_tokens: int = 64
    long_prompt_chars: int = 3000

    def __post_init__(self) -> None:
        unknown = [s for s in self.scenarios if s not in SCENARIOS]
        unknown += [f for f in self.families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown scenario or family: {', '.join(unknown)}")
        if not self.scenarios or not self.families or not self.concurrency:
            raise ValueError("scenarios, families and concurrency must not be empty")
        if min(self.concurrency) < 1 or self.runs < 1 or self.max_tokens < 2:
            raise ValueError("concurrency and runs must be >= 1, max_tokens >= 2")
        object.__setattr__(self, "concurrency", tuple(sorted(set(self.concurrency))))

    def cells(self) -> tuple[Cell, ...]:
        # Scenarios innermost: the four ways of serving one (family, concurrency) run back to
        # back, so a burst of load from elsewhere on the machine hits them alike.
        return tuple(Cell(s, f, c) for c in self.concurrency for f in self.families
                     for s in self.scenarios)

    def with_(self, **changes: Any) -> MatrixSpec:
        return replace(self, **changes)


DEFAULT_SPEC = MatrixSpec()
QUICK_SPEC = MatrixSpec(families=("chat", "list"), concurrency=(1, 2), runs=1,
                        max_tokens=MIN_MAX_TOKENS, long_prompt_chars=1500)


def request_headers(scenario: Scenario, api_key: str | None = None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if scenario.forced:
        headers["X-Speclane-Lane"] = str(scenario.lane_header)
        headers["X-Speclane-Client"] = BENCH_CLIENT
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def request_body(model: str, scenario: Scenario, family: str, prompt_index: int,
                 max_tokens: int, long_prompt_chars: int) -> dict[str, Any]:
    """A streamed, greedy (temperature 0) chat request: comparable across scenarios."""
    return {
        "model": model,
        "messages": [{"role": "user",
                      "content": prompt_for(family, prompt_index, long_prompt_chars)}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **scenario.body_extra,
    }
