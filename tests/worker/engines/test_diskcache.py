"""The prompt cache's disk tier with real mlx-lm KV caches and real files: found again by a
new process's cache, never by another partition or model, never loaded when damaged, bounded."""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from router.worker.engines.diskcache import (
    SUFFIX,
    TMP_PREFIX,
    DiskTier,
    Identity,
    identity_of,
    read_header,
)
from router.worker.engines.promptcache import SYSTEM, PromptCache, Segment

MODEL = Identity("model-a", "tokenizer-a")
SYSTEM_PROMPT = list(range(1000, 1040))  # 40 tokens
WAIT = 30.0


def kv(tokens: int, layers: int = 2, seed: float = 0.0) -> list[Any]:
    """``layers`` KVCache layers holding ``tokens`` positions of distinct values; a position's
    values do not depend on ``tokens`` (a longer turn's state starts as the shorter one's)."""
    from mlx_lm.models.cache import KVCache

    out = []
    for i in range(layers):
        cache = KVCache()
        base = mx.arange(tokens * 4, dtype=mx.float16).reshape(1, 1, tokens, 4)
        state = mx.concatenate([base, base + 1000], axis=1) + i + seed
        cache.update_and_fetch(state, state * 2)
        out.append(cache)
    return out


def same_state(got: list[Any], want: list[Any], n: int) -> bool:
    """``got`` holds ``want``'s first ``n`` positions, layer by layer."""
    return all(
        g.offset == n
        and mx.array_equal(g.keys[..., :n, :], w.keys[..., :n, :]).item()
        and mx.array_equal(g.values[..., :n, :], w.values[..., :n, :]).item()
        for g, w in zip(got, want, strict=True)
    )


def conversation(first: int, length: int = 96) -> list[int]:
    return [*SYSTEM_PROMPT, *range(first, first + length - len(SYSTEM_PROMPT))]


@pytest.fixture
def tiers(tmp_path: Path) -> Iterator[list[DiskTier]]:
    made: list[DiskTier] = []
    yield made
    for tier in made:
        tier.close()


def cache_on(
    made: list[DiskTier],
    directory: Path,
    max_bytes: int = 1 << 30,
    identity: Identity = MODEL,
    block_tokens: int = 256,
) -> PromptCache:
    """A lane's prompt cache with a disk tier on ``directory`` (a new worker process's)."""
    tier = DiskTier(directory / "kv", max_bytes, identity, block_tokens=block_tokens)
    tier.start()
    made.append(tier)
    return PromptCache(1 << 30, disk=tier)


def written(cache: PromptCache) -> DiskTier:
    assert cache.disk is not None and cache.disk.flush(WAIT)
    return cache.disk


def disk_figures(cache: PromptCache) -> dict[str, int]:
    disk = cache.stats()["disk"]
    assert isinstance(disk, dict)
    return disk


def files(directory: Path) -> list[Path]:
    return sorted(p for p in (directory / "kv").iterdir() if p.name.endswith(SUFFIX))


def test_a_new_process_finds_an_entry_from_disk(tiers: list[DiskTier], tmp_path: Path) -> None:
    first = conversation(2000)
    stored = kv(len(first))
    written_by = cache_on(tiers, tmp_path)
    written_by.store(first, stored, "alice")
    written(written_by)
    restarted = cache_on(tiers, tmp_path)  # nothing in memory: a restart
    longer = [*first, 7, 8, 9]
    hit = restarted.fetch(longer, "alice")
    assert hit.cached_tokens == len(first) and hit.rest == [7, 8, 9] and hit.cache is not None
    for got, want in zip(hit.cache, stored, strict=True):
        for a, b in zip(got.keys_and_values(), want.keys_and_values(), strict=True):
            assert mx.array_equal(a, b).item()
    assert disk_figures(restarted)["hits"] == 1
    # now in memory: the next lookup reads no file
    assert restarted.fetch([*first, 7, 8, 9, 10], "alice").cached_tokens == len(first)
    assert disk_figures(restarted)["hits"] == 1


def test_the_other_lanes_worker_finds_what_this_one_wrote(
    tiers: list[DiskTier], tmp_path: Path
) -> None:
    """Separate layout: a new conversation routed to the other lane used to find only the
    template's first tokens there (its cache had never seen the system prompt); the two
    workers share the directory, so the other lane reads the system prompt from disk."""
    speculative = cache_on(tiers, tmp_path)
    batching = cache_on(tiers, tmp_path)  # started at the same time, before any write
    first = conversation(2000)
    segments = [Segment(len(SYSTEM_PROMPT), SYSTEM)]
    speculative.store(first, kv(len(first)), "alice", segments=segments)
    written(speculative)
    new = conversation(5000)  # another conversation of the same client
    hit = batching.fetch(new, "alice")
    assert hit.cached_tokens == len(SYSTEM_PROMPT)
    assert disk_figures(batching)["loaded_tokens"] == len(SYSTEM_PROMPT)  # the smaller file


def test_no_partition_finds_another_partitions_entries_on_disk(
    tiers: list[DiskTier], tmp_path: Path
) -> None:
    first = conversation(2000)
    writer = cache_on(tiers, tmp_path)
    writer.store(first, kv(len(first)), "alice")
    written(writer)
    restarted = cache_on(tiers, tmp_path)
    assert restarted.fetch([*first, 1], "bob").cached_tokens == 0
    assert restarted.fetch([*first, 1]).cached_tokens == 0
    assert restarted.fetch([*first, 1], "alice").cached_tokens == len(first)


def test_files_reveal_nothing_and_only_their_user_reads_them(
    tiers: list[DiskTier], tmp_path: Path
) -> None:
    writer = cache_on(tiers, tmp_path)
    writer.store(conversation(2000), kv(96), "alice-partition")
    written(writer)
    (path,) = files(tmp_path)
    stem = path.name.removesuffix(SUFFIX)
    assert len(stem) == 32 and all(c in "0123456789abcdef" for c in stem)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "kv").stat().st_mode) == 0o700
    meta, _ = read_header(path)
    assert "alice-partition" not in meta["partition"]  # a hash; the owner's token is inside


def test_a_corrupt_file_is_refused_and_logged(
    tiers: list[DiskTier], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = conversation(2000)
    writer = cache_on(tiers, tmp_path)
    writer.store(first, kv(len(first)), "alice")
    written(writer)
    (path,) = files(tmp_path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # a flipped bit in the last layer's values
    path.write_bytes(bytes(data))
    restarted = cache_on(tiers, tmp_path)
    with caplog.at_level(logging.WARNING, logger="speclane.worker"):
        assert restarted.fetch([*first, 1], "alice").cached_tokens == 0
    assert "checksum" in caplog.text and not path.exists()
    assert (disk_figures(restarted)["refused"], disk_figures(restarted)["hits"]) == (1, 0)


def test_a_half_written_file_is_never_loaded(
    tiers: list[DiskTier], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash mid-write leaves a temporary file (never indexed); a file cut short under its
    final name (a disk full, a foreign copy) is refused when the index is rebuilt."""
    writer = cache_on(tiers, tmp_path)
    one, two = conversation(2000), conversation(3000)
    for turn in (one, two):
        writer.store(turn, kv(len(turn)), "alice")
        written(writer)
    cut, whole = files(tmp_path)
    (tmp_path / "kv" / f"{TMP_PREFIX}0123{SUFFIX}").write_bytes(whole.read_bytes()[:100])
    cut.write_bytes(cut.read_bytes()[:-16])
    with caplog.at_level(logging.WARNING, logger="speclane.worker"):
        restarted = cache_on(tiers, tmp_path)
    assert "dropped" in caplog.text and not cut.exists()
    assert restarted.disk is not None and len(restarted.disk.entries()) == 1
    hits = [restarted.fetch([*turn, 1], "alice").cached_tokens for turn in (one, two)]
    assert sorted(hits) == [len(SYSTEM_PROMPT), 96]  # the whole one, and the other's start


def test_a_foreign_models_file_is_never_loaded(
    tiers: list[DiskTier], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = conversation(2000)
    other = cache_on(tiers, tmp_path, identity=Identity("model-b", "tokenizer-a"))
    other.store(first, kv(len(first)), "alice")
    written(other)
    ours = cache_on(tiers, tmp_path)
    assert ours.fetch([*first, 1], "alice").cached_tokens == 0  # kept for its model, unseen
    assert len(files(tmp_path)) == 1
    # the same model with another tokenizer: its entry is refused when it would be loaded
    retokenized = cache_on(tiers, tmp_path, identity=Identity("model-b", "tokenizer-b"))
    with caplog.at_level(logging.WARNING, logger="speclane.worker"):
        assert retokenized.fetch([*first, 1], "alice").cached_tokens == 0
    assert "another tokenizer" in caplog.text and files(tmp_path) == []


def test_the_disk_bound_holds_under_a_flood(tiers: list[DiskTier], tmp_path: Path) -> None:
    one = sum(int(c.keys[..., :96, :].nbytes) * 2 for c in kv(96))
    bound = 5 * one + 5 * 8192  # five entries and their headers
    flooded = cache_on(tiers, tmp_path, max_bytes=bound)
    kept = 0
    for i in range(40):
        flooded.store([9000 + i, *conversation(2000 + 100 * i)[1:]], kv(96), "loud")
        kept += 1
        assert flooded.disk is not None and flooded.disk.nbytes <= bound
    disk = written(flooded)
    on_disk = sum(p.stat().st_size for p in files(tmp_path))
    stats = disk.stats()
    assert on_disk <= bound and stats["bytes"] == on_disk
    assert stats["writes"] + stats["dropped"] == kept  # what the writer could not keep up with
    for i in range(8):  # at the writer's pace: every entry written, the oldest removed
        flooded.store([8000 + i, *conversation(2000 + 100 * i)[1:]], kv(96), "loud")
        written(flooded)
        assert sum(p.stat().st_size for p in files(tmp_path)) <= bound
    assert disk.stats()["evicted"] >= 3 and len(files(tmp_path)) <= bound // one


def test_the_bound_under_a_flood_of_chains_never_leaves_one_broken(
    tiers: list[DiskTier], tmp_path: Path
) -> None:
    one = sum(int(c.keys[..., :96, :].nbytes) * 2 for c in kv(96))
    bound = 6 * one  # a few conversations (each 56 positions and two headers of its own)
    flooded = cache_on(tiers, tmp_path, max_bytes=bound, block_tokens=32)
    segments = [Segment(len(SYSTEM_PROMPT), SYSTEM)]
    turns = [conversation(2000 + 100 * i) for i in range(12)]
    for turn in turns:
        flooded.store(turn, kv(len(turn)), "loud", segments=segments)
        disk = written(flooded)
        assert sum(p.stat().st_size for p in files(tmp_path)) <= bound
        names = {b.name for b in disk.blocks()}
        assert all(not b.parent or b.parent in names for b in disk.blocks())
    assert disk.stats()["evicted"] > 0
    # the system prompt, used by every conversation, is what stays longest
    assert any(b.end == len(SYSTEM_PROMPT) for b in disk.blocks())
    restarted = cache_on(tiers, tmp_path, max_bytes=bound, block_tokens=32)
    kept = {c.length for c in written(restarted).entries()}
    hits = [restarted.fetch([*t, 1], "loud").cached_tokens for t in turns]
    assert hits[-1] == 96 and set(hits) <= {len(SYSTEM_PROMPT), 72, 96} and 96 in kept


def test_a_conversations_next_turn_writes_only_its_new_tokens(
    tiers: list[DiskTier], tmp_path: Path
) -> None:
    cache = cache_on(tiers, tmp_path, block_tokens=32)
    segments = [Segment(len(SYSTEM_PROMPT), SYSTEM)]
    turn = conversation(2000)
    per_position = sum(2 * int(c.keys[..., :1, :].nbytes) for c in kv(1))
    cache.store(turn, kv(len(turn)), "alice", segments=segments)
    first = written(cache).stats()["written_bytes"]
    assert first >= len(turn) * per_position
    for _ in range(3):
        before = written(cache).stats()["written_bytes"]
        turn = [*turn, *range(len(turn), len(turn) + 10)]
        cache.store(turn, kv(len(turn)), "alice", segments=segments)
        added = written(cache).stats()["written_bytes"] - before
        # ten positions and a file header, not the conversation again
        assert 10 * per_position <= added <= 10 * per_position + 8192 < first
    # the chain: the system prompt (40), blocks of 32 after it, each turn's ten
    disk = written(cache)
    (chain,) = disk.entries()
    assert [b.end for b in chain.blocks] == [32, 40, 72, 96, 106, 116, 126]
    assert [b.kind for b in chain.blocks] == [SYSTEM, SYSTEM, *["assistant"] * 5]
    restarted = cache_on(tiers, tmp_path, block_tokens=32)
    hit = restarted.fetch([*turn, 1], "alice")
    assert hit.cached_tokens == len(turn) and hit.cache is not None
    assert same_state(hit.cache, kv(len(turn)), len(turn))  # the blocks, joined in order


def test_a_new_conversation_writes_only_what_follows_its_system_prompt(
    tiers: list[DiskTier], tmp_path: Path
) -> None:
    cache = cache_on(tiers, tmp_path)
    segments = [Segment(len(SYSTEM_PROMPT), SYSTEM)]
    cache.store(conversation(2000), kv(96), "alice", segments=segments)
    disk = written(cache)
    before = disk.stats()["written_bytes"]
    other = conversation(5000)
    cache.store(other, kv(96, seed=0.0), "alice", segments=segments)
    written(cache)
    per_position = sum(2 * int(c.keys[..., :1, :].nbytes) for c in kv(1))
    added = disk.stats()["written_bytes"] - before
    assert added <= (96 - len(SYSTEM_PROMPT)) * per_position + 8192
    assert sorted(len(c.blocks) for c in disk.entries()) == [2, 2]  # one system block, shared
    assert len(disk.blocks()) == 3


def test_a_corrupt_block_is_refused_and_its_chain_loads_only_before_it(
    tiers: list[DiskTier], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = cache_on(tiers, tmp_path, block_tokens=32)
    turn = conversation(2000)
    cache.store(turn, kv(96), "alice", segments=[Segment(len(SYSTEM_PROMPT), SYSTEM)])
    (chain,) = written(cache).entries()
    middle = tmp_path / "kv" / chain.blocks[2].name  # positions 40-72
    data = bytearray(middle.read_bytes())
    data[-5] ^= 0xFF
    middle.write_bytes(bytes(data))
    restarted = cache_on(tiers, tmp_path, block_tokens=32)
    with caplog.at_level(logging.WARNING, logger="speclane.worker"):
        hit = restarted.fetch([*turn, 1], "alice")
    assert "checksum" in caplog.text and not middle.exists()
    assert hit.cached_tokens == 0  # the load was refused as a whole
    assert restarted.disk is not None
    ends = sorted(b.end for b in restarted.disk.blocks())
    assert ends == [32, len(SYSTEM_PROMPT)]  # the blocks after it went too
    again = restarted.fetch([*turn, 1], "alice")
    assert again.cached_tokens == len(SYSTEM_PROMPT) and again.cache is not None
    assert same_state(again.cache, kv(96), len(SYSTEM_PROMPT))
    assert disk_figures(restarted)["refused"] == 1


def test_the_same_prompt_in_two_partitions_shares_no_file(
    tiers: list[DiskTier], tmp_path: Path
) -> None:
    cache = cache_on(tiers, tmp_path)
    first = conversation(2000)
    cache.store(first, kv(96), "alice")
    cache.store(first, kv(96), "bob")
    disk = written(cache)
    names = {b.partition: b.name for b in disk.blocks()}
    assert len(names) == 2 and len(set(names.values())) == 2
    restarted = cache_on(tiers, tmp_path)
    assert restarted.fetch([*first, 1], "carol").cached_tokens == 0
    assert restarted.fetch([*first, 1], "bob").cached_tokens == 96


def test_an_older_formats_file_is_removed(tiers: list[DiskTier], tmp_path: Path) -> None:
    writer = cache_on(tiers, tmp_path)
    writer.store(conversation(2000), kv(96), "alice")
    written(writer)
    (path,) = files(tmp_path)
    old = path.read_bytes().replace(b"speclane-prompt-cache/2", b"speclane-prompt-cache/1")
    path.write_bytes(old)
    restarted = cache_on(tiers, tmp_path)
    assert files(tmp_path) == [] and disk_figures(restarted)["refused"] == 0


def test_warm_prompts_load_the_latest_system_prompts_into_memory(
    tiers: list[DiskTier], tmp_path: Path
) -> None:
    writer = cache_on(tiers, tmp_path)
    segments = [Segment(len(SYSTEM_PROMPT), SYSTEM)]
    writer.store(conversation(2000), kv(96), "alice", segments=segments)
    written(writer)
    other_system = [1, *SYSTEM_PROMPT[1:]]
    writer.store([*other_system, *range(3000, 3056)], kv(96), "bob", segments=segments)
    written(writer)
    restarted = cache_on(tiers, tmp_path)
    assert restarted.warm(1) == 2
    stats = restarted.stats()
    assert stats["system_entries"] == 2 and stats["partitions"] == 2
    assert disk_figures(restarted)["hits"] == 2
    new = conversation(5000)
    assert restarted.fetch(new, "alice").cached_tokens == len(SYSTEM_PROMPT)
    assert disk_figures(restarted)["hits"] == 2  # from memory: no file read


def test_the_identity_names_the_config_weights_and_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"layers": 2}')
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "tokenizer.json").write_text("{}")
    first = identity_of(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"v": 2}')
    second = identity_of(tmp_path)
    assert first.model == second.model and first.tokenizer != second.tokenizer
    (tmp_path / "model.safetensors").write_bytes(b"x" * 11)
    assert identity_of(tmp_path).model != first.model


def test_a_store_past_the_writers_queued_bytes_is_dropped_not_waited_for(
    tiers: list[DiskTier], tmp_path: Path
) -> None:
    tier = DiskTier(tmp_path / "kv", 1 << 30, MODEL, max_queued_bytes=1024)
    tier.start()
    tiers.append(tier)
    cache = PromptCache(1 << 30, disk=tier)
    cache.store(conversation(2000), kv(96), "alice")  # 6 KiB of arrays: over the 1 KiB
    assert tier.flush(WAIT)
    stats = tier.stats()
    assert (stats["dropped"], stats["writes"]) == (1, 0) and files(tmp_path) == []
    assert cache.fetch([*conversation(2000), 1], "alice").cached_tokens == 96  # memory has it
