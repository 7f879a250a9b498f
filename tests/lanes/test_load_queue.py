"""One client cannot spend everyone's places in the load queue (issue #36, class 3): a request
is admitted (its client's ``max_concurrency``) before it waits for a model's load, and the
places of ``lanes.load_queue`` are shared fairly between clients
(``router.lanes.loadqueue``). Lane workers are tests/fakes/fake_worker.py processes, beta's
slow to start."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from router.lanes import group
from router.lanes.loadqueue import LoadQueue, choose
from router.lanes.process import WorkerCommand
from tests.conftest import run_router, wait_until
from tests.lanes.test_models import chat, entry, fake_command, manager, settings_for, write_policies

SLOW_START = 2.0  # seconds beta's fake worker takes to start


def slow_beta(
    lane: str, settings: Any, model_dir: Path, draft: Path | None, model_name: str, **kw: Any
) -> WorkerCommand:
    command = fake_command(lane, settings, model_dir, draft, model_name, **kw)
    if model_dir.name != "beta":
        return command
    return dataclasses.replace(command, argv=(*command.argv, "--slow-start", str(SLOW_START)))


@pytest.fixture(autouse=True)
def slow_workers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(group, "build_worker_command", slow_beta)
    yield


def test_choose_takes_a_place_from_the_biggest_holder_only_when_it_holds_two_more() -> None:
    assert choose({}, "a", 2) == "a"
    assert choose({"a": 1}, "b", 2) == "b"
    assert choose({"a": 2}, "a", 2) is None  # nobody else to give way
    assert choose({"a": 2}, "b", 2) == "a"
    assert choose({"a": 1, "b": 1}, "b", 2) is None  # b would hold more than a
    assert choose({"a": 3, "c": 3, "b": 0}, "b", 6) == "a"  # ties: the first name
    assert choose({"a": 3, "b": 2}, "b", 5) is None


async def test_a_bumped_waiter_is_told_and_leaves() -> None:
    queue = LoadQueue(2)
    first, second = queue.enter("flood"), queue.enter("flood")
    assert first is not None and second is not None
    other = queue.enter("other")
    assert other is not None and second.done() and not first.done()
    queue.leave("flood", second)  # (already gone: a no-op)
    assert queue.held() == {"flood": 1, "other": 1}
    assert queue.enter("flood") is None  # full, and flood holds no fewer than anyone


async def test_a_client_limited_to_two_holds_two_places_and_another_still_gets_in(
    tmp_path: Path,
) -> None:
    policies = write_policies(
        tmp_path,
        "",
        flood='max_concurrency = 2\nqueue_timeout = 60\n[match]\nclient_header = ["flood"]\n',
        other='[match]\nclient_header = ["other"]\n',
    )
    settings = settings_for(tmp_path, policies=policies, load_queue=4)
    async with run_router(settings) as router:
        floods = [
            asyncio.create_task(chat(router, "beta", **{"X-Speclane-Client": "flood"}))
            for _ in range(8)
        ]
        await wait_until(lambda: entry(router, "beta")["in_flight"] == 2)
        await asyncio.sleep(0.2)  # had they waited before admission, all 8 would be in
        assert entry(router, "beta")["in_flight"] == 2
        assert manager(router)._queue.held() == {"flood": 2}
        mine = await chat(router, "beta", **{"X-Speclane-Client": "other"})
        assert mine.choices[0].message.content == "ok"
        answers = await asyncio.gather(*floods)
    assert all(a.choices[0].message.content == "ok" for a in answers)


async def test_a_client_without_a_limit_gives_up_its_newest_place_to_another(
    tmp_path: Path,
) -> None:
    policies = write_policies(
        tmp_path,
        "",
        flood='[match]\nclient_header = ["flood"]\n',  # no max_concurrency
        other='[match]\nclient_header = ["other"]\n',
    )
    settings = settings_for(tmp_path, policies=policies, load_queue=4)
    async with run_router(settings) as router:
        floods = [
            asyncio.create_task(chat(router, "beta", **{"X-Speclane-Client": "flood"}))
            for _ in range(4)
        ]
        await wait_until(lambda: manager(router)._queue.held() == {"flood": 4})
        mine = await chat(router, "beta", **{"X-Speclane-Client": "other"})
        results = await asyncio.gather(*floods, return_exceptions=True)
    assert mine.choices[0].message.content == "ok"
    refused = [r for r in results if isinstance(r, openai.APIStatusError)]
    assert len(refused) == 1
    assert refused[0].status_code == 503
    assert refused[0].body["code"] == "model_load_queue_full"  # type: ignore[index]
    assert sum(not isinstance(r, BaseException) for r in results) == 3
