"""Rank 0's op log carried out by a follower, over an in-process group of threads: the
follower's shard sees the same passes on the same cache positions, stores what rank 0
stores, and refuses (stopping the group) rather than follow a history that differs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from router.worker.group.channel import disagree, send
from router.worker.group.leader import Leader
from router.worker.group.mirror import Mirror, follow
from router.worker.group.protocol import Message, Op, ProtocolError, checksum
from tests.worker.group.threadgroup import ThreadGroup


@dataclass
class FakeCache:
    """A KV cache as positions: what a shard's passes put in it."""

    tokens: list[int] = field(default_factory=list)

    @property
    def offset(self) -> int:
        return len(self.tokens)


class FakeShard:
    def __init__(self) -> None:
        self.passes: list[tuple[int, list[int]]] = []  # (position, tokens)

    def fresh(self) -> Any:
        return [FakeCache()]

    def forward(self, cache: Any, tokens: list[int]) -> None:
        self.passes.append((cache[0].offset, list(tokens)))
        cache[0].tokens += tokens

    def length(self, cache: Any) -> int:
        return int(cache[0].offset)

    def trim(self, cache: Any, n: int) -> None:
        del cache[0].tokens[len(cache[0].tokens) - n :]


@dataclass
class FakeLookup:
    cache: Any
    cached_tokens: int


class FakePromptCache:
    """Exact-prefix entries; ``lie``: a rank whose mirror found another length."""

    def __init__(self, lie: int | None = None) -> None:
        self.entries: dict[tuple[str, tuple[int, ...]], Any] = {}
        self.lie = lie

    def fetch(self, prompt: list[int], partition: str, **_: Any) -> FakeLookup:
        if self.lie is not None:
            return FakeLookup([FakeCache(list(prompt[: self.lie]))], self.lie)
        best: tuple[int, Any] = (0, None)
        for (part, tokens), cache in self.entries.items():
            n = len(tokens)
            if part == partition and n < len(prompt) and tuple(prompt[:n]) == tokens:
                best = max(best, (n, cache), key=lambda b: b[0])
        n, cache = best
        return FakeLookup([FakeCache(list(cache[0].tokens))] if cache else None, n)

    def store(self, tokens: list[int], cache: Any, partition: str, **_: Any) -> None:
        assert cache[0].tokens == tokens, "a stored cache holds exactly its tokens"
        self.entries[(partition, tuple(tokens))] = cache


def run_group(
    leader_work: Callable[[Any], None], follower_cache: FakePromptCache | None = None
) -> tuple[FakeShard, FakePromptCache, list[BaseException], int | None]:
    group = ThreadGroup(2)
    shard, cache = FakeShard(), follower_cache or FakePromptCache()
    mirror = Mirror(shard, cache, group.channel(1), idle_sleep=0.0)
    errors: list[BaseException] = []
    outcome: list[int] = []

    def follower() -> None:
        try:
            outcome.append(follow(mirror))
        except BaseException as e:  # what the follower's process would die of
            errors.append(e)

    thread = threading.Thread(target=follower, daemon=True)
    thread.start()
    try:
        leader_work(group.channel(0))
    finally:
        thread.join(10)
    return shard, cache, errors, (outcome[0] if outcome else None)


def test_passes_follow_rank_0s_positions_trims_and_stores() -> None:
    def work(channel: Any) -> None:
        send(channel, Message(Op.NEW, 0))
        send(channel, Message(Op.FORWARD, 0, 0, (1, 2, 3)))
        send(channel, Message(Op.FORWARD, 0, 3, (4, 5, 6, 7)))  # 4 plus a 3-token draft
        send(channel, Message(Op.FORWARD, 0, 5, (9,)))  # two draft tokens rejected
        send(channel, Message(Op.STORE, 0, 5, (), "p", checksum([1, 2, 3, 4, 5])))
        send(channel, Message(Op.END))
        send(channel, Message(Op.STOP))

    shard, cache, errors, outcome = run_group(work)
    assert not errors and outcome == 0
    assert shard.passes == [(0, [1, 2, 3]), (3, [4, 5, 6, 7]), (5, [9])]
    assert list(cache.entries) == [("p", (1, 2, 3, 4, 5))]


def test_a_fetched_prefix_is_mirrored_and_a_request_resumes_after_it() -> None:
    follower_cache = FakePromptCache()
    follower_cache.entries[("p", (1, 2, 3))] = [FakeCache([1, 2, 3])]

    def work(channel: Any) -> None:
        send(channel, Message(Op.FETCH, 4, 3, (1, 2, 3, 4, 5), "p"))
        assert not disagree(channel, False)
        send(channel, Message(Op.FORWARD, 4, 3, (4,)))
        send(channel, Message(Op.STOP))

    shard, _, errors, _ = run_group(work, follower_cache)
    assert not errors
    assert shard.passes == [(3, [4])]


def test_ranks_whose_caches_differ_all_start_afresh() -> None:
    seen: list[bool] = []

    def work(channel: Any) -> None:
        send(channel, Message(Op.FETCH, 0, 3, (1, 2, 3, 4, 5), "p"))  # rank 0 found 3
        seen.append(disagree(channel, False))
        send(channel, Message(Op.FORWARD, 0, 0, (1, 2, 3, 4)))  # from scratch, as agreed
        send(channel, Message(Op.STOP))

    shard, _, errors, _ = run_group(work, FakePromptCache(lie=2))
    assert seen == [True] and not errors
    assert shard.passes == [(0, [1, 2, 3, 4])]


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([Message(Op.FORWARD, 7, 0, (1,))], "not open"),
        ([Message(Op.NEW, 0), Message(Op.FORWARD, 0, 2, (1,))], "holds 2 positions"),
        (
            [
                Message(Op.NEW, 0),
                Message(Op.FORWARD, 0, 0, (1, 2)),
                Message(Op.STORE, 0, 2, (), "", checksum([1, 3])),
            ],
            "history differs",
        ),
        ([Message(Op.NEW, i) for i in range(17)], "caches open"),
    ],
)
def test_a_follower_out_of_step_stops_rather_than_answer_wrong(
    messages: list[Message], says: str
) -> None:
    def work(channel: Any) -> None:
        for message in messages:
            send(channel, message)

    _, _, errors, outcome = run_group(work)
    assert outcome is None
    assert len(errors) == 1 and isinstance(errors[0], ProtocolError)
    assert says in str(errors[0])


def test_the_leader_numbers_caches_and_announces_the_ones_it_made() -> None:
    stored: list[tuple[int, ...]] = []

    def work(channel: Any) -> None:
        leader = Leader(channel)
        own = FakePromptCache()
        cache, cached = leader.fetch(own, lambda: [FakeCache()], [1, 2, 3], "p", None)
        assert cached == 0
        calibration = [FakeCache()]
        assert leader.slot_of(calibration) == 1  # NEW sent: the follower opens it too
        assert leader.slot_of(cache) == 0
        # rank 0's own pass over its cache, announced as GroupModel does
        leader.send(Message(Op.FORWARD, 0, 0, (1, 2)))
        cache[0].tokens += [1, 2]
        leader.store(own, [1, 2], cache, "p")
        stored.extend(tokens for _, tokens in own.entries)
        leader.end()
        leader.gather_memory()
        assert len(leader.rank_memory_mib) == 2 and all(m > 0 for m in leader.rank_memory_mib)
        leader.stop()

    _, cache, errors, outcome = run_group(work)
    assert not errors and outcome == 0
    assert stored == [(1, 2)] and list(cache.entries) == [("p", (1, 2))]


def test_idle_ticks_let_the_follower_sleep_and_change_nothing() -> None:
    def work(channel: Any) -> None:
        send(channel, Message(Op.NEW, 0))
        send(channel, Message(Op.FORWARD, 0, 0, (1, 2)))
        for _ in range(3):
            send(channel, Message(Op.IDLE))
        send(channel, Message(Op.FORWARD, 0, 2, (3,)))
        send(channel, Message(Op.STOP))

    shard, _, errors, outcome = run_group(work)
    assert not errors and outcome == 0
    assert shard.passes == [(0, [1, 2]), (2, [3])]


def test_a_follower_whose_launcher_is_gone_leaves_when_idle() -> None:
    group = ThreadGroup(2)
    mirror = Mirror(FakeShard(), FakePromptCache(), group.channel(1), 0.0, alive=lambda: False)
    errors: list[BaseException] = []

    def follower() -> None:
        try:
            follow(mirror)
        except ProtocolError as e:
            errors.append(e)

    thread = threading.Thread(target=follower, daemon=True)
    thread.start()
    send(group.channel(0), Message(Op.IDLE))
    thread.join(10)
    assert len(errors) == 1 and "launcher is gone" in str(errors[0])
