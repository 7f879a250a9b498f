"""The contract between the router (its lane supervisor) and a lane worker: the two programs
both import this floor-0 leaf, defined once here.

Used by the worker (``router.worker.main``), the supervisor (``router.lanes.process`` and
``router.lanes.status``) and the test fakes alike:

- the command line: ``python -m router.worker`` with the flags ``add_worker_flags`` defines,
  built by ``worker_argv``;
- the ready line: the one line a worker prints on stdout once it listens
  (``SPECLANE_WORKER_READY {"port": ..., ...}``), written by ``ready_line`` and read by
  ``parse_ready_line``;
- the bounds of a request's ``num_draft_tokens`` field, and the values of its
  ``draft_source`` field;
- the request header that names a request's prompt-cache partition;
- the worker secret: the supervisor draws one per worker command and hands it to the worker
  in the environment (``WORKER_SECRET_ENV``, never on the command line, which ``ps`` shows to
  every user); every request to the worker carries it in ``WORKER_SECRET_HEADER``, so only
  the router reaches a lane, not any program on the machine;
- the shared mode (``--mode shared``): one process serves both lanes, each under its own path
  prefix (``lane_prefix``: ``/lanes/speculative``, ``/lanes/batching``), below which it answers
  exactly what a one-lane worker answers at ``/`` (``/health``, ``/v1/...``).

Imports nothing of speclane's, so the fakes can use it without MLX.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MODULE = "router.worker"  # python -m MODULE
LANE_MODES = ("speculative", "batching")  # one lane per process
SHARED_MODE = "shared"  # both lanes in one process, on one copy of the model
MODES = (*LANE_MODES, SHARED_MODE)
# A lane over a group of ranks (``[lanes.group]``, ``router.worker.group``): how the target
# is split between them.
GROUP_PARALLEL = ("tensor", "pipeline")
# A group's launcher: mlx.launch run by ``python -m GROUP_LAUNCH_MODULE <directory>``, its
# arguments (the ring's ports among them) read from GROUP_LAUNCH_FILE in that private
# directory (0700, the file 0600), never from its command line, which every local user can
# read (``router.worker.group.launch``).
GROUP_LAUNCH_MODULE = "router.worker.group.launch"
GROUP_LAUNCH_FILE = "launch.json"
# How a rank of the ring backend says it could not set up its sockets (a port taken, a
# stranger's connection): "[ring] Couldn't bind socket", "[ring] Couldn't connect".
RING_SETUP_FAILED = "[ring] Couldn't"
# Shared mode's generation threads: one taking turns between the lanes, or one per lane;
# auto: one per lane on a multi-core CPU with a one-thread BLAS (``shared.threads_for``).
SHARED_THREADS = ("auto", "1", "2")
LANES_PATH = "/lanes"  # shared mode: a lane's endpoints live under LANES_PATH/<lane>
READY_PREFIX = "SPECLANE_WORKER_READY "
DRAFT_TOKENS_FIELD = "num_draft_tokens"  # request field: 0 decodes without the draft
# Request field: the speculative lane's draft source for this request (without a
# ``prediction``, which always wins); the batching lane ignores it. The router writes it per
# request family (``router.routing.speculate.request_sources``, chosen by
# ``router.proxy.speculation``).
DRAFT_SOURCE_FIELD = "draft_source"
# A stream whose client did not ask for usage (``stream_options.include_usage``) carries none,
# as OpenAI's; its finish chunk has the usage object (the draft statistics the router reads,
# ``usage.speclane_spec``) under this top-level field instead, which OpenAI clients ignore.
STREAM_USAGE_FIELD = "speclane_usage"
# ``auto``: the lane chooses among every source it has, at every step (the default).
REQUEST_DRAFT_SOURCES = ("auto", "draft_model", "prompt_lookup", "suffix")
MAX_DRAFT_TOKENS = 16  # per verification round, for the flag and the request field
DEFAULT_DRAFT_TOKENS = 3
DEFAULT_BATCH_SIZE = 8
# What drafts on the speculative lane for requests without a ``prediction`` (which always
# drafts from its prediction).
DRAFT_SOURCES = ("auto", "draft_model", "prompt_lookup", "suffix", "none")
MAX_LOOKUP_NGRAM = 16
MAX_DRAFT_PER_STEP = 32  # prompt_lookup and prediction drafts, per verification step
DEFAULT_PROMPT_CACHE_BYTES = 1 << 30
# The prompt cache's disk tier (router.worker.engines.diskcache): a worker started by hand
# has none; the router passes a bound sized for the machine (``auto_disk_bytes``).
MAX_AUTO_DISK_BYTES = 10 << 30
DEFAULT_WARM_PROMPTS = 2  # system prompts per partition loaded from disk at start
MAX_WARM_PROMPTS = 64
DEFAULT_SUFFIX_BYTES = 64 << 20  # the suffix source's index of earlier requests
DEFAULT_PREFILL_STEP_SIZE = 2048  # mlx-lm's own default: the bound of one chunk
DEFAULT_CHUNK_SECONDS = 0.5  # the time one prefill chunk may take between decoding steps
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # the router's own default max_body_bytes
# The router re-encodes what it forwards and may add fields or translate another API's body,
# so a lane accepts this many times the router's limit: what the router took, the lane takes.
WORKER_BODY_HEADROOM = 2
# Request header: the prompt-cache partition of the request, an opaque token written by the
# router (which builds every upstream request's headers itself, so a client cannot send one
# through). A lane reuses cached KV state only between requests of the same partition;
# without the header a request is in the partition of requests without one.
CACHE_PARTITION_HEADER = "X-Speclane-Cache-Partition"
CACHE_PARTITION_PATTERN = r"[A-Za-z0-9_-]{1,64}"
# The worker secret (see the module docstring): the environment variable the supervisor sets
# (the worker reads it and removes it from its own environment, so nothing it starts inherits
# it) and the request header every caller of the worker sends it in. A worker started without
# the variable (by hand, by a test) answers anyone and says so in its log.
WORKER_SECRET_ENV = "SPECLANE_WORKER_SECRET"
WORKER_SECRET_HEADER = "X-Speclane-Worker-Secret"
WORKER_SECRET_BYTES = 32  # of randomness, drawn by ``new_worker_secret``


def new_worker_secret() -> str:
    """A fresh worker secret (URL-safe text, fit for a header value)."""
    return secrets.token_urlsafe(WORKER_SECRET_BYTES)


def secret_matches(presented: str | None, secret: str) -> bool:
    """Constant time: a caller cannot learn the secret one character at a time."""
    if presented is None:
        return False
    try:
        return hmac.compare_digest(presented.encode("utf-8"), secret.encode("utf-8"))
    except UnicodeEncodeError:  # undecodable header bytes: nobody's secret
        return False


def add_worker_flags(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """The flags every worker (and every fake worker) accepts; a fake may default them."""
    p.add_argument(
        "--mode",
        choices=MODES,
        required=required,
        help="speculative: one request at a time with a draft; batching: continuous "
        "batching; shared: both lanes in one process on one copy of the model, "
        f"under {LANES_PATH}/<lane>",
    )
    p.add_argument(
        "--shared-threads",
        choices=SHARED_THREADS,
        default="auto",
        help="shared mode: 1: one generation thread takes turns between the lanes; 2: each "
        "lane on its own thread; auto (the default): 2 on a CPU with two cores or more and "
        "OPENBLAS_NUM_THREADS=1, else 1",
    )
    p.add_argument("--model", required=required, help="the model directory (mlx-lm format)")
    p.add_argument("--model-name", help="the id served in /v1/models (default: the directory name)")
    p.add_argument("--draft-model", help="speculative mode: the draft model directory")
    p.add_argument(
        "--num-draft-tokens",
        type=int,
        default=DEFAULT_DRAFT_TOKENS,
        help=f"speculative mode: tokens drafted per round, 0 to {MAX_DRAFT_TOKENS} "
        f"(default {DEFAULT_DRAFT_TOKENS})",
    )
    p.add_argument(
        "--draft-source",
        choices=DRAFT_SOURCES,
        help="speculative mode: what drafts for requests without a 'prediction' "
        "(default: draft_model with --draft-model, else none)",
    )
    p.add_argument(
        "--lookup-ngram-min",
        type=int,
        default=2,
        help="prompt_lookup: shortest n-gram matched (default 2)",
    )
    p.add_argument(
        "--lookup-ngram-max",
        type=int,
        default=4,
        help="prompt_lookup: longest n-gram matched (default 4)",
    )
    p.add_argument(
        "--lookup-max-draft",
        type=int,
        default=8,
        help="prompt_lookup: tokens drafted per step (default 8)",
    )
    p.add_argument(
        "--prediction-max-draft",
        type=int,
        default=16,
        help="prediction: tokens of the request's prediction verified per step (default 16)",
    )
    p.add_argument(
        "--suffix-max-draft",
        type=int,
        default=16,
        help="suffix: tokens drafted per step from earlier requests (default 16)",
    )
    p.add_argument(
        "--suffix-bytes",
        type=int,
        default=DEFAULT_SUFFIX_BYTES,
        help="suffix: bound of the index of earlier requests' prompts and answers, "
        f"all clients together (default {DEFAULT_SUFFIX_BYTES}; 0: no index)",
    )
    p.add_argument(
        "--draft-position-cost",
        type=position_cost,
        default=None,
        help="prediction, prompt lookup, suffix: what one more verified position costs, "
        "relative to a one-position pass, when choosing each step's draft length (default: "
        "auto, measured from the lane's passes; 0: always the longest draft)",
    )
    p.add_argument(
        "--content-special-tokens",
        choices=CONTENT_SPECIAL_TOKENS,
        default="text",
        help="special tokens' text inside messages: read as text (the default: no message "
        "can forge a turn) or as control tokens",
    )
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"batching mode: sequences decoded together (default {DEFAULT_BATCH_SIZE})",
    )
    p.add_argument(
        "--prompt-cache-bytes",
        type=int,
        default=DEFAULT_PROMPT_CACHE_BYTES,
        help="bound of the KV prompt cache reused across requests (0: no cache)",
    )
    p.add_argument(
        "--prompt-cache-disk-bytes",
        type=int,
        default=0,
        help="bound of the prompt cache's files on disk (0, the default: no disk tier)",
    )
    p.add_argument(
        "--prompt-cache-dir",
        type=Path,
        default=None,
        help="directory of the prompt cache's files (default: "
        "$XDG_CACHE_HOME/speclane/prompt-cache, else ~/.cache/speclane/prompt-cache)",
    )
    p.add_argument(
        "--warm-prompts",
        type=int,
        default=0,
        help="at start, load each partition's N latest system prompts from the disk tier "
        "(0, the default: none)",
    )
    p.add_argument(
        "--prefill-step-size",
        type=int,
        default=DEFAULT_PREFILL_STEP_SIZE,
        help="batching mode: at most this many prompt tokens between two decoding steps",
    )
    p.add_argument(
        "--prefill-chunk-seconds",
        type=float,
        default=DEFAULT_CHUNK_SECONDS,
        help="batching mode: the time one prefill chunk may take between two decoding steps",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="the largest request body accepted (default "
        f"{DEFAULT_MAX_BODY_BYTES}); the router passes "
        f"{WORKER_BODY_HEADROOM} times its own max_body_bytes",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=int,
        default=0,
        help="port to listen on; 0 (the default) picks a free one, announced in the ready line",
    )
    p.add_argument("--parent-pid", type=int, help="exit when this process (the supervisor) is gone")
    p.add_argument(
        "--core-share",
        help="a file of one byte per lane process sharing this machine's cores: this lane "
        "marks itself busy there and sets its OpenBLAS threads to its share of the cores "
        "among the busy lanes (router.worker.engines.cores)",
    )
    p.add_argument(
        "--core-slot", type=int, default=0, help="this lane's byte in --core-share (default 0)"
    )
    p.add_argument(
        "--group-parallel",
        choices=GROUP_PARALLEL,
        help="run as one rank of a group started by mlx.launch (speculative or shared mode): "
        "rank 0 serves, the others follow; the target split by tensor or pipeline parallelism",
    )
    p.add_argument("--group-backend", default="ring", help="the group's backend (reported)")
    p.add_argument("--group-hosts", default="", help="the ranks' hosts, comma-separated (reported)")


CONTENT_SPECIAL_TOKENS = ("text", "control")


def position_cost(text: str) -> float | None:
    """``--draft-position-cost``: ``auto`` (None: measured) or a figure >= 0."""
    if text == "auto":
        return None
    value = float(text)
    if not value >= 0:
        raise ValueError(text)
    return value


def check_worker_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not 0 <= args.num_draft_tokens <= MAX_DRAFT_TOKENS:
        p.error(f"--num-draft-tokens must be between 0 and {MAX_DRAFT_TOKENS}")
    if args.max_batch_size < 1:
        p.error("--max-batch-size must be at least 1")
    if args.prompt_cache_bytes < 0:
        p.error("--prompt-cache-bytes must be >= 0")
    if args.prompt_cache_disk_bytes < 0:
        p.error("--prompt-cache-disk-bytes must be >= 0")
    if not 0 <= args.warm_prompts <= MAX_WARM_PROMPTS:
        p.error(f"--warm-prompts must be between 0 and {MAX_WARM_PROMPTS}")
    if args.prompt_cache_dir is None:
        args.prompt_cache_dir = default_prompt_cache_dir()
    if args.prefill_step_size < 1:
        p.error("--prefill-step-size must be at least 1")
    if args.max_body_bytes < 1024:
        p.error("--max-body-bytes must be at least 1024")
    if not args.prefill_chunk_seconds > 0:
        p.error("--prefill-chunk-seconds must be > 0")
    if not 1 <= args.lookup_ngram_min <= args.lookup_ngram_max <= MAX_LOOKUP_NGRAM:
        p.error(f"--lookup-ngram-min/max must satisfy 1 <= min <= max <= {MAX_LOOKUP_NGRAM}")
    if args.suffix_bytes < 0:
        p.error("--suffix-bytes must be >= 0")
    for flag in ("lookup_max_draft", "prediction_max_draft", "suffix_max_draft"):
        if not 1 <= getattr(args, flag) <= MAX_DRAFT_PER_STEP:
            p.error(f"--{flag.replace('_', '-')} must be between 1 and {MAX_DRAFT_PER_STEP}")
    if args.group_parallel is not None and args.mode not in ("speculative", SHARED_MODE):
        p.error("--group-parallel runs the speculative lane or both (--mode speculative|shared)")
    if args.draft_source is None:
        args.draft_source = "draft_model" if args.draft_model else "none"
    if (
        args.draft_source == "draft_model"
        and serves_speculative(args.mode)
        and not args.draft_model
    ):
        p.error("--draft-source draft_model needs --draft-model")


def default_prompt_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the prompt cache's files go unless ``[lanes] prompt_cache_dir`` says otherwise."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".cache"
    return root / "speclane" / "prompt-cache"


def auto_disk_bytes(free_bytes: int) -> int:
    """The disk tier's bound by default: a tenth of the free disk, at most 10 GiB."""
    return max(0, min(MAX_AUTO_DISK_BYTES, free_bytes // 10))


def serves_speculative(mode: str) -> bool:
    return mode in ("speculative", SHARED_MODE)


def without_draft_source(flags: tuple[str, ...]) -> tuple[str, ...]:
    """The draft flags the batching lane takes: the sources' limits. Its source comes with
    each request (the router names one), so no lane-wide ``--draft-source``."""
    out: list[str] = []
    skip = False
    for flag in flags:
        if skip:
            skip = False
        elif flag == "--draft-source":
            skip = True
        else:
            out.append(flag)
    return tuple(out)


def serves_batching(mode: str) -> bool:
    return mode in ("batching", SHARED_MODE)


def lane_prefix(lane: str) -> str:
    """Shared mode: the path under which ``lane``'s endpoints are served."""
    if lane not in LANE_MODES:
        raise ValueError(f"unknown lane {lane!r}")
    return f"{LANES_PATH}/{lane}"


def worker_argv(
    python: str,
    mode: str,
    model: Path,
    model_name: str,
    *,
    draft: Path | None,
    num_draft_tokens: int,
    max_batch_size: int,
    parent_pid: int,
    prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES,
    prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE,
    prefill_chunk_seconds: float = DEFAULT_CHUNK_SECONDS,
    speculative: tuple[str, ...] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    shared_threads: str = "auto",
    content_special_tokens: str = "text",
    prompt_cache_disk_bytes: int = 0,
    prompt_cache_dir: Path | None = None,
    warm_prompts: int = 0,
    core_share: tuple[Path, int] | None = None,
) -> list[str]:
    """The command line of a worker on a free loopback port; ``speculative``: the draft
    source flags of the speculative lane; ``max_body_bytes``: the router's own limit;
    ``shared_threads``: the shared mode's generation threads (``SHARED_THREADS``);
    ``prompt_cache_disk_bytes`` (0: none), ``prompt_cache_dir``, ``warm_prompts``: the prompt
    cache's disk tier; ``core_share``: the shared cores' file and this lane's slot in it."""
    argv = [python, "-m", MODULE, "--mode", mode, "--model", str(model), "--model-name", model_name]
    if draft is not None and serves_speculative(mode):
        argv += ["--draft-model", str(draft)]
    if serves_speculative(mode):
        argv += speculative
    elif serves_batching(mode):
        argv += without_draft_source(speculative)
    if mode == SHARED_MODE:
        argv += ["--shared-threads", shared_threads]
    if core_share is not None:
        argv += ["--core-share", str(core_share[0]), "--core-slot", str(core_share[1])]
    if prompt_cache_dir is not None:
        argv += ["--prompt-cache-dir", str(prompt_cache_dir)]
    if serves_batching(mode):
        argv += [
            "--prefill-step-size",
            str(prefill_step_size),
            "--prefill-chunk-seconds",
            str(prefill_chunk_seconds),
        ]
    argv += [
        "--num-draft-tokens",
        str(num_draft_tokens),
        "--max-batch-size",
        str(max_batch_size),
        "--prompt-cache-bytes",
        str(prompt_cache_bytes),
        "--content-special-tokens",
        content_special_tokens,
        "--prompt-cache-disk-bytes",
        str(prompt_cache_disk_bytes),
        "--warm-prompts",
        str(warm_prompts),
        "--max-body-bytes",
        str(max_body_bytes * WORKER_BODY_HEADROOM),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--parent-pid",
        str(parent_pid),
    ]
    return argv


def ready_line(port: int, **facts: Any) -> str:
    return READY_PREFIX + json.dumps({"port": port, **facts}) + "\n"


def parse_ready_line(line: str) -> int | None:
    """The port announced by a worker's ready line, or None if ``line`` is not one."""
    if not line.startswith(READY_PREFIX):
        return None
    try:
        payload = json.loads(line[len(READY_PREFIX) :])
    except ValueError:
        return None
    port = payload.get("port") if isinstance(payload, Mapping) else None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        return None
    return port
