"""What a policy file may say: the fields of one client's policy, validated once.

``priority``: higher is more important (llm-d's direction); 0 is normal and negative is
sheddable. It is the claim on the one-request-at-a-time speculative lane: above 0 the
request takes that lane whenever the lane itself is free, even while the load gate says the
machine is busy; below 0 it takes it only while both lanes are idle.

``caps`` are limits on request parameters. ``action = "clamp"`` (the default) lowers the
value and says so in ``X-Speclane-Decision`` (``clamped=max_tokens``); ``"reject"`` answers
400. A ``max_tokens`` cap also applies when the request sets no ``max_tokens`` (the lanes
would otherwise generate until EOS or the end of the context), and the decision header then
says ``max_tokens_cap=<n>``: the guard against a small model looping on an agent's request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any, Literal

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from router.config.base import Frozen
from router.config.names import PROMPT_RULES, PromptRule
from router.config.presets import LanePreference, PresetSpec
from router.config.speculation import SpecOverrides

DEFAULT_CLIENT = "default"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # also a metrics label value

Via = Literal["api_key", "client_header", "user_agent", "default"]


def _one_or_many(value: Any) -> Any:
    return (value,) if isinstance(value, str | SecretStr) else value


class MatchRules(Frozen):
    """How to recognise the client; any one rule is enough."""

    api_keys: tuple[SecretStr, ...] = ()
    api_key_env: tuple[str, ...] = ()
    client_header: tuple[str, ...] = ()
    user_agent: tuple[str, ...] = ()  # regular expressions, re.search

    _listify = field_validator(
        "api_keys", "api_key_env", "client_header", "user_agent", mode="before"
    )(_one_or_many)

    @field_validator("api_keys")
    @classmethod
    def _keys_not_empty(cls, v: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for i, key in enumerate(v):
            if not key.get_secret_value().strip():
                raise ValueError(f"item {i}: empty API key")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _env_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"'{name}' is not an environment variable name")
        return v

    @field_validator("client_header")
    @classmethod
    def _header_values(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(not value.strip() for value in v):
            raise ValueError("empty client header value")
        return tuple(value.strip() for value in v)

    @field_validator("user_agent")
    @classmethod
    def _regexes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for i, pattern in enumerate(v):
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"item {i}: invalid regular expression {pattern!r}: {e}") from e
        return v


class ModelRules(Frozen):
    allow: tuple[str, ...] = ()  # shell-style patterns (fnmatch); empty: every served model
    aliases: dict[str, str] = Field(default_factory=dict)  # name the client sends -> real model
    # Which models the client may LOAD on demand (router.lanes.models), so one client cannot
    # evict another's models at will: patterns; unset: every model it may use; []: none
    # (it uses only the models already loaded). Changing a model's lifetime (Ollama's
    # keep_alive, an unload) needs the same right.
    load: tuple[str, ...] | None = None
    # The longest a request's keep_alive may keep a model loaded once idle, in seconds; a
    # longer one (or "forever", < 0) is lowered to it. None: no bound.
    max_keep_alive: float | None = Field(default=None, ge=0)

    _listify = field_validator("allow", "load", mode="before")(_one_or_many)


class Caps(Frozen):
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1)
    action: Literal["clamp", "reject"] = "clamp"


class Policy(Frozen):
    """One client's policy (one TOML file). ``client`` defaults to the file's stem."""

    client: str = Field(pattern=NAME_PATTERN)
    priority: int = Field(default=0, ge=-1000, le=1000)  # higher is more important; < 0 sheddable
    require_api_key: bool = False
    allow_lane_override: bool = True
    default_preset: str | None = None  # used when the request names none
    presets: tuple[str, ...] = ()  # the presets the client may use; empty: all configured
    lanes: dict[str, LanePreference] = Field(default_factory=dict)  # preset -> lane
    models: ModelRules = ModelRules()
    max_concurrency: int | None = Field(default=None, ge=1)  # None: no limit
    queue_timeout: float = Field(default=30.0, ge=0, le=3600)  # seconds a request waits for a slot
    # Policies naming the same group share prompt-cache entries (None: the policy's own).
    cache_group: str | None = Field(default=None, pattern=NAME_PATTERN)
    # The prompt-normalisation rules applied to its chat requests (router.proxy.normalise):
    # every one by default; [] sends its prompts as they came.
    normalise_prompts: tuple[PromptRule, ...] = PROMPT_RULES
    caps: Caps = Caps()
    match: MatchRules = MatchRules()
    spec: SpecOverrides = SpecOverrides()

    _listify = field_validator("normalise_prompts", mode="before")(_one_or_many)

    @model_validator(mode="after")
    def _presets_consistent(self) -> Policy:
        if self.presets:
            if self.default_preset is not None and self.default_preset not in self.presets:
                raise ValueError(
                    f"default_preset '{self.default_preset}' is not in presets {list(self.presets)}"
                )
            for preset in self.lanes:
                if preset not in self.presets:
                    raise ValueError(f"lanes.{preset}: preset '{preset}' is not in presets")
        return self

    @property
    def name(self) -> str:
        return self.client

    @property
    def cache_partition(self) -> str:
        """Groups and clients are named apart: a policy joins another's entries only by both
        naming one group."""
        return f"group:{self.cache_group}" if self.cache_group else f"client:{self.client}"

    def allows_preset(self, preset: str) -> bool:
        return not self.presets or preset in self.presets

    def allows_model(self, model: str) -> bool:
        return not self.models.allow or any(fnmatchcase(model, p) for p in self.models.allow)

    def allows_load(self, model: str) -> bool:
        """May this client's request load ``model`` (not loaded yet)?"""
        if not self.allows_model(model):
            return False
        rules = self.models.load
        return rules is None or any(fnmatchcase(model, p) for p in rules)

    def lane_for(self, preset: str | None, presets: Mapping[str, PresetSpec]) -> LanePreference:
        """The policy's lane for the preset, else the preset's own, else auto."""
        if preset is None:
            return "auto"
        if preset in self.lanes:
            return self.lanes[preset]
        spec = presets.get(preset)
        return spec.lane if spec is not None else "auto"


class PolicyError(Exception):
    """Invalid policies; every line of the message names the file, the key and the problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)
