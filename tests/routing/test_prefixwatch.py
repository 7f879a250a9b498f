"""The prefix watch (router/routing/prefixwatch.py): a turn that found less in its lane's
cache than its conversation's previous request left there; then through the router."""

from __future__ import annotations

import openai
import pytest

from router.routing.affinity import fingerprints
from router.routing.prefixwatch import SLACK, PrefixWatch
from tests.conftest import lanes_router, metric_value
from tests.fakes.upstream import Behaviour, fake_upstream

SYSTEM = {"role": "system", "content": "You are an agent."}
TURN_1 = [SYSTEM, {"role": "user", "content": "read notes.txt"}]
TURN_2 = [
    *TURN_1,
    {"role": "assistant", "content": "it says hi"},
    {"role": "user", "content": "and?"},
]


def prints(messages: list[dict[str, str]], partition: str = "client:a") -> tuple[bytes, ...]:
    return fingerprints("chat", {"messages": messages}, partition)


def test_a_next_turn_that_finds_its_previous_prompt_is_no_break() -> None:
    watch = PrefixWatch()
    assert watch.served(prints(TURN_1), 2, "batching", 1800, 0) is None  # nothing before it
    assert watch.served(prints(TURN_2), 4, "batching", 1850, 1800 - SLACK) is None


def test_a_next_turn_that_finds_less_is_a_break_naming_the_messages() -> None:
    watch = PrefixWatch()
    watch.served(prints(TURN_1), 2, "batching", 1854, 0)
    shortfall = watch.served(prints(TURN_2), 4, "batching", 1900, 25)
    assert shortfall is not None
    assert (shortfall.messages, shortfall.expected, shortfall.cached) == (2, 1854, 25)
    assert shortfall.describe().startswith("cache_short: 25 of 1854 tokens cached")


@pytest.mark.parametrize(
    "cache, partition", [("speculative", "client:a"), ("batching", "client:b")]
)
def test_another_cache_or_partition_expects_nothing(cache: str, partition: str) -> None:
    watch = PrefixWatch()
    watch.served(prints(TURN_1), 2, "batching", 1854, 0)
    assert watch.served(prints(TURN_2, partition), 4, cache, 1900, 0) is None


def test_the_watch_is_bounded() -> None:
    watch = PrefixWatch(max_entries=2)
    for i in range(5):
        watch.served(prints([{"role": "user", "content": str(i)}]), 1, "batching", 10, 0)
    assert len(watch) == 2
    with pytest.raises(ValueError):
        PrefixWatch(max_entries=0)


async def test_the_router_counts_a_turn_its_lane_did_not_find() -> None:
    def answer(prompt: int, cached: int) -> Behaviour:
        details = {"prompt_tokens_details": {"cached_tokens": cached}}
        return Behaviour(prompt_tokens=prompt, usage_extra=details)

    async with (
        fake_upstream(name="spec") as spec,
        fake_upstream(name="batch") as batch,
        lanes_router(spec, batch) as r,
    ):
        batch.then(answer(1854, 0), answer(1900, 1850), answer(1950, 25))
        client: openai.AsyncOpenAI = r.client(default_headers={"X-Speclane-Lane": "batching"})
        for messages in (TURN_1, TURN_2, [*TURN_2, {"role": "user", "content": "more"}]):
            await client.chat.completions.create(model="fake-model", messages=messages)  # type: ignore[arg-type]
        text = r.services.metrics.render().decode()
        records = list(r.services.access.recent)
    labels = {"client": "default", "reason": "cache_short"}
    assert metric_value(text, "speclane_prefix_breaks_total", **labels) == 1
    assert [rec.prefix_break is not None for rec in records] == [False, False, True]
    assert records[-1].prefix_break == (
        "cache_short: 25 of 1900 tokens cached (messages[:4] were the previous request's prompt)"
    )
