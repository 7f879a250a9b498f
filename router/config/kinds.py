"""What speclane knows of each kind of backend, in one table (pure data).

A backend's ``kind`` (``[[backends]] kind``) decides how it is watched and read: the path that
says it is alive, where its cumulative draft counters are scraped, which top-level fields of
its answers carry draft statistics (or that it never puts any on the wire), how system
messages after the first are sent to it, and how it counts a prompt's tokens. Each consumer
(``backends.health``, ``backends.scrape``, ``speculation.parsers``, ``speculation.observed``,
``config.settings``, ``frontdoors.externalcount``) reads its column here, as uvicorn keeps
its protocol choices in one table; the functions that parse stay with their packages, keyed by
the kind's name (a test checks every kind has them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from router.kernel.worker_contract import STREAM_USAGE_FIELD

SystemMessages = Literal["fold", "as_is"]
ScrapeFormat = Literal["prometheus", "vllm_mlx_status"]
TokenCount = Literal["vllm_tokenize", "llamacpp_template"]

SPECLANE = "speclane"  # speclane's own lanes: a kind of backend the user never configures


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    # The path under the server root that says it is up; None: its model list (GET /models).
    liveness_path: str | None = None
    # Where its cumulative draft counters are scraped (path under the server root, format).
    scrape: tuple[str, ScrapeFormat] | None = None
    # The top-level fields of an answer (or a stream's event) its parser reads: an event
    # with none of them carries no statistics, and is skipped without parsing.
    stat_fields: frozenset[str] = frozenset()
    # It never puts draft statistics on the wire, whatever it runs inside.
    silent: bool = False
    # System messages after the first: folded into notes in place (the chat templates these
    # servers render refuse a late system message) or forwarded as sent (a hosted API).
    system_messages: SystemMessages = "fold"
    # How it counts a prompt's tokens for the Anthropic and Responses doors' counters.
    token_count: TokenCount | None = None


_OPENAI_FIELDS = frozenset(
    {"usage", STREAM_USAGE_FIELD, "timings", "metrics", "stats", "generation_metadata"}
)

KINDS: Mapping[str, Kind] = MappingProxyType(
    {
        # Any OpenAI-compatible server: its parser reads the fields every kind below uses.
        "openai": Kind("openai", stat_fields=_OPENAI_FIELDS, system_messages="as_is"),
        "mlx_lm": Kind("mlx_lm", liveness_path="/health", silent=True),
        "lmstudio": Kind("lmstudio", stat_fields=frozenset({"stats", "usage"})),
        "llamacpp": Kind(
            "llamacpp",
            scrape=("/metrics", "prometheus"),
            stat_fields=frozenset({"timings"}),
            token_count="llamacpp_template",
        ),
        "ollama": Kind("ollama", silent=True),
        "vllm": Kind(
            "vllm",
            scrape=("/metrics", "prometheus"),
            stat_fields=frozenset({"metrics"}),
            token_count="vllm_tokenize",
        ),
        "vllm_mlx": Kind(
            "vllm_mlx",
            scrape=("/v1/status", "vllm_mlx_status"),
            stat_fields=frozenset({"generation_metadata"}),
        ),
        "sglang": Kind("sglang", stat_fields=frozenset({"meta_info", "usage"})),
        SPECLANE: Kind(SPECLANE, stat_fields=frozenset({"usage", STREAM_USAGE_FIELD})),
    }
)

# The kinds a user may configure (``[[backends]] kind``): every kind but speclane's own.
CONFIGURABLE = tuple(name for name in KINDS if name != SPECLANE)


def kind(name: str) -> Kind | None:
    return KINDS.get(name)
