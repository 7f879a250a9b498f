"""Configuration: a TOML file plus ``SPECLANE_*`` environment variables, validated once.

Everything here is parsed at start-up into frozen pydantic models; the rest of the
program reads these immutable values and never re-parses. Environment variables
override the file (nested keys use ``__``: ``SPECLANE_LANES__ENABLED=false``).
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
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

from router.config.base import Frozen, format_validation_error
from router.config.gating import GatingSettings
from router.config.group import GroupSpec
from router.config.kinds import KINDS
from router.config.names import LANE_NAMES
from router.config.policydir import default_policies_dir, relative_to_config
from router.config.presets import DEFAULT_PRESETS, PresetSpec
from router.config.routing import RoutingRules
from router.config.speculation import SpecSettings
from router.kernel.worker_contract import (
    DEFAULT_CHUNK_SECONDS,
    DEFAULT_DRAFT_TOKENS,
    DEFAULT_PREFILL_STEP_SIZE,
    DEFAULT_PROMPT_CACHE_BYTES,
    DEFAULT_SUFFIX_BYTES,
    DEFAULT_WARM_PROMPTS,
    MAX_DRAFT_TOKENS,
    MAX_WARM_PROMPTS,
)

BackendKind = Literal[
    "openai", "mlx_lm", "lmstudio", "llamacpp", "ollama", "vllm", "vllm_mlx", "sglang"
]
# The parsed TOML file of the load in progress: a settings source below the environment.
_FILE_DATA: ContextVar[dict[str, Any] | None] = ContextVar("speclane_config_file", default=None)


class BackendSpec(Frozen):
    """One external OpenAI-compatible backend the user already runs."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    kind: BackendKind = "openai"
    base_url: str = Field(
        description="OpenAI base URL including /v1, e.g. http://127.0.0.1:1234/v1"
    )
    api_key: SecretStr | None = None
    models: tuple[str, ...] = ()  # empty: discovered from GET {base_url}/models
    connect_timeout: float = Field(default=5.0, gt=0)
    read_timeout: float = Field(default=120.0, gt=0)  # longest silence between upstream bytes
    speculative: bool = False  # the user configured speculation on this backend
    drain_on_abort: bool = False  # let generation finish upstream when the client leaves
    max_concurrency: int | None = Field(default=None, ge=1)
    # fold: system and developer messages after the first become notes in place, as the
    # lanes do (router.kernel.system_messages), since the chat templates these servers render
    # (Qwen's among them) refuse a system message that is not first; as_is: forwarded as
    # sent. Default: the kind's (router.config.kinds: as_is for openai, a hosted API).
    system_messages: Literal["fold", "as_is"] = "fold"

    @model_validator(mode="before")
    @classmethod
    def _system_messages_by_kind(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("system_messages") is None:
            facts = KINDS.get(data.get("kind", "openai"))  # an unknown kind fails below
            return {**data, "system_messages": facts.system_messages if facts else "fold"}
        return data

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


MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"


class ModelEntry(Frozen):
    """One ``[[lanes.models]]`` entry: a model the lanes may load on demand
    (``router.lanes.models``); it wins over a ``models_dir`` folder of the same name."""

    name: str = Field(pattern=MODEL_NAME_PATTERN)  # the id clients send in "model"
    path: str  # a local mlx-lm directory (a Hugging Face repo id on a Mac)
    aliases: tuple[str, ...] = ()  # other ids that name this model
    draft: str | None = None  # its draft model's directory (None: none)
    # never unloaded (TTL or memory); None: pinned when it is the start-up model
    pinned: bool | None = None
    ttl: float | None = Field(default=None, ge=0)  # idle seconds before unloading; None: lanes.ttl
    layout: Literal["auto", "shared", "separate"] | None = None  # None: lanes.layout
    # Its lane spans a group of ranks (router.config.group); None: lanes.group
    group: GroupSpec | None = None

    @field_validator("aliases")
    @classmethod
    def _alias_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for alias in v:
            if not re.fullmatch(MODEL_NAME_PATTERN, alias):
                raise ValueError(f"alias {alias!r} is not a model name")
        return v


class LanesSettings(Frozen):
    """speclane's own two MLX workers per model: the start-up model (``model``) and the
    models loaded on demand (``models_dir``, ``models``)."""

    enabled: bool = True
    model: str | None = None  # None: the embedded default model (speclane models prepare)
    model_name: str | None = None  # the id clients send; default: the model dir's name / repo id
    draft_model: str | None = None  # None: the default draft derived from the default model
    num_draft_tokens: int = Field(default=DEFAULT_DRAFT_TOKENS, ge=1, le=MAX_DRAFT_TOKENS)
    # The speculative lane's draft for requests without a ``prediction`` (which always drafts
    # from its prediction). auto: chosen per request family by the router
    # (router.routing.speculate.lane_sources): prompt_lookup then draft_model for code-block
    # and tools, draft_model then prompt_lookup for chat when a draft model runs (the gate
    # may refuse it), else prompt_lookup; the first source still paying is used. A fixed
    # value is that source alone for every family; prompt_lookup needs no draft model.
    # suffix drafts from the same client's earlier prompts and answers (and the request's
    # own context); auto tries it after prompt_lookup, and for chat after the other two.
    # constrained answers (tool_choice required or named, a JSON response_format) draft
    # their grammar's forced tokens, and under auto suffix, then prompt_lookup between them,
    # the draft model last.
    draft_source: Literal["auto", "draft_model", "prompt_lookup", "suffix", "none"] = "auto"
    lookup_ngram_min: int = Field(default=2, ge=1, le=16)
    lookup_ngram_max: int = Field(default=4, ge=1, le=16)
    lookup_max_draft: int = Field(default=8, ge=1, le=32)
    prediction_max_draft: int = Field(default=16, ge=1, le=32)
    suffix_max_draft: int = Field(default=16, ge=1, le=32)
    # The suffix source's index of earlier requests, all clients together (LRU, the largest
    # client partition gives up entries first); 0: none.
    suffix_bytes: int = Field(default=DEFAULT_SUFFIX_BYTES, ge=0)
    # A free source's draft length per step: what one more verified position costs against
    # a one-position pass; auto measures it from the lane's own passes.
    draft_position_cost: Literal["auto"] | Annotated[float, Field(ge=0)] = "auto"
    max_batch_size: int = Field(default=8, ge=1, le=256)
    # Special tokens' text inside messages (a tool result quoting "<|im_end|>"): "text" reads
    # it as text, so no message can forge a turn; "control" as the tokens themselves.
    content_special_tokens: Literal["text", "control"] = "text"
    startup_timeout: float = Field(default=600.0, gt=0)
    health_interval: float = Field(default=2.0, gt=0)
    max_restarts: int = Field(default=5, ge=0)  # within restart_window, then the lane is given up
    restart_window: float = Field(default=300.0, gt=0)
    # A worker busy (a request active or queued) whose progress_tokens do not move for this
    # long has a stuck generation thread: it is killed and restarted (0: never).
    stall_timeout: float = Field(default=300.0, ge=0)
    read_timeout: float = Field(default=300.0, gt=0)
    # KV cache of earlier requests reused for the longest common token prefix (0: off).
    prompt_cache_bytes: int = Field(default=DEFAULT_PROMPT_CACHE_BYTES, ge=0)
    # The prompt cache's disk tier (router.worker.engines.diskcache): entries spill to files
    # found again after a restart, a crash, an unload or an eviction. None: a tenth of the
    # free disk at prompt_cache_dir, at most 10 GiB; 0: off.
    prompt_cache_disk_bytes: int | None = Field(default=None, ge=0)
    # None: $XDG_CACHE_HOME/speclane/prompt-cache, else ~/.cache/speclane/prompt-cache.
    prompt_cache_dir: Path | None = None
    # At a worker's start, each partition's most recent system prompts loaded from disk.
    warm_prompts: int = Field(default=DEFAULT_WARM_PROMPTS, ge=0, le=MAX_WARM_PROMPTS)
    # Batching lane: a long prompt is prefilled in chunks between decoding steps, so running
    # streams keep producing tokens; a chunk takes about prefill_chunk_seconds (measured),
    # and holds at most prefill_step_size tokens.
    prefill_step_size: int = Field(default=DEFAULT_PREFILL_STEP_SIZE, ge=1, le=65536)
    prefill_chunk_seconds: float = Field(default=DEFAULT_CHUNK_SECONDS, gt=0, le=60)
    env: dict[str, str] = Field(default_factory=dict)
    # separate: one worker process per lane (two copies of the model); shared: one process
    # serves both lanes on one copy, with one prompt cache; auto: separate while the estimate
    # of two copies takes under a quarter of the machine's memory (router.lanes.layout).
    layout: Literal["auto", "shared", "separate"] = "auto"
    # The shared layout's generation threads: 2 runs each lane on its own (they compute at
    # once, on two cores), 1 takes turns between them on one thread (router.worker.engines.shared);
    # auto: 2 on a CPU with two cores or more and a one-thread BLAS (OPENBLAS_NUM_THREADS=1),
    # else 1 (a multi-threaded BLAS already uses the cores).
    shared_threads: Literal["auto", 1, 2] = "auto"
    # BLAS threads per lane process (router.lanes.blas): auto gives each of the separate
    # layout's two processes half the cores (a process alone keeps the BLAS's default); an
    # int sets every lane process's. OPENBLAS_NUM_THREADS in the environment or [lanes] env wins.
    blas_threads: Literal["auto"] | Annotated[int, Field(ge=1, le=1024)] = "auto"
    # Refuse to start when the lanes' estimated memory exceeds this (None: the available
    # memory less router.lanes.layout.RESERVE_BYTES).
    memory_limit_bytes: int | None = Field(default=None, ge=0)
    # The machine's memory as auto and the guard see it (None: read from the system; total and
    # available both take this value when set).
    machine_memory_bytes: int | None = Field(default=None, ge=0)
    speculative: LaneSpec = LaneSpec()
    batching: LaneSpec = LaneSpec()
    # The start-up model's lane spans a group of ranks on MLX's distributed runtime
    # (router.config.group, router.worker.group); None: one process on this machine.
    group: GroupSpec | None = None
    # Models on demand (router.lanes.models): every mlx-lm directory in models_dir is
    # servable under its folder name (None: speclane's models directory, where
    # ``speclane models prepare`` puts the default model; "<name>-draft" is <name>'s draft).
    models_dir: Path | None = None
    models: tuple[ModelEntry, ...] = ()
    # Idle seconds before a loaded model is unloaded (0: never); per model: models[].ttl.
    ttl: float = Field(default=300.0, ge=0)
    # The longest a request waits for its model to load (or for memory to be freed).
    load_timeout: float = Field(default=600.0, gt=0)
    # Requests waiting for a model to load, all models together; beyond: 503 at once.
    load_queue: int = Field(default=64, ge=1)

    @model_validator(mode="after")
    def _ngram_range(self) -> LanesSettings:
        if self.lookup_ngram_min > self.lookup_ngram_max:
            raise ValueError("lookup_ngram_min must not exceed lookup_ngram_max")
        return self

    @model_validator(mode="after")
    def _unique_model_names(self) -> LanesSettings:
        seen: set[str] = set()
        for entry in self.models:
            for name in (entry.name, *entry.aliases):
                if name in seen:
                    raise ValueError(f"model name or alias '{name}' is used twice in lanes.models")
                seen.add(name)
        return self


class RetrySettings(Frozen):
    attempts: int = Field(default=3, ge=1, le=10)  # total tries across candidates
    backoff_initial: float = Field(default=0.05, ge=0)
    backoff_max: float = Field(default=1.0, ge=0)


class UpstreamSettings(Frozen):
    """Bounds on every upstream answer the relay reads (lanes and external backends)."""

    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)  # decoded body of one answer
    # an answer's head, from its first byte to its end
    head_timeout: float = Field(default=30.0, gt=0)
    max_trailer_bytes: int = Field(default=16 * 1024, ge=0)  # trailers after a chunked body


class CooldownSettings(Frozen):
    allowed_fails: int = Field(default=3, ge=1)
    seconds: float = Field(default=5.0, ge=0)


class ClientLimits(Frozen):
    """Bounds on the connections clients open to speclane (router.proxy.connections)."""

    keepalive_timeout: float = Field(default=75.0, gt=0)  # an idle connection is closed after this
    head_timeout: float = Field(default=10.0, gt=0)  # a request's first byte to the end of its head
    body_timeout: float = Field(default=60.0, gt=0)  # to receive a whole request body
    max_connections: int = Field(default=512, ge=1)  # beyond: 503 and close (lowered to fit fds)
    # A stream still without its first chunk after this many seconds (a long prefill) gets
    # its headers and a keep-alive, then one every this many seconds (router.proxy.early).
    stream_keepalive: float = Field(default=2.0, gt=0, le=60)


class ResponsesSettings(Frozen):
    """The Responses API's store of finished responses (``previous_response_id``, ``GET``),
    in memory, least recently used evicted first (router.frontdoors.responses_store)."""

    store_entries: int = Field(1024, ge=0)  # 0: nothing is stored
    store_bytes: int = Field(64 * 1024 * 1024, ge=0)
    # Background responses (background: true) one client may have running at once.
    max_background: int = Field(16, ge=1)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPECLANE_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # Host names (besides loopback ones and the bind address) that requests may name in
    # their Host header: "name", ".domain" (it and its subdomains), or "*" (any: no DNS
    # rebinding protection). See router.proxy.hosts.
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    client_limits: ClientLimits = ClientLimits()
    policies_dir: Path = Path("policies")
    admin_key: SecretStr | None = None
    expose_metrics: Literal["public", "loopback", "admin", "off"] = "public"
    health_interval: float = Field(default=5.0, gt=0)
    shutdown_grace: float = Field(default=30.0, ge=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    retry: RetrySettings = RetrySettings()
    cooldown: CooldownSettings = CooldownSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    backends: tuple[BackendSpec, ...] = ()
    lanes: LanesSettings = LanesSettings()
    presets: dict[str, PresetSpec] = Field(default_factory=lambda: dict(DEFAULT_PRESETS))
    routing: RoutingRules = RoutingRules()
    policy_poll_interval: float = Field(default=2.0, gt=0)  # seconds between policy file checks
    # A policy file is read only once nothing in the directory has changed for this long,
    # so that a file being rewritten in place is never loaded half written.
    policy_settle_seconds: float = Field(default=1.0, ge=0, le=30)
    spec: SpecSettings = SpecSettings()
    gating: GatingSettings = GatingSettings()  # draft/target pair checks, strict or graceful
    responses: ResponsesSettings = ResponsesSettings.model_validate({})

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
        return (
            init_settings,
            env_settings,
            InitSettingsSource(settings_cls, init_kwargs=_FILE_DATA.get() or {}),
        )

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(allowed_host_entry(entry) for entry in v)

    @model_validator(mode="after")
    def _unique_backend_names(self) -> Settings:
        seen: set[str] = set()
        for b in self.backends:
            if b.name in seen:
                raise ValueError(f"backend name '{b.name}' is used twice")
            seen.add(b.name)
        return self


def allowed_host_entry(value: str) -> str:
    """One ``allowed_hosts`` entry, lower-cased; a scheme, port, path or space is refused
    (a Host is matched by name alone)."""
    entry = value.strip().lower().rstrip(".")
    if entry == "*":
        return entry
    try:
        address = ipaddress.ip_address(entry.removeprefix("[").removesuffix("]"))
    except ValueError:
        pass
    else:
        return f"[{address.compressed}]" if address.version == 6 else address.compressed
    name = entry[1:] if entry.startswith(".") else entry
    if not re.fullmatch(r"[a-z0-9_-][a-z0-9_.-]*", name):
        raise ValueError(
            f"{value!r}: expected a host name or address without scheme or "
            "port (e.g. 'mybox.lan', '.example.com' or '*')"
        )
    return entry


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
    if path is not None and isinstance(data.get("policies_dir"), str):
        data["policies_dir"] = relative_to_config(data["policies_dir"], path)
    token = _FILE_DATA.set(data)
    try:
        settings = Settings(**overrides)
        if "policies_dir" not in settings.model_fields_set:
            settings = settings.model_copy(update={"policies_dir": default_policies_dir(path)})
            # Still "not configured" (model_copy counts it as set): a missing default
            # directory is a warning, a missing configured one an error (router.app).
            settings.__pydantic_fields_set__.discard("policies_dir")
        return settings
    except ValidationError as e:
        raise ConfigError(format_validation_error(where, e, Settings)) from e
    except SettingsError as e:
        raise ConfigError(f"environment: {e}") from e
    finally:
        _FILE_DATA.reset(token)
