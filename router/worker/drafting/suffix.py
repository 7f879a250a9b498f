"""The ``suffix`` draft source: drafts from earlier requests' prompts and answers (pure).

After SuffixDecoding (arXiv 2411.04975, vLLM's ``suffix`` method) and llama.cpp's shared
n-gram pool (``ngram-mod``): agent loops repeat themselves across requests (the same tool call
shape every turn, a file re-emitted after a small change, a retried prompt), so the tokens that
followed the sequence's latest n-gram in an earlier request are a good draft.

- ``SuffixIndex``: n-gram tables over finished requests (prompt and output, one entry each),
  one table per **partition** (the client's prompt-cache partition): a lookup only ever sees
  its own partition's entries, so one client's text never drafts another's answer and the
  acceptance rate says nothing about what another client sent. Bounded in bytes, shared
  fairly as the prompt cache's bound is (``router.worker.engines.promptcache``): past the bound, the
  partition holding the most bytes gives up its least recently used (inserted or drafted
  from) entries first, so a client that floods the lane evicts its own entries, not another
  client's smaller working set; alone, a partition has the whole bound.
- ``SuffixDraft``: one request's proposer. Its own prompt and output so far are indexed too
  (as ``router.worker.drafting.drafts.PromptLookup`` does), and the longer match of the two
  wins (the current context on a tie: it is what is being copied right now). The draft is at most
  ``spec_factor`` times as long as the match (SuffixDecoding's adaptive length, vLLM's
  ``suffix_decoding_max_spec_factor``): a long match drafts far, a short one after a
  divergence risks little.

Keys are the hashes of the n-grams (a Python int each, far smaller than a tuple): a collision
only makes a wrong draft, which verification rejects like any other.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

# Accounted bytes, conservative for CPython 3.11 on 64 bits: a token in an entry's list (a
# pointer and an int object), and an n-gram in a table (an int key, an int value, the dict
# slot and index with the table's growth headroom).
TOKEN_BYTES = 40
NGRAM_BYTES = 120
ENTRY_BYTES = 200
_END_BITS = 32  # a table value packs (entry id, end) in one int


@dataclass(frozen=True)
class SuffixConfig:
    ngrams: tuple[int, ...] = (3, 4, 6, 8, 12, 16)  # sizes matched, the longest first
    max_draft: int = 16
    spec_factor: float = 1.0  # the draft is at most this many times the match's length
    max_bytes: int = 64 << 20  # the whole index, all partitions; 0: nothing is kept
    max_entry_tokens: int = 8192  # an entry keeps the last this many tokens of a request

    def __post_init__(self) -> None:
        if not self.ngrams or min(self.ngrams) < 1:
            raise ValueError("n-gram sizes must be at least 1")
        if self.max_draft < 1 or not self.spec_factor > 0:
            raise ValueError("the maximum draft length must be at least 1, spec_factor > 0")
        if self.max_bytes < 0 or self.max_entry_tokens < 2:
            raise ValueError("max_bytes must be >= 0 and max_entry_tokens >= 2")

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.ngrams), reverse=True))


def entry_cost(tokens: int, sizes: int) -> int:
    return ENTRY_BYTES + tokens * (TOKEN_BYTES + sizes * NGRAM_BYTES)


def _key(tokens: Sequence[int], end: int, n: int) -> int:
    return hash((n, *tokens[end - n : end]))


def _ngrams(
    tokens: Sequence[int], sizes: tuple[int, ...], first_end: int = 1
) -> Iterator[tuple[int, int]]:
    """(key, end) of every n-gram ending before the last token (it needs a continuation)."""
    for end in range(max(first_end, 1), len(tokens)):
        for n in sizes:
            if end >= n:
                yield _key(tokens, end, n), end


@dataclass(slots=True)
class _Entry:
    tokens: list[int]
    cost: int
    used: int  # the index's clock when last inserted or drafted from (ties between partitions)


class _Partition:
    """One partition's entries in least recently used order, its n-gram table, its bytes."""

    __slots__ = ("bytes", "entries", "table")

    def __init__(self) -> None:
        self.entries: OrderedDict[int, _Entry] = OrderedDict()  # LRU order, oldest first
        self.table: dict[int, int] = {}  # key -> id << 32 | end
        self.bytes = 0

    def oldest_use(self) -> int:
        return next(iter(self.entries.values())).used


class SuffixIndex:
    """Earlier requests' token sequences, looked up by n-gram within one partition."""

    def __init__(self, config: SuffixConfig) -> None:
        self.config = config
        self._sizes = config.sizes
        self._parts: dict[str, _Partition] = {}
        self._next_id = 0
        self._clock = 0
        self._count = 0
        self.bytes = 0
        self.evicted = 0

    def __len__(self) -> int:
        return self._count

    def partitions(self) -> int:
        return len(self._parts)

    def partition_bytes(self, partition: str) -> int:
        part = self._parts.get(partition)
        return part.bytes if part is not None else 0

    def report(self) -> dict[str, int]:
        """The figures a lane's /health carries (read from the event loop: plain ints)."""
        parts = list(self._parts.values())  # one C call: the generation thread may insert
        return {
            "entries": self._count,
            "bytes": self.bytes,
            "max_bytes": self.config.max_bytes,
            "evicted": self.evicted,
            "partitions": len(parts),
            "largest_partition_bytes": max((part.bytes for part in parts), default=0),
        }

    def insert(self, partition: str, tokens: Sequence[int]) -> None:
        """Keep a finished request's prompt and output (their last ``max_entry_tokens``)."""
        kept = list(tokens[-self.config.max_entry_tokens :])
        cost = entry_cost(len(kept), len(self._sizes))
        if len(kept) < 2 or cost > self.config.max_bytes:
            return
        while self.bytes + cost > self.config.max_bytes:
            self._evict(self._fullest(partition, cost))
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = _Partition()
        entry_id = self._next_id
        self._next_id += 1
        self._clock += 1
        part.entries[entry_id] = _Entry(kept, cost, self._clock)
        part.bytes += cost
        self.bytes += cost
        self._count += 1
        for key, end in _ngrams(kept, self._sizes):
            part.table[key] = entry_id << _END_BITS | end  # the latest occurrence wins

    def match(self, partition: str, tokens: Sequence[int], k: int) -> tuple[int, list[int]]:
        """(n, draft): the continuation of the longest n-gram ending ``tokens`` found in the
        partition, the most recent occurrence; (0, []) when none is."""
        part = self._parts.get(partition)
        if part is None or k <= 0:
            return 0, []
        size = len(tokens)
        for n in self._sizes:
            if size < n:
                continue
            packed = part.table.get(_key(tokens, size, n))
            if packed is None:
                continue
            entry_id, end = packed >> _END_BITS, packed & ((1 << _END_BITS) - 1)
            entry = part.entries.get(entry_id)
            if entry is None or entry.tokens[end - n : end] != list(tokens[size - n :]):
                continue  # a hash collision
            part.entries.move_to_end(entry_id)
            self._clock += 1
            entry.used = self._clock
            return n, entry.tokens[end : end + k]
        return 0, []

    def _fullest(self, incoming: str, cost: int) -> str:
        """The partition that gives up an entry: the one holding the most bytes, the incoming
        entry counted in its own (so a flood evicts its own entries first); on a tie, the one
        whose least recently used entry is the oldest. A scan of the partitions, not of the
        entries: there are as many as the router's client partitions."""
        return max(
            self._parts,
            key=lambda name: (
                self._parts[name].bytes + (cost if name == incoming else 0),
                -self._parts[name].oldest_use(),
            ),
        )

    def _evict(self, partition: str) -> None:
        part = self._parts[partition]
        entry_id, entry = part.entries.popitem(last=False)
        part.bytes -= entry.cost
        self.bytes -= entry.cost
        self._count -= 1
        self.evicted += 1
        for key, _ in _ngrams(entry.tokens, self._sizes):
            packed = part.table.get(key)
            if packed is not None and packed >> _END_BITS == entry_id:
                del part.table[key]
        if not part.entries:
            del self._parts[partition]


class SuffixDraft:
    """One request's proposer: its partition of the index, and its own context."""

    def __init__(self, index: SuffixIndex, partition: str) -> None:
        self.index = index
        self.partition = partition
        self._sizes = index.config.sizes
        self._tokens: list[int] = []
        self._own: dict[int, int] = {}  # key -> end of its latest occurrence in _tokens
        self.from_index = 0  # proposals taken from earlier requests (for tests and stats)
        self.matched = 0  # the last proposal's match length (0: none)

    def _sync(self, tokens: Sequence[int]) -> None:
        known = len(self._tokens)
        if len(tokens) < known or list(tokens[:known]) != self._tokens:
            self._tokens, self._own, known = [], {}, 0  # not our sequence: start over
        self._tokens.extend(tokens[known:])
        # Index n-grams ending at known..len-1 (the one ending at len is the suffix itself).
        for key, end in _ngrams(self._tokens, self._sizes, first_end=known):
            self._own[key] = end

    def _own_match(self, k: int) -> tuple[int, list[int]]:
        size = len(self._tokens)
        for n in self._sizes:
            if size < n:
                continue
            end = self._own.get(_key(self._tokens, size, n))
            if end is not None and self._tokens[end - n : end] == self._tokens[size - n :]:
                return n, self._tokens[end : end + k]
        return 0, []

    def grade(self) -> int:
        """The last proposal's match length (``draftchoice.Grade``)."""
        return self.matched

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow ``tokens`` (the prompt and the output so far)."""
        k = min(k, self.index.config.max_draft)
        if k <= 0:
            return []
        self._sync(tokens)
        own_n, own = self._own_match(k)
        n, earlier = self.index.match(self.partition, self._tokens, k)
        if n > own_n and earlier:
            self.from_index += 1
            self.matched = n
            return earlier[: self._length(n)]
        self.matched = own_n if own else 0
        return own[: self._length(own_n)]

    def _length(self, match: int) -> int:
        return max(1, math.ceil(match * self.index.config.spec_factor))
