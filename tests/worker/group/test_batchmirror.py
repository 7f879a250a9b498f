"""The batching lane's ops carried out by a follower (``BatchMirror``) over an in-process
group of threads, on a generator that records its calls: prompts join the batch from the
prefix every rank agreed on, under rank 0's uid; finished and removed sequences go into the
follower's prompt cache only when their history is rank 0's; anything out of step stops
the group."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from router.worker.group.batchmirror import BatchMirror
from router.worker.group.channel import disagree, send
from router.worker.group.mirror import Mirror, follow
from router.worker.group.protocol import Message, Op, ProtocolError, checksum
from tests.worker.group.test_mirror import FakeCache, FakePromptCache, FakeShard
from tests.worker.group.threadgroup import ThreadGroup


@dataclass
class Finish:
    uid: int
    all_tokens: list[int]
    prompt_cache: Any
    finish_reason: str | None = "length"


class FakeGenerator:
    """``BatchGenerator``'s calls, recorded; ``finishes``: what each ``next()`` ends."""

    def __init__(self, finishes: list[list[Finish]]) -> None:
        self._uid_count = 0
        self.prefill_step_size = 0
        self.inserted: list[tuple[int, list[int], list[int], int]] = []  # uid, rest, cached, max
        self.steps: list[int] = []  # the prefill step of each next()
        self.rows: dict[int, list[int]] = {}  # uid -> its tokens
        self.finishes = finishes
        self.closed = False

    def insert(
        self,
        prompts: list[list[int]],
        max_tokens: list[int],
        caches: list[Any],
        all_tokens: list[list[int]],
    ) -> list[int]:
        if not prompts[0] or max_tokens[0] <= 0:
            raise ValueError("refused")
        uid = self._uid_count
        self._uid_count += 1
        self.inserted.append((uid, prompts[0], all_tokens[0], max_tokens[0]))
        self.rows[uid] = all_tokens[0] + prompts[0]
        return [uid]

    def next(self) -> tuple[list[Any], list[Any]]:
        self.steps.append(self.prefill_step_size)
        return [], self.finishes.pop(0) if self.finishes else []

    def remove(self, uids: list[int], return_prompt_caches: bool = False) -> dict[int, Any]:
        out = {u: ([FakeCache(self.rows[u])], self.rows[u]) for u in uids if u in self.rows}
        for uid in uids:
            self.rows.pop(uid, None)
        return out if return_prompt_caches else {}

    def close(self) -> None:
        self.closed = True


def run_batch(
    leader_work: Callable[[Any], None],
    finishes: list[list[Finish]] | None = None,
    follower_cache: FakePromptCache | None = None,
) -> tuple[list[FakeGenerator], FakePromptCache, list[BaseException]]:
    group = ThreadGroup(2)
    cache = follower_cache or FakePromptCache()
    made: list[FakeGenerator] = []

    def make() -> FakeGenerator:
        made.append(FakeGenerator(list(finishes or [])))
        return made[-1]

    channel = group.channel(1)
    mirror = Mirror(
        FakeShard(), cache, channel, idle_sleep=0.0, batch=BatchMirror(make, cache, channel)
    )
    errors: list[BaseException] = []

    def follower() -> None:
        try:
            follow(mirror)
        except BaseException as e:  # what the follower's process would die of
            errors.append(e)

    thread = threading.Thread(target=follower, daemon=True)
    thread.start()
    try:
        leader_work(group.channel(0))
    finally:
        thread.join(10)
    return made, cache, errors


def insert(channel: Any, uid: int, cached: int, prompt: tuple[int, ...], **kw: Any) -> bool:
    """Rank 0's BATCH_INSERT and the agreement on its prefix (True: they disagreed)."""
    send(
        channel,
        Message(
            Op.BATCH_INSERT,
            uid,
            cached,
            prompt,
            value=kw.get("max", 8),
            **{k: v for k, v in kw.items() if k != "max"},
        ),
    )
    return disagree(channel, False)


def test_prompts_join_from_the_agreed_prefix_and_finished_ones_are_kept() -> None:
    cached = FakePromptCache()
    cached.entries[("p", (1, 2))] = [FakeCache([1, 2])]
    done = [FakeCache([1, 2, 3, 4, 5])]

    def work(channel: Any) -> None:
        send(channel, Message(Op.BATCH_RESET))
        assert not insert(channel, 0, 2, (1, 2, 3, 4), partition="p")
        assert not insert(channel, 1, 0, (7, 8), partition="q", max=3)
        send(channel, Message(Op.BATCH_NEXT, value=64))
        send(channel, Message(Op.BATCH_STORE, 0, checksum=checksum([1, 2, 3, 4, 5])))
        send(channel, Message(Op.BATCH_REMOVE, tokens=(1, checksum([7, 8])), value=1))
        send(channel, Message(Op.STOP))

    made, cache, errors = run_batch(work, [[Finish(0, [1, 2, 3, 4, 5], done)]], cached)
    assert not errors
    (generator,) = made
    assert generator.inserted == [(0, [3, 4], [1, 2], 8), (1, [7, 8], [], 3)]
    assert generator.steps == [64]
    assert set(cache.entries) >= {("p", (1, 2, 3, 4, 5)), ("q", (7, 8))}


def test_ranks_whose_caches_differ_all_prefill_the_whole_prompt() -> None:
    def work(channel: Any) -> None:
        send(channel, Message(Op.BATCH_RESET))
        assert insert(channel, 0, 3, (1, 2, 3, 4), partition="p")  # rank 0 found 3
        send(channel, Message(Op.STOP))

    made, _, errors = run_batch(work, follower_cache=FakePromptCache(lie=2))
    assert not errors
    assert made[0].inserted == [(0, [1, 2, 3, 4], [], 8)]


def test_a_prompt_rank_0_refused_is_refused_here_too() -> None:
    def work(channel: Any) -> None:
        send(channel, Message(Op.BATCH_RESET))
        assert not insert(channel, 0, 0, (1, 2), max=0)  # max_tokens 0: a 400 on rank 0
        assert not insert(channel, 0, 0, (1, 2))  # the same uid goes to the next one
        send(channel, Message(Op.STOP))

    made, _, errors = run_batch(work)
    assert not errors and [i[0] for i in made[0].inserted] == [0]


def test_a_reset_makes_a_fresh_generator() -> None:
    def work(channel: Any) -> None:
        send(channel, Message(Op.BATCH_RESET))
        send(channel, Message(Op.BATCH_RESET))
        send(channel, Message(Op.STOP))

    made, _, errors = run_batch(work)
    assert not errors and len(made) == 2 and made[0].closed and not made[1].closed


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([Message(Op.BATCH_NEXT, value=16)], "before the batch was opened"),
        ([Message(Op.BATCH_RESET), Message(Op.BATCH_STEP, 0)], "outside a batch step"),
        ([Message(Op.BATCH_RESET), Message(Op.BATCH_NEXT, value=0)], "prefill step of 0"),
        ([Message(Op.BATCH_RESET), Message(Op.BATCH_STORE, 3)], "did not finish"),
        (
            [
                Message(Op.BATCH_RESET),
                Message(Op.BATCH_NEXT, value=16),
                Message(Op.BATCH_STORE, 0, checksum=checksum([1, 2, 9])),
            ],
            "history differs",
        ),
    ],
)
def test_a_follower_out_of_step_stops_the_group(messages: list[Message], says: str) -> None:
    def work(channel: Any) -> None:
        for message in messages:
            send(channel, message)

    finished = [[Finish(0, [1, 2, 3], [FakeCache([1, 2, 3])])]]
    _, _, errors = run_batch(work, finished)
    assert len(errors) == 1 and isinstance(errors[0], ProtocolError)
    assert says in str(errors[0])


def test_another_uid_or_another_history_stops_the_group() -> None:
    def work(channel: Any) -> None:
        send(channel, Message(Op.BATCH_RESET))
        insert(channel, 4, 0, (1, 2))  # rank 0 says uid 4; this rank's generator gives 0

    _, _, errors = run_batch(work)
    assert "inserted sequence 4" in str(errors[0])

    def removed(channel: Any) -> None:
        send(channel, Message(Op.BATCH_RESET))
        insert(channel, 0, 0, (1, 2))
        send(channel, Message(Op.BATCH_REMOVE, tokens=(0, checksum([1, 3])), value=1))

    _, _, errors = run_batch(removed)
    assert "history differs" in str(errors[0])


def test_a_rank_without_the_batching_lane_refuses_its_ops() -> None:
    group = ThreadGroup(2)
    mirror = Mirror(FakeShard(), FakePromptCache(), group.channel(1), idle_sleep=0.0)
    with pytest.raises(ProtocolError, match="no batching lane"):
        mirror.apply(Message(Op.BATCH_RESET))
