"""The lane's prompt cache with real mlx-lm KV caches: entries are seen only by requests of
the partition that stored them."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from router.worker.engines.promptcache import (
    DEFAULT_PARTITION,
    SYSTEM,
    PromptCache,
    Segment,
    entry_key,
    head,
)

PROMPT = [11, 12, 13, 14, 15, 16]


def kv(tokens: int) -> list[Any]:
    """A one-layer KV cache holding ``tokens`` positions."""
    from mlx_lm.models.cache import KVCache

    cache = KVCache()
    state = mx.zeros((1, 1, tokens, 4))
    cache.update_and_fetch(state, state)
    return [cache]


def test_an_entry_is_found_only_in_its_own_partition() -> None:
    cache = PromptCache(1 << 20)
    cache.store(PROMPT, kv(len(PROMPT)), "alice")
    longer = [*PROMPT, 17, 18]
    other = cache.fetch(longer, "bob")
    assert (other.cache, other.cached_tokens, other.rest) == (None, 0, longer)
    assert cache.fetch(longer).cached_tokens == 0  # nor by requests without a partition
    own = cache.fetch(longer, "alice")
    assert own.cached_tokens == len(PROMPT) and own.rest == [17, 18]
    assert own.cache is not None


def test_an_exact_match_in_another_partition_is_no_hit() -> None:
    cache = PromptCache(1 << 20)
    cache.store(PROMPT, kv(len(PROMPT)), "alice")
    assert cache.fetch(PROMPT, "bob").cached_tokens == 0
    assert cache.fetch(PROMPT, "alice").cached_tokens == len(PROMPT) - 1  # stepped back one


def test_each_partition_keeps_its_own_entry_for_the_same_tokens() -> None:
    cache = PromptCache(1 << 20)
    cache.store(PROMPT, kv(len(PROMPT)), "alice")
    cache.store(PROMPT, kv(len(PROMPT)), "bob")
    assert cache.stats()["entries"] == 2
    assert cache.fetch([*PROMPT, 1], "bob").cached_tokens == len(PROMPT)
    assert cache.fetch([*PROMPT, 1], DEFAULT_PARTITION).cached_tokens == 0
    stats = cache.stats()
    assert (stats["lookups"], stats["hits"]) == (2, 1)


def test_entry_keys_keep_models_and_partitions_apart() -> None:
    keys = {entry_key(ns, p) for ns in ("target", "draft") for p in ("", "a", "b")}
    assert len(keys) == 6


def test_an_entry_stored_on_one_thread_is_used_on_another() -> None:
    """Shared mode with two generation threads: a lazy KV state (as a batch hands back) is
    evaluated as it is stored, since MLX cannot evaluate it on the thread that fetches it."""
    import threading

    cache = PromptCache(1 << 20)

    def store() -> None:
        lazy = kv(len(PROMPT))
        lazy[0].keys = lazy[0].keys + 1  # not evaluated
        cache.store(PROMPT, lazy, "alice")

    storer = threading.Thread(target=store)
    storer.start()
    storer.join(10)
    hit = cache.fetch([*PROMPT, 17], "alice")
    assert hit.cache is not None and hit.cached_tokens == len(PROMPT)
    keys = hit.cache[0].state[0]
    assert keys.sum().item() == keys.size  # the zeros plus one, evaluated here


def test_the_partition_holding_most_gives_up_its_entries_first() -> None:
    one = sum(c.nbytes for c in kv(64))
    cache = PromptCache(4 * one)  # room for four entries in all
    cache.store([1, *PROMPT], kv(64), "quiet")  # a client's system prompt
    for i in range(6):  # another client floods the cache
        cache.store([100 + i, *PROMPT], kv(64), "loud")
    assert cache.fetch([1, *PROMPT, 9], "quiet").cached_tokens == len(PROMPT) + 1
    stats = cache.stats()
    assert stats["bytes"] <= 4 * one and (stats["entries"], stats["partitions"]) == (4, 2)
    # the flood kept its newest entries, lost its oldest
    assert cache.fetch([105, *PROMPT, 9], "loud").cached_tokens == len(PROMPT) + 1
    assert cache.fetch([100, *PROMPT, 9], "loud").cached_tokens == 0


def test_one_partition_alone_has_the_whole_bound() -> None:
    one = sum(c.nbytes for c in kv(64))
    cache = PromptCache(3 * one)
    for i in range(5):
        cache.store([100 + i, *PROMPT], kv(64), "only")
    assert (cache.stats()["entries"], cache.stats()["bytes"]) == (3, 3 * one)


def test_equal_partitions_over_the_bound_share_it() -> None:
    one = sum(c.nbytes for c in kv(64))
    cache = PromptCache(3 * one)
    for i in range(2):
        cache.store([100 + i, *PROMPT], kv(64), "a")
        cache.store([200 + i, *PROMPT], kv(64), "b")
    stats = cache.stats()
    assert stats["bytes"] <= 3 * one and stats["entries"] == 3 and stats["partitions"] == 2


SYSTEM_PROMPT = list(range(1000, 1032))  # 32 tokens: a client's system prompt and tools


def conversation(first: int, length: int = 64) -> list[int]:
    return [*SYSTEM_PROMPT, *range(first, first + length - len(SYSTEM_PROMPT))]


def test_a_system_segment_outlives_the_conversations_that_held_it() -> None:
    """A new conversation of the same client starts from its system prompt even after its
    earlier conversations were evicted: the segment is an entry of its own, evicted last."""
    one = sum(c.nbytes for c in kv(64))
    cache = PromptCache(3 * one)
    first = conversation(2000)
    cache.store(first, kv(len(first)), "alice", segments=[Segment(len(SYSTEM_PROMPT), SYSTEM)])
    for i in range(4):  # other work of the same client, with another system prompt
        cache.store([7000 + i, *range(64)], kv(64), "alice")
    new = conversation(5000)
    hit = cache.fetch(new, "alice")
    assert hit.cached_tokens == len(SYSTEM_PROMPT) and hit.rest == new[len(SYSTEM_PROMPT) :]
    assert cache.stats()["bytes"] <= 3 * one


def test_a_longer_entry_keeps_the_segment_under_it() -> None:
    """mlx-lm drops every prefix entry of a trimmable entry it stores; a segment stays."""
    cache = PromptCache(1 << 24)
    first = conversation(2000)
    cache.store(first, kv(len(first)), "alice", segments=[Segment(len(SYSTEM_PROMPT), SYSTEM)])
    assert cache.stats()["entries"] == 2
    longer = [*first, 1, 2, 3]
    cache.store(longer, kv(len(longer)), "alice")  # the next turn
    longest = [*longer, 4, 5]
    cache.store(longest, kv(len(longest)), "alice")
    stats = cache.stats()
    assert (stats["entries"], stats["system_entries"]) == (2, 1)  # the segment, the last turn


def test_a_segment_is_a_compact_copy_of_the_first_positions() -> None:
    full = kv(40)  # one KVCache step: its buffer holds 256 positions
    copy = head(full, 20)
    assert copy is not None and copy[0].offset == 20
    assert copy[0].keys.shape[2] == 20 and copy[0].nbytes * 256 == full[0].nbytes * 20
    assert head(full, 41) is None  # holds fewer


def test_a_segment_too_short_or_as_long_as_the_entry_is_no_entry_of_its_own() -> None:
    cache = PromptCache(1 << 24)
    first = conversation(2000)
    segments = [Segment(4, SYSTEM), Segment(len(first), SYSTEM)]
    cache.store(first, kv(len(first)), "alice", segments=segments)
    assert cache.stats()["entries"] == 1
