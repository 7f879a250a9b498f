"""How the lanes' worker processes are laid out, and whether they fit in memory (pure).

- ``separate``: one worker process per lane. Each loads the target itself (MLX cannot share
  weights between processes), the speculative one also the draft, and each keeps its own
  prompt cache: a crash of one lane leaves the other serving.
- ``shared``: one process loads the target and the draft once and serves both lanes, with one
  prompt cache (``router.worker.engines.shared``).
- ``auto``: ``separate`` while its estimate takes under ``AUTO_SHARE`` of the machine's
  memory, ``shared`` otherwise.

The estimate is what the lanes will hold: the weights files' sizes on disk (a model's
resident weights are about its files), the prompt-cache budget (``lanes.prompt_cache_bytes``,
one per process) and ``PROCESS_BYTES`` per process (Python, MLX, the tokenizer). The guard
refuses to start when the chosen layout's estimate exceeds the limit
(``lanes.memory_limit_bytes``; by default the available memory less ``RESERVE_BYTES``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Layout = Literal["shared", "separate"]
LAYOUTS = ("auto", "shared", "separate")
AUTO_SHARE = 0.25  # auto: separate while its estimate is under this share of the memory
RESERVE_BYTES = 2 << 30  # the default limit leaves this much of the available memory free
PROCESS_BYTES = 400 << 20  # one worker process without its weights and cache (measured)
GIB = 1 << 30


@dataclass(frozen=True)
class Sizes:
    """What one copy of each part holds, in bytes (0: not known, e.g. a hub repo id)."""

    weights: int  # the target's weights files
    draft: int  # the draft's weights files (0: no draft model)
    cache: int  # the prompt-cache budget of one process


@dataclass(frozen=True)
class Memory:
    total: int  # the machine's memory
    available: int  # what can be used now without swapping


def estimate(sizes: Sizes, layout: Layout, lanes: frozenset[str]) -> int:
    """Bytes the enabled ``lanes`` will hold in ``layout``."""
    draft = sizes.draft if "speculative" in lanes else 0
    processes = 1 if layout == "shared" or len(lanes) < 2 else len(lanes)
    return processes * (sizes.weights + sizes.cache + PROCESS_BYTES) + draft


@dataclass(frozen=True)
class LayoutChoice:
    requested: str  # auto | shared | separate
    layout: Layout
    reason: str
    estimate_bytes: int  # of the chosen layout
    separate_bytes: int
    shared_bytes: int
    total_bytes: int
    available_bytes: int
    limit_bytes: int  # the guard's bound
    weights_bytes: int
    draft_bytes: int
    cache_bytes: int

    @property
    def fits(self) -> bool:
        return self.estimate_bytes <= self.limit_bytes

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "fits": self.fits}

    def summary(self) -> str:
        """The start-up log line."""
        return (
            f"lanes layout {self.layout} (requested {self.requested}: {self.reason}); "
            f"estimate {gib(self.estimate_bytes)} (separate {gib(self.separate_bytes)}, "
            f"shared {gib(self.shared_bytes)}; weights {gib(self.weights_bytes)}, draft "
            f"{gib(self.draft_bytes)}, prompt cache {gib(self.cache_bytes)} per process); "
            f"memory {gib(self.total_bytes)}, available {gib(self.available_bytes)}, limit "
            f"{gib(self.limit_bytes)}"
        )


def default_limit(memory: Memory) -> int:
    return max(0, memory.available - RESERVE_BYTES)


def choose(
    requested: str, sizes: Sizes, memory: Memory, lanes: frozenset[str], limit: int | None = None
) -> LayoutChoice:
    """The layout for ``requested`` and the numbers behind it (``limit``: the configured
    ``lanes.memory_limit_bytes``, None for the default)."""
    if requested not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}")
    separate = estimate(sizes, "separate", lanes)
    shared = estimate(sizes, "shared", lanes)
    bound = int(AUTO_SHARE * memory.total)
    layout: Layout
    if len(lanes) < 2:
        layout, reason = "separate", "one lane enabled: one process either way"
    elif requested != "auto":
        layout, reason = requested, "configured"  # type: ignore[assignment]
    elif separate < bound:
        layout = "separate"
        reason = f"two copies take {gib(separate)}, under {AUTO_SHARE:.0%} of {gib(memory.total)}"
    else:
        layout = "shared"
        reason = (
            f"two copies would take {gib(separate)}, over {AUTO_SHARE:.0%} of {gib(memory.total)}"
        )
    return LayoutChoice(
        requested=requested,
        layout=layout,
        reason=reason,
        estimate_bytes=shared if layout == "shared" else separate,
        separate_bytes=separate,
        shared_bytes=shared,
        total_bytes=memory.total,
        available_bytes=memory.available,
        limit_bytes=default_limit(memory) if limit is None else limit,
        weights_bytes=sizes.weights,
        draft_bytes=sizes.draft,
        cache_bytes=sizes.cache,
    )


def refusal(choice: LayoutChoice, limit_configured: bool) -> str | None:
    """The one line the guard refuses with, or None when the lanes fit."""
    if choice.fits:
        return None
    where = (
        "lanes.memory_limit_bytes"
        if limit_configured
        else f"available {gib(choice.available_bytes)} less a {gib(RESERVE_BYTES)} reserve"
    )
    changes = ['[lanes] layout = "shared"'] if choice.layout == "separate" else []
    changes += [
        "a smaller lanes.prompt_cache_bytes",
        "a smaller draft_model",
        "a smaller model",
        "a higher lanes.memory_limit_bytes",
    ]
    return (
        f"the lanes need about {gib(choice.estimate_bytes)} (layout {choice.layout}: "
        f"weights {gib(choice.weights_bytes)}, draft {gib(choice.draft_bytes)}, prompt "
        f"cache {gib(choice.cache_bytes)} per process) but {gib(choice.limit_bytes)} may be "
        f"used ({where}); change: " + ", or ".join(changes)
    )


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"
