"""Starting a rank of a group (``python -m router.worker --group-parallel ...`` under
``mlx.launch``): rank 0 becomes the lane's worker with a ``GroupSpecEngine`` (``--mode
shared``: both lanes' worker, ``GroupSharedEngine``); every other rank loads its shard and
follows rank 0's messages until told to stop.

A follower keeps the default SIGTERM/SIGINT action (it spends its life inside a collective,
where a Python handler would never run): ``mlx.launch`` and the supervisor end it at once.
It exits 0 only when rank 0 told it to stop; on a broken group it exits 1, and mlx.launch
then ends every other rank.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from router.kernel.errors import LoadError
from router.kernel.worker_contract import SHARED_MODE
from router.worker.engines.engine import Models
from router.worker.engines.promptcache import PromptCache
from router.worker.engines.speculative import SpeculativeConfig
from router.worker.group.batchgen import SyncModel, generator_options, group_generator
from router.worker.group.batchmirror import BatchMirror, mirror_batch_class
from router.worker.group.both import GroupSharedEngine
from router.worker.group.channel import MxChannel
from router.worker.group.leader import GroupFacts, GroupSpecEngine
from router.worker.group.mirror import Mirror, follow
from router.worker.group.shard import MlxShard, load_shard

log = logging.getLogger("speclane.worker.group")


def rank() -> int:
    import mlx.core as mx

    return int(mx.distributed.init().rank())


def run_follower(
    args: argparse.Namespace,
    watch_parent: Callable[[int, int], None],
    leave: Callable[[int], NoReturn],
) -> NoReturn:
    """Ranks > 0: load the shard, follow rank 0, exit (``leave``) with the outcome."""
    import mlx.core as mx

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    # Its own launcher (mlx.launch here, an ssh session elsewhere), not the router: the
    # router's pid means nothing on another host.
    watch_parent(args.first_ppid, args.first_ppid)
    group = mx.distributed.init()
    try:
        model, tokenizer = load_shard(_model_dir(args.model), args.group_parallel, group)
    except LoadError as e:
        print(
            f"speclane worker rank {group.rank()}: cannot load the model: {e}",
            file=sys.stderr,
            flush=True,
        )
        leave(1)
    log.info("rank %d of %d: shard loaded, following rank 0", group.rank(), group.size())
    launcher = args.first_ppid
    channel = MxChannel(group)
    prompt_cache = PromptCache(args.prompt_cache_bytes)
    batch = None
    if args.mode == SHARED_MODE:  # rank 0 serves the batching lane too
        batch = BatchMirror(
            lambda: mirror_generator(model, tokenizer, args, channel), prompt_cache, channel
        )
    mirror = Mirror(
        MlxShard(model),
        prompt_cache,
        channel,
        alive=lambda: os.getppid() == launcher,
        batch=batch,
    )
    try:
        code = follow(mirror)
    except Exception:
        log.exception("rank %d: the group broke", group.rank())
        code = 1
    leave(code)


def mirror_generator(model: Any, tokenizer: Any, args: argparse.Namespace, channel: Any) -> Any:
    """A follower's batch generator: rank 0's options, its decoding batch a ``MirrorBatch``."""
    options = generator_options(
        args.max_batch_size, list(tokenizer.eos_token_ids), args.prefill_step_size
    )
    whole = SyncModel(model, args.group_parallel == "pipeline")
    generator = group_generator(whole, mirror_batch_class(), None, **options)
    generator._generation_batch.channel = channel
    return generator


def group_loader(args: argparse.Namespace, group: Any) -> Callable[[], Models]:
    """Rank 0's loader: its shard of the target (loaded with the others), the draft whole."""
    model_path = _model_dir(args.model)
    draft_path = args.draft_model

    def load() -> Models:
        from mlx_lm import load as mlx_load

        model, tokenizer = load_shard(model_path, args.group_parallel, group)
        draft = None
        if draft_path is not None:
            draft, draft_tokenizer = mlx_load(str(_model_dir(draft_path)))[:2]
            if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
                raise LoadError(
                    f"{draft_path}: the draft model's vocabulary differs from the target's"
                )
        return Models(model, tokenizer, draft)

    return load


def group_facts(args: argparse.Namespace) -> GroupFacts:
    hosts = tuple(h for h in (args.group_hosts or "").split(",") if h)
    return GroupFacts(hosts, args.group_backend, args.group_parallel)


def group_engine(args: argparse.Namespace, settings: SpeculativeConfig) -> GroupSpecEngine:
    """Rank 0's engine of the speculative lane alone."""
    import mlx.core as mx

    group = mx.distributed.init()
    return GroupSpecEngine(group_loader(args, group), settings, MxChannel(group), group_facts(args))


def group_shared_engine(args: argparse.Namespace, settings: SpeculativeConfig) -> GroupSharedEngine:
    """Rank 0's engine serving both lanes (``--mode shared``) on one copy of the target."""
    import mlx.core as mx

    group = mx.distributed.init()
    return GroupSharedEngine(
        group_loader(args, group),
        settings,
        args.max_batch_size,
        channel=MxChannel(group),
        facts=group_facts(args),
        prompt_cache_bytes=args.prompt_cache_bytes,
        prefill_step_size=args.prefill_step_size,
        chunk_seconds=args.prefill_chunk_seconds,
    )


def _model_dir(path: Path) -> Path:
    if not (Path(path) / "config.json").is_file():
        raise LoadError(f"{path}: not a model directory (no config.json)")
    return Path(path)
