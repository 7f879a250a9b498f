"""A lane's prompt cache: mlx-lm's ``LRUPromptCache`` plus the figures the lane reports.

The KV cache of a finished (or cancelled) sequence is kept under the tokens it holds; a new
prompt starts from the nearest entry: an exact match, a shorter entry that is a prefix of
the prompt, or a longer one that shares a prefix and is trimmed back to it (mlx-lm's own
lookup, ``LRUPromptCache.fetch_nearest_cache``). Entries are evicted least recently used
first once the total exceeds ``max_bytes``. This is what ``mlx_lm.server`` does, so an agent
resending a long system prompt and the conversation so far prefills only the new turn.

Entries are partitioned (the request's ``partition``, which the router derives from the
client's policy): a lookup only ever sees entries stored under its own partition, so neither
``cached_tokens`` nor the time to the first token tells one client what another has sent.
Partitions share the byte bound fairly: each has its own ``LRUPromptCache`` and, when
their total is over ``max_bytes``, the partition holding the most bytes gives up its least
recently used entries first. A client that floods the cache evicts its own entries, not
another client's system prompt (which is smaller); alone, a partition has the whole bound.

One instance per worker process: in shared mode (``router.worker.engines.shared``) both lanes fetch
from and store into the same cache (one byte budget), so a prefix cached through one lane is
found by the other. Each lane counts its own lookups (``Counters``); the entries are common.
A speculative lane also keeps its draft model's KV state here, under the ``DRAFT`` key: the
two models' caches never mix.

Thread-safe: in shared mode with two generation threads (``router.worker.engines.shared``) both use
it at once. A lock guards the entries; an entry is evaluated before it is stored (a lazy array
made on one thread cannot be evaluated on another) and only ever copied out, never changed in
place. ``stats()`` is read from the event loop (plain ints).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_ENTRIES = 64  # LRUPromptCache also bounds the count; bytes are the real bound here
TARGET = "target"  # LRUPromptCache's per-model key: the served model's KV state
DRAFT = "draft"  # the speculative lane's draft model's KV state
DEFAULT_PARTITION = ""  # requests that name no partition share this one


def entry_key(namespace: str, partition: str) -> tuple[str, str]:
    """The key LRUPromptCache files entries under (it searches one key's trie at a time):
    ``namespace`` keeps two models' caches apart, ``partition`` two clients'."""
    return (namespace, partition)


@dataclass(frozen=True)
class Lookup:
    """What a prompt starts from: a copy of a cached KV state (or None) and what remains."""

    cache: list[Any] | None
    cached_tokens: int  # prompt tokens the cache already holds
    rest: list[int]  # prompt tokens still to prefill (never empty)


@dataclass
class Counters:
    """One lane's lookups of the target's cache (a draft model's lookups are not counted)."""

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0  # prompt tokens taken from the cache
    prefilled_tokens: int = 0  # prompt tokens that had to be computed

    def count(self, cached: int, rest: int) -> None:
        self.lookups += 1
        self.hits += cached > 0
        self.reused_tokens += cached
        self.prefilled_tokens += rest


class PromptCache:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._parts: dict[str, Any] = {}  # partition -> its LRUPromptCache
        self.counters = Counters()  # every lane's lookups

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def nbytes(self) -> int:
        return sum(int(lru.nbytes) for lru in self._parts.values())

    def fetch(
        self,
        prompt: Sequence[int],
        partition: str = DEFAULT_PARTITION,
        *,
        model: str = TARGET,
        counters: Counters | None = None,
    ) -> Lookup:
        """The nearest cached state of ``model`` for ``prompt`` in ``partition`` (never another
        partition's); ``counters``: the lane's own figures, counted besides the cache's
        (target lookups only)."""
        tokens = list(prompt)
        cache, rest = None, tokens
        if (lru := self._parts.get(partition)) is not None:
            key = entry_key(model, partition)
            with self._lock:  # the entry comes out as a copy: this thread's own to change
                cache, rest = lru.fetch_nearest_cache(key, tokens)
            rest = list(rest)
            if cache is not None and not rest:
                # An exact match: generation needs the last prompt token as its input, so
                # step the cache back by one token (or start over if it cannot be trimmed).
                cache, rest = _back_one(cache, tokens)
        cached = len(tokens) - len(rest)
        if model == TARGET:
            for counted in {id(c): c for c in (self.counters, counters) if c}.values():
                counted.count(cached, len(rest))
        return Lookup(cache if cached else None, cached, rest)

    def store(
        self,
        tokens: Sequence[int],
        cache: list[Any] | None,
        partition: str = DEFAULT_PARTITION,
        *,
        model: str = TARGET,
    ) -> None:
        """Keep ``cache``, the KV state of exactly ``tokens`` for ``model``, for requests of
        ``partition``."""
        if not self.max_bytes or not cache or not tokens:
            return
        _evaluate(cache)
        with self._lock:
            lru = self._parts.get(partition)
            if lru is None:
                from mlx_lm.models.cache import LRUPromptCache

                lru = self._parts[partition] = LRUPromptCache(MAX_ENTRIES, self.max_bytes)
            lru.insert_cache(entry_key(model, partition), list(tokens), cache)
            self._fair_share()

    def _fair_share(self) -> None:
        """Bring the total under ``max_bytes``, taking from the largest partition first
        (its least recently used entries), down to the next largest one's size."""
        while (excess := self.nbytes - self.max_bytes) > 0:
            sizes = sorted((int(lru.nbytes), name) for name, lru in self._parts.items())
            largest, name = sizes[-1]
            runner_up = sizes[-2][0] if len(sizes) > 1 else 0
            target = max(largest - excess, runner_up)
            if target >= largest:  # a tie at the top: this one gives up an entry at least
                target = largest - 1
            self._parts[name].trim_to(n_bytes=target)
            if not len(self._parts[name]):
                del self._parts[name]

    def stats(self, counters: Counters | None = None) -> dict[str, int]:
        """The cache's figures; with ``counters``, the lookups are that lane's."""
        counted = counters or self.counters
        parts = list(self._parts.values())  # one C call: no lock held by the event loop
        return {
            "max_bytes": self.max_bytes,
            "bytes": sum(int(lru.nbytes) for lru in parts),
            "entries": sum(len(lru) for lru in parts),
            "partitions": len(parts),
            "lookups": counted.lookups,
            "hits": counted.hits,
            "reused_tokens": counted.reused_tokens,
            "prefilled_tokens": counted.prefilled_tokens,
        }


def _evaluate(cache: list[Any]) -> None:
    """Evaluate a KV state's arrays on this thread (a batch's extracted state is lazy), so
    that any thread may fetch it."""
    import mlx.core as mx

    mx.eval([c.state for c in cache], [vars(c) for c in cache])


def _back_one(cache: list[Any], tokens: list[int]) -> tuple[list[Any] | None, list[int]]:
    from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

    if len(tokens) > 1 and can_trim_prompt_cache(cache):
        trim_prompt_cache(cache, 1)
        return cache, tokens[-1:]
    return None, tokens
