"""Configuration: a TOML file plus ``SPECLANE_*`` environment variables, validated once.

Everything here is parsed at start-up into frozen pydantic models; the rest of the
program reads these immutable values and never re-parses. Environment variables
override the file (nested keys use ``__``: ``SPECLANE_LANES__ENABLED=false``).
"""

from __future__ import annotations

import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from router.config.presets import DEFAULT_PRESETS, PresetSpec
from router.config.speculation import SpecSettings
from router.lanes.gating.rules import GatingSettings
from router.routing.classify import RoutingRules

BackendKind = Literal[
    "openai", "mlx_lm", "lmstudio", "llamacpp", "ollama", "vllm", "vllm_mlx", "sglang"
]
LANE_NAMES = ("speculative", "batching")
# The parsed TOML file of the load in progress: a settings source below the environment.
_FILE_DATA: ContextVar[dict[str, Any] | None] = ContextVar("speclane_config_file", default=None)


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BackendSpec(Frozen):
    """One external OpenAI-compatible backend the user already runs."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    kind: BackendKind = "openai"
    base_url: str = Field(description="OpenAI base URL including /v1, e.g. http://127.0.0.1:1234/v1")
    api_key: SecretStr | None = None
    models: tuple[str, ...] = ()  # empty: discovered from GET {base_url}/models
    connect_timeout: float = Field(5.0, gt=0)
    read_timeout: float = Field(120.0, gt=0)  # longest silence between upstream bytes
    speculative: bool = False  # the user configured speculation on this backend
    drain_on_abort: bool = False  # let generation finish upstream when the client leaves
    max_concurrency: int | None = Field(None, ge=1)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    @field_validator("name")
    @classmethod
    def _not_a_lane(cls, v: str) -> str:
        if v in LANE_NAMES:
            raise ValueError(f"'{v}' is reserved for speclane's own lane")
        return v

    @property
    def root_url(self) -> str:
        """The server root, for non-OpenAI endpoints (/metrics, /health, /v1/status)."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url


class LaneSpec(Frozen):
    enabled: bool = True


class LanesSettings(Frozen):
    """speclane's own two MLX workers on one target model."""

    enabled: bool = True
    model: str | None = None  # None: the embedded default model (speclane models prepare)
    model_name: str | None = None  # the id clients send; default: the model dir's name / repo id
    draft_model: str | None = None  # None: the default draft derived from the default model
    num_draft_tokens: int = Field(3, ge=1, le=16)
    # The speculative lane's draft for requests without a ``prediction`` (which always drafts
    # from its prediction). auto: draft_model when a draft model runs (the gate may refuse
    # it), else none; prompt_lookup needs no draft model.
    draft_source: Literal["auto", "draft_model", "prompt_lookup", "none"] = "auto"
    lookup_ngram_min: int = Field(2, ge=1, le=16)
    lookup_ngram_max: int = Field(4, ge=1, le=16)
    lookup_max_draft: int = Field(8, ge=1, le=32)
    prediction_max_draft: int = Field(16, ge=1, le=32)
    prompt_cache_bytes: int = Field(512 << 20, ge=0)  # speculative lane's prefix cache; 0: off
    max_batch_size: int = Field(8, ge=1, le=256)
    startup_timeout: float = Field(600.0, gt=0)
    health_interval: float = Field(2.0, gt=0)
    max_restarts: int = Field(5, ge=0)  # within restart_window, then the lane is given up
    restart_window: float = Field(300.0, gt=0)
    read_timeout: float = Field(300.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    speculative: LaneSpec = LaneSpec()
    batching: LaneSpec = LaneSpec()

    @model_validator(mode="after")
    def _ngram_range(self) -> LanesSettings:
        if self.lookup_ngram_min > self.lookup_ngram_max:
            raise ValueError("lookup_ngram_min must not exceed lookup_ngram_max")
        return self


class RetrySettings(Frozen):
    attempts: int = Field(3, ge=1, le=10)  # total tries across candidates
    backoff_initial: float = Field(0.05, ge=0)
    backoff_max: float = Field(1.0, ge=0)


class CooldownSettings(Frozen):
    allowed_fails: int = Field(3, ge=1)
    seconds: float = Field(5.0, ge=0)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPECLANE_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    policies_dir: Path = Path("policies")
    admin_key: SecretStr | None = None
    expose_metrics: Literal["public", "loopback", "admin", "off"] = "public"
    health_interval: float = Field(5.0, gt=0)
    shutdown_grace: float = Field(30.0, ge=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    retry: RetrySettings = RetrySettings()
    cooldown: CooldownSettings = CooldownSettings()
    backends: tuple[BackendSpec, ...] = ()
    lanes: LanesSettings = LanesSettings()
    presets: dict[str, PresetSpec] = Field(default_factory=lambda: dict(DEFAULT_PRESETS))
    routing: RoutingRules = RoutingRules()
    policy_poll_interval: float = Field(2.0, gt=0)  # seconds between policy file checks
    spec: SpecSettings = SpecSettings()
    gating: GatingSettings = GatingSettings()  # draft/target pair checks, strict or graceful

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Priority: command-line flags (init kwargs) > SPECLANE_* environment > the file.
        return (init_settings, env_settings,
                InitSettingsSource(settings_cls, init_kwargs=_FILE_DATA.get() or {}))

    @model_validator(mode="after")
    def _unique_backend_names(self) -> Settings:
        seen: set[str] = set()
        for b in self.backends:
            if b.name in seen:
                raise ValueError(f"backend name '{b.name}' is used twice")
            seen.add(b.name)
        return self


class ConfigError(Exception):
    """A configuration problem, with the file and key in its message."""


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``path`` (TOML), the environment, and ``overrides`` (command-line
    flags), each winning over the one before it."""
    data: dict[str, Any] = {}
    where = str(path) if path else "environment"
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ConfigError(f"{path}: file not found") from e
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read: {e}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from e
    token = _FILE_DATA.set(data)
    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise ConfigError(format_validation_error(where, e)) from e
    except SettingsError as e:
        raise ConfigError(f"environment: {e}") from e
    finally:
        _FILE_DATA.reset(token)


def _deep_merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def format_validation_error(where: str, err: ValidationError) -> str:
    lines = []
    for item in err.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        lines.append(f"{where}: {key}: {item['msg']}")
    return "\n".join(lines)
