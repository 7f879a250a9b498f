"""router.metrics: remembered label children still count each series on its own."""

from __future__ import annotations

from importlib import metadata

import openai
import pytest

from router import __version__
from router.metrics import Metrics, build_labels
from tests.conftest import (
    RunningRouter,
    fake_upstreams,
    metric_value,
    router_settings,
    run_router,
    wait_until,
)
from tests.fakes.upstream import Behaviour, FakeUpstream


def test_remembered_children_keep_series_apart() -> None:
    m = Metrics()
    first = m.requests.labels("chat", "a", "200", "openai", "m")
    assert m.requests.labels("chat", "a", "200", "openai", "m") is first
    first.inc()
    m.requests.labels("chat", "a", "200", "openai", "m").inc()
    m.requests.labels("chat", "b", "200", "openai", "m").inc()
    m.requests.labels(
        endpoint="chat", backend="a", status="500", api="openai", model="m"
    ).inc()  # keywords still work
    text = m.render().decode()
    total = "speclane_requests_total"
    assert metric_value(text, total, endpoint="chat", backend="a", status="200") == 2
    assert metric_value(text, total, endpoint="chat", backend="b", status="200") == 1
    assert metric_value(text, total, endpoint="chat", backend="a", status="500") == 1


# --- metrics that tell the truth, through a real router and fake upstreams ----------------

CHAT = [{"role": "user", "content": "hi"}]


async def scrape(r: RunningRouter) -> str:
    return r.services.metrics.render().decode()


async def test_standard_collectors_and_build_info() -> None:
    text = Metrics().render().decode()
    assert metric_value(text, "process_resident_memory_bytes") > 0  # type: ignore[operator]
    assert metric_value(text, "process_cpu_seconds_total") is not None
    assert metric_value(text, "python_info") == 1
    assert metric_value(text, "python_gc_objects_collected_total", generation="0") is not None
    labels = build_labels()
    assert labels["version"] == __version__
    assert labels["mlx_lm"] == metadata.version("mlx-lm")
    assert metric_value(text, "speclane_build_info", **labels) == 1


async def test_failures_are_booked_to_the_backend_tried_and_retries_only_when_repeated(
    fake: FakeUpstream,
) -> None:
    fake.behaviour = Behaviour(status=500)
    async with run_router(router_settings(fake)) as r:  # retry.attempts = 3
        with pytest.raises(openai.InternalServerError):
            await r.client().chat.completions.create(model="fake-model", messages=CHAT)
        text = await scrape(r)
    assert metric_value(text, "speclane_requests_total", backend="fake", status="500") == 1
    assert metric_value(text, "speclane_requests_total", backend="none") is None
    assert (
        metric_value(text, "speclane_upstream_failures_total", backend="fake", reason="status_500")
        == 3
    )
    # three attempts: the first two failures were repeated, the last one ended the request
    assert (
        metric_value(text, "speclane_upstream_retries_total", backend="fake", reason="status_500")
        == 2
    )


async def test_a_timeout_that_is_not_retried_is_a_failure_not_a_retry(fake: FakeUpstream) -> None:
    fake.behaviour = Behaviour(delay_headers=30)
    backend = {"name": "fake", "kind": "openai", "base_url": fake.base_url, "read_timeout": 0.2}
    async with run_router(router_settings(fake, backends=[backend])) as r:
        with pytest.raises(openai.APIStatusError) as info:
            await r.client().chat.completions.create(model="fake-model", messages=CHAT)
        text = await scrape(r)
    assert info.value.status_code == 504
    assert metric_value(text, "speclane_requests_total", backend="fake", status="504") == 1
    assert (
        metric_value(text, "speclane_upstream_failures_total", backend="fake", reason="timeout")
        == 1
    )
    assert metric_value(text, "speclane_upstream_retries_total") is None


async def test_a_retry_on_the_next_candidate_is_booked_to_the_one_that_failed() -> None:
    async with fake_upstreams("a", "b") as (a, b):
        a.behaviour = Behaviour(status=502)
        async with run_router(router_settings(a, b)) as r:
            raw = await r.client().chat.completions.with_raw_response.create(
                model="fake-model", messages=CHAT
            )
            text = await scrape(r)
    assert raw.headers["x-speclane-backend"] == "b"
    assert (
        metric_value(text, "speclane_upstream_retries_total", backend="a", reason="status_502") == 1
    )
    assert (
        metric_value(text, "speclane_upstream_failures_total", backend="a", reason="status_502")
        == 1
    )
    assert metric_value(text, "speclane_requests_total", backend="b", status="200") == 1


async def test_refused_before_any_backend_is_booked_to_none(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        with pytest.raises(openai.NotFoundError):
            await r.client().chat.completions.create(model="missing", messages=CHAT)
        text = await scrape(r)
    assert metric_value(text, "speclane_requests_total", backend="none", status="404") == 1


async def test_ttft_counts_streams_only(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        client = r.client()
        await client.chat.completions.create(model="fake-model", messages=CHAT)
        text = await scrape(r)
        assert metric_value(text, "speclane_ttft_seconds_count", backend="fake") is None
        stream = await client.chat.completions.create(
            model="fake-model", messages=CHAT, stream=True
        )
        async for _ in stream:
            pass
        await wait_until(
            lambda: (
                metric_value(
                    r.services.metrics.render().decode(), "speclane_requests_total", status="200"
                )
                == 2
            )
        )
        text = await scrape(r)
    assert metric_value(text, "speclane_ttft_seconds_count", backend="fake") == 1
    assert metric_value(text, "speclane_request_duration_seconds_count", backend="fake") == 2


async def test_requests_are_booked_by_the_served_model_and_unknown_names_are_none(
    fake: FakeUpstream,
) -> None:
    async with run_router(router_settings(fake)) as r:
        client = r.client()
        await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
        for name in ("x1", "x2", "x3"):  # names nobody serves: no series of their own
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(model=name, messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
        text = await scrape(r)
    total = "speclane_requests_total"
    assert metric_value(text, total, model="fake-model", status="200", backend="fake") == 1
    assert metric_value(text, total, model="none", status="404") == 3
    assert "x1" not in text
