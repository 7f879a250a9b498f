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
(Partitions still share the byte bound: one client's traffic can evict another's entries,
which says how much it sends, never what.)

Used only from the generation thread; ``stats()`` is read from the event loop (plain ints).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_ENTRIES = 64  # LRUPromptCache also bounds the count; bytes are the real bound here
_MODEL_KEY = "lane"  # one model per worker: the cache's per-model key is a constant
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


class PromptCache:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._lru: Any = None
        if max_bytes:
            from mlx_lm.models.cache import LRUPromptCache

            self._lru = LRUPromptCache(max_size=MAX_ENTRIES, max_bytes=max_bytes)
        self.lookups = 0
        self.hits = 0
        self.reused_tokens = 0  # prompt tokens taken from the cache
        self.prefilled_tokens = 0  # prompt tokens that had to be computed

    @property
    def enabled(self) -> bool:
        return self._lru is not None

    def fetch(self, prompt: Sequence[int], partition: str = DEFAULT_PARTITION) -> Lookup:
        """The nearest entry of ``partition`` (never another partition's)."""
        tokens = list(prompt)
        cache, rest = None, tokens
        if self._lru is not None:
            key = entry_key(_MODEL_KEY, partition)
            cache, rest = self._lru.fetch_nearest_cache(key, tokens)
            rest = list(rest)
            if cache is not None and not rest:
                # An exact match: generation needs the last prompt token as its input, so
                # step the cache back by one token (or start over if it cannot be trimmed).
                cache, rest = _back_one(cache, tokens)
        cached = len(tokens) - len(rest)
        self.lookups += 1
        self.hits += cached > 0
        self.reused_tokens += cached
        self.prefilled_tokens += len(rest)
        return Lookup(cache if cached else None, cached, rest)

    def store(self, tokens: Sequence[int], cache: list[Any] | None,
              partition: str = DEFAULT_PARTITION) -> None:
        """Keep ``cache``, the KV state of exactly ``tokens``, for requests of ``partition``."""
        if self._lru is None or not cache or not tokens:
            return
        self._lru.insert_cache(entry_key(_MODEL_KEY, partition), list(tokens), cache)

    def stats(self) -> dict[str, int]:
        lru = self._lru
        return {
            "max_bytes": self.max_bytes,
            "bytes": int(lru.nbytes) if lru is not None else 0,
            "entries": len(lru) if lru is not None else 0,
            "lookups": self.lookups,
            "hits": self.hits,
            "reused_tokens": self.reused_tokens,
            "prefilled_tokens": self.prefilled_tokens,
        }


def _back_one(cache: list[Any], tokens: list[int]) -> tuple[list[Any] | None, list[int]]:
    from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

    if len(tokens) > 1 and can_trim_prompt_cache(cache):
        trim_prompt_cache(cache, 1)
        return cache, tokens[-1:]
    return None, tokens
