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

Segment entries (as ``mlx_lm.server`` saves them): besides the whole sequence, a request may
name ``segments``, token positions of its prompt where a part of it ends (the system prompt
and tools: ``SYSTEM``); each is stored as an entry of its own, a compact copy of the KV state
up to there. A new conversation, a compaction or a sub-agent of the same client then starts
from its system prompt even once the conversations that held it are evicted: eviction takes
whole-sequence entries first (mlx-lm's order: assistant, user, system), and a longer entry
stored later never drops a segment entry that is its prefix (mlx-lm drops every prefix of a
trimmable entry, which would undo the segment). Only plain ``KVCache`` layers can be copied
back to a position; a model with other caches (rotating, hybrid) keeps whole entries only.

A disk tier (``router.worker.engines.diskcache``) may back the target's entries: every entry
stored is also written to disk (only the blocks of it the disk does not hold yet, cut at its
segments' ends), and a lookup that memory misses (or hits with a prefix at
least ``MIN_DISK_GAIN`` tokens shorter) loads the disk's entry for the prompt into memory
first; ``warm`` loads each partition's latest system prompts at start.

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
from typing import TYPE_CHECKING, Any

from router.worker.engines.entrykinds import SEGMENT_KINDS, SEQUENCE, SYSTEM

if TYPE_CHECKING:  # the disk tier imports the entry kinds, not this module
    from router.worker.engines.diskcache import DiskTier

MAX_ENTRIES = 64  # LRUPromptCache also bounds the count; bytes are the real bound here
TARGET = "target"  # LRUPromptCache's per-model key: the served model's KV state
DRAFT = "draft"  # the speculative lane's draft model's KV state
DEFAULT_PARTITION = ""  # requests that name no partition share this one
MIN_SEGMENT = 16  # a segment shorter than this is not worth an entry of its own
MIN_DISK_GAIN = 32  # tokens a disk entry must add to memory's match to be worth reading


@dataclass(frozen=True)
class Segment:
    """A point of a prompt worth an entry of its own: its first ``end`` tokens."""

    end: int
    kind: str = SYSTEM

    def __post_init__(self) -> None:
        if self.kind not in SEGMENT_KINDS:
            raise ValueError(f"segment kind must be one of {', '.join(SEGMENT_KINDS)}")


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
    def __init__(self, max_bytes: int, disk: DiskTier | None = None) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._parts: dict[str, Any] = {}  # partition -> its LRUPromptCache
        self.counters = Counters()  # every lane's lookups
        # The disk tier (router.worker.engines.diskcache): the target's entries only, and
        # only with a memory cache to load them into.
        self.disk = disk if max_bytes else None

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
        cache, rest = self._nearest(tokens, partition, model)
        disk = self.disk is not None and model == TARGET and len(rest) > MIN_DISK_GAIN
        if disk and self._from_disk(tokens, partition, rest):
            cache, rest = self._nearest(tokens, partition, model)
        if cache is not None and not rest:
            # An exact match: generation needs the last prompt token as its input, so step
            # the cache back by one token (or start over if it cannot be trimmed).
            cache, rest = _back_one(cache, tokens)
        cached = len(tokens) - len(rest)
        if model == TARGET:
            for counted in {id(c): c for c in (self.counters, counters) if c}.values():
                counted.count(cached, len(rest))
        return Lookup(cache if cached else None, cached, rest)

    def _nearest(self, tokens: list[int], partition: str, model: str) -> tuple[Any, list[int]]:
        """Memory's nearest entry: a copy of its KV state (or None) and the tokens left."""
        if (lru := self._parts.get(partition)) is None:
            return None, tokens
        with self._lock:  # the entry comes out as a copy: this thread's own to change
            cache, rest = lru.fetch_nearest_cache(entry_key(model, partition), tokens)
        return cache, list(rest)

    def _from_disk(self, tokens: list[int], partition: str, rest: list[int]) -> bool:
        """Load the disk tier's entry for ``tokens`` into memory if it holds at least
        ``MIN_DISK_GAIN`` more of them than memory does (``rest``: what memory leaves)."""
        assert self.disk is not None
        found = self.disk.find(partition, tokens)
        if found is None:
            return False
        entry, shared = found
        if min(shared, len(tokens) - 1) < len(tokens) - len(rest) + MIN_DISK_GAIN:
            return False
        cache = self.disk.load(partition, entry)
        if cache is None:
            return False
        with self._lock:
            key = entry_key(TARGET, partition)
            self._insert(partition, key, entry.token_list(), cache, entry.kind)
            self._fair_share()
        return True

    def warm(self, per_partition: int) -> int:
        """Load each partition's ``per_partition`` most recently used system prompts from
        the disk tier into memory (at start: the first turn after a restart does not wait
        for its prefill), most recent first, up to half the memory bound; the entries
        loaded."""
        if self.disk is None or per_partition <= 0:
            return 0
        loaded = 0
        for entry in self.disk.recent(per_partition, SYSTEM):
            if self.nbytes >= self.max_bytes // 2:  # room left for the requests' own entries
                break
            cache = self.disk.load(entry.owner, entry)
            if cache is None:
                continue
            with self._lock:
                key = entry_key(TARGET, entry.owner)
                self._insert(entry.owner, key, entry.token_list(), cache, SYSTEM)
                self._fair_share()
            loaded += 1
        return loaded

    def store(
        self,
        tokens: Sequence[int],
        cache: list[Any] | None,
        partition: str = DEFAULT_PARTITION,
        *,
        model: str = TARGET,
        segments: Sequence[Segment] = (),
    ) -> None:
        """Keep ``cache``, the KV state of exactly ``tokens`` for ``model``, for requests of
        ``partition``; and each of ``segments`` (prompt positions within ``tokens``) as an
        entry of its own."""
        if not self.max_bytes or not cache or not tokens:
            return
        tokens = list(tokens)
        _evaluate(cache)
        parts = [(s.kind, s.end, head(cache, s.end)) for s in segments if _worth(s, tokens)]
        with self._lock:
            key = entry_key(model, partition)
            self._insert(partition, key, tokens, cache, SEQUENCE)
            for kind, end, copy in parts:
                if copy is not None:
                    self._insert(partition, key, tokens[:end], copy, kind)
            self._fair_share()
        if self.disk is not None and model == TARGET:  # written by the disk tier's thread
            cuts = [(s.end, s.kind) for s in segments if _worth(s, tokens)]
            self.disk.put(partition, tokens, cache, cuts)

    def _insert(self, partition: str, key: Any, tokens: list[int], cache: Any, kind: str) -> None:
        lru = self._parts.get(partition)
        if lru is None:
            lru = self._parts[partition] = _segment_lru()(MAX_ENTRIES, self.max_bytes)
        lru.insert_cache(key, tokens, cache, cache_type=kind)

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

    def stats(self, counters: Counters | None = None) -> dict[str, object]:
        """The cache's figures; with ``counters``, the lookups are that lane's."""
        counted = counters or self.counters
        parts = list(self._parts.values())  # one C call: no lock held by the event loop
        disk = {"disk": self.disk.stats()} if self.disk is not None else {}
        return {
            "max_bytes": self.max_bytes,
            "bytes": sum(int(lru.nbytes) for lru in parts),
            "entries": sum(len(lru) for lru in parts),
            "system_entries": sum(len(lru._lru._lrus[SYSTEM]) for lru in parts),
            "partitions": len(parts),
            "lookups": counted.lookups,
            "hits": counted.hits,
            "reused_tokens": counted.reused_tokens,
            "prefilled_tokens": counted.prefilled_tokens,
            **disk,
        }


def _worth(segment: Segment, tokens: list[int]) -> bool:
    return MIN_SEGMENT <= segment.end < len(tokens)


def head(cache: list[Any], n: int) -> list[Any] | None:
    """A compact, evaluated copy of ``cache``'s first ``n`` positions (None: a layer is not a
    plain ``KVCache``, or holds fewer)."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    if not all(type(c) is KVCache and c.keys is not None and c.offset >= n for c in cache):
        return None
    out = []
    for c in cache:
        copy = KVCache()
        copy.keys = mx.contiguous(c.keys[..., :n, :])
        copy.values = mx.contiguous(c.values[..., :n, :])
        copy.offset = n
        out.append(copy)
    mx.eval([(c.keys, c.values) for c in out])
    return out


_LRU: Any = None


def _segment_lru() -> Any:
    """mlx-lm's ``LRUPromptCache`` that keeps segment entries under a longer entry (made once:
    mlx-lm is imported only where a model runs)."""
    global _LRU
    if _LRU is not None:
        return _LRU
    from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache

    class SegmentLRU(LRUPromptCache):
        def insert_cache(
            self,
            model: Any,
            tokens: list[int],
            prompt_cache: list[Any],
            *,
            cache_type: str = SEQUENCE,
        ) -> None:
            # mlx-lm drops every prefix entry of a trimmable one (the longer entry, trimmed,
            # holds it); a segment entry stays, as it outlives the sequences holding it.
            kept = []
            if can_trim_prompt_cache(prompt_cache):
                kept = self._segments_under(model, tokens)
            for prefix, entry in kept:
                self._trie.pop(model, prefix)
                self._lru.remove(model, prefix)
                self._n_bytes -= entry.nbytes
                self._n_bytes_by_type[entry.cache_type] -= entry.nbytes
            super().insert_cache(model, tokens, prompt_cache, cache_type=cache_type)
            for prefix, entry in kept:  # back in, as most recently used
                self._trie.add(model, prefix, entry)
                self._lru.push(model, prefix, entry.cache_type)
                self._n_bytes += entry.nbytes
                self._n_bytes_by_type[entry.cache_type] += entry.nbytes

        def _segments_under(self, model: Any, tokens: list[int]) -> list[tuple[list[int], Any]]:
            node = self._trie._trie.get(model)
            found = []  # strict prefixes of ``tokens`` holding a segment entry
            for i, tok in enumerate(tokens):
                if node is None:
                    break
                entry = node.get("__value__")
                if entry is not None and entry.cache_type in SEGMENT_KINDS:
                    found.append((tokens[:i], entry))
                node = node.get(tok)
            return found

    _LRU = SegmentLRU
    return _LRU


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
