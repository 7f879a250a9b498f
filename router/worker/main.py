"""``python -m router.worker``: one MLX lane, or both on one copy of the model (``--mode
shared``, ``router.worker.engines.shared``); its contract: ``router.kernel.worker_contract``.

Life cycle: load the model(s) on the generation thread; bind; print the one ready line on
stdout; serve until SIGTERM/SIGINT or until the parent process disappears; then stop
accepting, abort in-flight generations and exit 0. Logs go to stderr; so does anything a
library prints, because stdout carries only the ready line the supervisor waits for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TextIO

from aiohttp import web

from router.kernel.errors import LoadError
from router.kernel.worker_contract import (
    SHARED_MODE,
    WORKER_SECRET_ENV,
    add_worker_flags,
    check_worker_flags,
    ready_line,
    serves_speculative,
)
from router.worker.drafting.drafts import LookupConfig, PredictionConfig
from router.worker.drafting.suffix import SuffixConfig
from router.worker.engines.batching import BatchingEngine
from router.worker.engines.cores import core_share
from router.worker.engines.diskcache import DiskTier, identity_of
from router.worker.engines.engine import Engine, Models
from router.worker.engines.promptcache import PromptCache
from router.worker.engines.shared import SharedEngine, batch_drafts, threads_for
from router.worker.engines.speculative import SpeculativeConfig, SpeculativeEngine
from router.worker.group.both import GroupSharedEngine
from router.worker.group.run import group_engine, group_shared_engine, run_follower
from router.worker.group.run import rank as group_rank
from router.worker.http.server import WorkerInfo, make_shared_app, make_worker_app, start_site

PARENT_POLL_SECONDS = 0.5
SHUTDOWN_SECONDS = 3.0

log = logging.getLogger("speclane.worker")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="speclane worker", description="Run one MLX lane worker.")
    add_worker_flags(p)
    args = p.parse_args(argv)
    check_worker_flags(p, args)
    args.model = Path(args.model)
    args.draft_model = Path(args.draft_model) if args.draft_model else None
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the worker; once the model loading has started this exits the process itself."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s"
    )
    ready_out, sys.stdout = sys.stdout, sys.stderr
    # Until the event loop takes over the signals, a stop request just ends the process: nothing
    # has been served yet, and the loading thread cannot be interrupted cleanly.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: os._exit(0))
    args.first_ppid = os.getppid()  # whoever started us: a change means it is gone
    secret = take_secret()
    if args.group_parallel is not None and group_rank() > 0:  # a follower of rank 0
        run_follower(args, die_with_parent, hard_exit)
    if args.parent_pid is not None:
        die_with_parent(args.parent_pid, args.first_ppid)
    if args.mode == "batching" and args.draft_model:
        log.warning("--draft-model is ignored in batching mode")
    engine = build_shared(args) if args.mode == SHARED_MODE else build_engine(args)
    if isinstance(engine, Engine) and args.mode != SHARED_MODE:
        engine.cores = core_share(args.core_share, args.core_slot)
    try:
        models = engine.start()
    except LoadError as e:
        print(f"speclane worker: cannot load the model: {e}", file=sys.stderr, flush=True)
        hard_exit(1)
    cache = engine_cache(engine)
    if cache is not None:
        warm(cache, args.warm_prompts)
    if isinstance(engine, SharedEngine):
        lanes = {
            lane: (lane_engine, worker_info(args, models, lane))
            for lane, lane_engine in engine.lanes.items()
        }
        app = make_shared_app(
            lanes,
            lambda: {
                "model": lanes["speculative"][1].model_name,
                "threads": engine.threads,
                "turns": dict(engine.turns),
                **group_figures(engine),
            },
            args.max_body_bytes,
            secret,
        )
        hard_exit(asyncio.run(serve(args, engine, app, ready_out, lanes=list(lanes))))
    info = worker_info(args, models)
    app = make_worker_app(engine, info, args.max_body_bytes, secret)
    hard_exit(asyncio.run(serve(args, engine, app, ready_out)))


def engine_cache(engine: Engine | SharedEngine) -> PromptCache | None:
    cache = getattr(engine, "prompt_cache", None)
    return cache if isinstance(cache, PromptCache) else None


def group_figures(engine: SharedEngine) -> dict[str, object]:
    """Both lanes over a group: the group's block (ranks, hosts, memory) at /health's root."""
    return {"group": engine.group_report()} if isinstance(engine, GroupSharedEngine) else {}


def take_secret() -> str | None:
    """The worker secret the supervisor put in our environment, removed from it so that
    nothing this process starts inherits it; None (with a warning): started by hand."""
    secret = os.environ.pop(WORKER_SECRET_ENV, None) or None
    if secret is None:
        log.warning(
            "%s is not set: this worker answers any program on this machine "
            "(the router's supervisor always sets it)",
            WORKER_SECRET_ENV,
        )
    return secret


def hard_exit(code: int) -> NoReturn:
    """Leave without interpreter teardown once MLX has run on the generation thread.

    Tearing down with that thread (or MLX's own threads) still alive sometimes aborts in a C++
    destructor ("terminate called without an active exception"), which would turn a clean
    exit 0 into SIGABRT. Nothing is left to flush but the standard streams.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__):
        if stream is not None:  # None when started without that stream
            with contextlib.suppress(Exception):
                stream.flush()
    os._exit(code)


def prompt_cache(args: argparse.Namespace) -> PromptCache:
    """The process's prompt cache, with its disk tier where one is asked for (never over a
    group of ranks: rank 0 alone could not read the others' shards of an entry)."""
    disk = None
    if args.prompt_cache_disk_bytes and args.prompt_cache_bytes and args.group_parallel is None:
        directory = Path(args.prompt_cache_dir).expanduser()
        disk = DiskTier(directory, args.prompt_cache_disk_bytes, identity_of(args.model))
        try:
            disk.start()
        except OSError as e:  # the cache is an optimisation: serve without it
            log.warning("prompt cache on disk: off (%s: %s)", directory, e)
            disk = None
    return PromptCache(args.prompt_cache_bytes, disk=disk)


def warm(cache: PromptCache, count: int) -> None:
    """Load each partition's latest system prompts from disk (after the model has loaded,
    before the ready line: the first turn after a restart finds them in memory)."""
    if cache.disk is None or not count:
        return
    started = time.monotonic()
    loaded = cache.warm(count)
    log.info(
        "prompt cache: %d system prompt(s) warmed from disk in %.2fs",
        loaded,
        time.monotonic() - started,
    )


def build_engine(args: argparse.Namespace) -> Engine:
    if args.group_parallel is not None:
        return group_engine(args, spec_settings(args))
    load = loader(args)
    if args.mode == "speculative":
        return SpeculativeEngine(load, spec_settings(args), prompt_cache=prompt_cache(args))
    return BatchingEngine(
        load,
        args.max_batch_size,
        prompt_cache_bytes=args.prompt_cache_bytes,
        prefill_step_size=args.prefill_step_size,
        chunk_seconds=args.prefill_chunk_seconds,
        drafts=batch_drafts(spec_settings(args)),
        prompt_cache=prompt_cache(args),
    )


def build_shared(args: argparse.Namespace) -> SharedEngine:
    import mlx.core as mx

    if args.group_parallel is not None:  # both lanes over a group: one thread takes turns
        log.info("shared mode over a group: 1 generation thread (one op log for both lanes)")
        return group_shared_engine(args, spec_settings(args))

    choice = args.shared_threads
    on_cpu = mx.default_device() == mx.Device(mx.cpu)
    threads = threads_for(choice, os.cpu_count(), on_cpu, os.environ.get("OPENBLAS_NUM_THREADS"))
    log.info("shared mode: %d generation thread(s) (--shared-threads %s)", threads, choice)
    return SharedEngine(
        loader(args),
        spec_settings(args),
        args.max_batch_size,
        prompt_cache=prompt_cache(args),
        prompt_cache_bytes=args.prompt_cache_bytes,
        prefill_step_size=args.prefill_step_size,
        chunk_seconds=args.prefill_chunk_seconds,
        threads=threads,
    )


def loader(args: argparse.Namespace) -> Callable[[], Models]:
    """Loads the model, and the draft where the speculative lane runs: once per process."""
    draft = args.draft_model if serves_speculative(args.mode) else None

    def load() -> Models:
        from mlx_lm import load as mlx_load

        # load() returns (model, tokenizer), or also the config when asked for it.
        model, tokenizer = mlx_load(str(model_dir(args.model)))[:2]
        draft_model = None
        if draft is not None:
            draft_model, draft_tokenizer = mlx_load(str(model_dir(draft)))[:2]
            if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
                raise LoadError(f"{draft}: the draft model's vocabulary differs from the target's")
        return Models(model, tokenizer, draft_model)

    return load


def spec_settings(args: argparse.Namespace) -> SpeculativeConfig:
    return SpeculativeConfig(
        draft_source=args.draft_source,
        num_draft_tokens=args.num_draft_tokens,
        lookup=LookupConfig(args.lookup_ngram_min, args.lookup_ngram_max, args.lookup_max_draft),
        prediction=PredictionConfig(max_draft=args.prediction_max_draft),
        prompt_cache_bytes=args.prompt_cache_bytes,
        suffix=SuffixConfig(max_draft=args.suffix_max_draft, max_bytes=args.suffix_bytes),
        draft_position_cost=args.draft_position_cost,
    )


def model_dir(path: Path) -> Path:
    """A local mlx-lm model directory (mlx_lm.load would take anything else for a hub repo id)."""
    if not (path / "config.json").is_file():
        raise LoadError(f"{path}: not a model directory (no config.json)")
    return path


def worker_info(args: argparse.Namespace, models: Models, lane: str | None = None) -> WorkerInfo:
    """What a lane serves: the process's own mode, or in shared mode ``lane``'s."""
    mode = lane or args.mode
    source, k = default_draft_source(args, models, mode)
    config = getattr(models.model, "args", None)
    has_draft = models.draft is not None and mode == "speculative"
    return WorkerInfo(
        mode=mode,
        model_name=args.model_name or _dir_name(args.model),
        draft_name=_dir_name(args.draft_model) if has_draft else None,
        num_draft_tokens=k,
        context_length=getattr(config, "max_position_embeddings", None),
        draft_source=source,
        vocab_size=vocabulary_size(models),
        max_token_chars=longest_token(models.tokenizer),
        content_specials_as_text=args.content_special_tokens == "text",
        architecture=getattr(config, "model_type", None),
    )


def longest_token(tokenizer: Any) -> int | None:
    """The most characters one token's text spells: a token's vocabulary string is at least
    as long as the text it decodes to (byte-level BPE spells a byte a character,
    SentencePiece a space as one, a byte fallback as six)."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else None
    return max((len(t) for t in vocab), default=None) if vocab else None


def vocabulary_size(models: Models) -> int:
    """The token ids a request may name: both the tokenizer and the model's logits (and the
    draft's, which reads the same ids) must have them."""
    sizes = [len(models.tokenizer)]
    for model in (models.model, models.draft):
        size = getattr(getattr(model, "args", None), "vocab_size", None)
        if isinstance(size, int) and size > 0:
            sizes.append(size)
    return min(sizes)


def default_draft_source(
    args: argparse.Namespace, models: Models, mode: str | None = None
) -> tuple[str | None, int]:
    """The draft source of requests without a prediction, and its k (None, 0: no drafting)."""
    if (mode or args.mode) != "speculative":
        return None, 0
    if args.draft_source == "auto":  # chosen at every step among all the lane has
        most = max(args.lookup_max_draft, args.suffix_max_draft)
        if models.draft is not None and args.num_draft_tokens:
            most = max(most, args.num_draft_tokens)
        return "auto", most
    if args.draft_source == "draft_model" and models.draft is not None and args.num_draft_tokens:
        return "draft_model", args.num_draft_tokens
    if args.draft_source == "prompt_lookup":
        return "prompt_lookup", args.lookup_max_draft
    if args.draft_source == "suffix":
        return "suffix", args.suffix_max_draft
    return None, 0


def _dir_name(path: Path) -> str:
    return path.name or path.resolve().name  # "." has no name of its own


async def serve(
    args: argparse.Namespace,
    engine: Engine | SharedEngine,
    app: web.Application,
    out: TextIO,
    *,
    lanes: list[str] | None = None,
) -> int:
    """Serve ``app`` until told to stop; ``lanes``: shared mode's lanes (in the ready line)."""
    try:
        runner, port = await start_site(app, args.host, args.port)
    except OSError as e:
        print(f"speclane worker: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    model_name = args.model_name or _dir_name(args.model)
    facts: dict[str, object] = {"lanes": lanes} if lanes else {}
    out.write(ready_line(port, mode=args.mode, model=model_name, **facts))
    out.flush()
    log.info("serving %s (%s) on %s:%d", model_name, args.mode, args.host, port)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = None
    if args.parent_pid is not None:
        watcher = asyncio.create_task(watch_parent(args.parent_pid, args.first_ppid, stop))
    await stop.wait()

    log.info("shutting down")
    for site in list(runner.sites):
        await site.stop()  # stop accepting first
    await asyncio.to_thread(engine.stop, SHUTDOWN_SECONDS)
    cache = engine_cache(engine)
    if cache is not None and cache.disk is not None:  # what is queued reaches the disk
        await asyncio.to_thread(cache.disk.close, SHUTDOWN_SECONDS)
    if watcher is not None:
        watcher.cancel()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(runner.cleanup(), SHUTDOWN_SECONDS)
    return 0


def die_with_parent(parent_pid: int, first_ppid: int) -> None:
    """On Linux, ask the kernel to SIGTERM us when the parent dies (the poll covers other OSes)."""
    if not parent_alive(parent_pid, first_ppid):
        os._exit(0)  # it died before we could watch it
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def parent_alive(parent_pid: int, first_ppid: int) -> bool:
    if os.getppid() != first_ppid:
        return False  # re-parented: our parent (the router, or a shell it used) is gone
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def watch_parent(parent_pid: int, first_ppid: int, stop: asyncio.Event) -> None:
    while parent_alive(parent_pid, first_ppid):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PARENT_POLL_SECONDS)
            return  # stopping for another reason
    log.warning("parent process %d is gone; exiting", parent_pid)
    stop.set()
