"""The names of mlx-lm the worker relies on that are not its public API.

mlx-lm has no public hook for a verify step inside its batch generator, so
``router.worker.engines.batchverify`` subclasses ``GenerationBatch`` (the decoding sequences of a
``BatchGenerator``) and reads and writes its per-row state, puts its subclass in the
generator's slot, and shifts rows of a ``BatchKVCache`` by its write position; the
pair check (``router.lanes.gating.inspect``) reads mlx-lm's model-type tables; the prompt
cache's segment entries (``router.worker.engines.promptcache``) subclass ``LRUPromptCache``.
``pyproject.toml`` pins the mlx-lm versions this was tested with, and
``tests/worker/test_mlx_private.py`` fails when a release moves one of these names (or when
the worker starts relying on a private name not listed here).

A leaf: the names are written as text, so that reading them imports neither mlx nor mlx-lm.
"""

from __future__ import annotations

# A class (module.Class) -> the private attributes read or written on its instances; a module
# -> the names read from it.
MLX_LM_PRIVATE_NAMES: dict[str, tuple[str, ...]] = {
    # The generator's decoding batch, which ``drafting_generator`` replaces with its subclass;
    # the uid its next insert gives (a group's rank 0 names it to the other ranks).
    "mlx_lm.generate.BatchGenerator": ("_generation_batch", "_uid_count"),
    # Per row: the pending token and its logprobs (sampled, not yet emitted nor cached), the
    # tokens emitted before them, the count emitted, the stop matcher, and the processors'
    # context of tokens; a verify step advances each of them by the run a row accepted.
    "mlx_lm.generate.GenerationBatch": (
        "_next_tokens",
        "_next_logprobs",
        "_current_tokens",
        "_current_logprobs",
        "_num_tokens",
        "_matchers",
        "_token_context",
    ),
    # The cache's write position (the end of every row's span).
    "mlx_lm.models.cache.BatchKVCache": ("_idx",),
    # The prompt cache's segment entries (``router.worker.engines.promptcache``): its subclass
    # of the LRU keeps a segment entry under a longer one, walking the trie and putting the
    # entry back in the order and the byte counts; /health counts the system entries.
    "mlx_lm.models.cache.LRUPromptCache": ("_trie", "_lru", "_n_bytes", "_n_bytes_by_type"),
    "mlx_lm.models.cache.LRUPromptCache.CacheOrder": ("_lrus",),
    "mlx_lm.models.cache.PromptTrie": ("_trie",),
    # Module tables, not documented: how mlx-lm maps a config's model_type to its module
    # (``router.lanes.gating.inspect`` reads them with a default, so a move would go unseen).
    "mlx_lm.utils": ("MODEL_REMAPPING", "MODEL_ARCHITECTURE_REMAPPING"),
    # mlx's (not mlx-lm's): the module behind the mlx.launch console script, which a group's
    # launcher runs in-process (``router.worker.group.launch``), and the class whose
    # ``make_launch_script`` (a rank's shell script) it wraps.
    "mlx._distributed_utils.launch": ("main", "RemoteProcess"),
}
