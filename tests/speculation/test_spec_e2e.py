"""Speculative telemetry and auto-disable end to end, over fake upstreams that report
statistics exactly where the real backends put them."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from router.kernel.worker_contract import STREAM_USAGE_FIELD
from router.speculation.keystate import SpecKey
from tests.conftest import (
    RunningRouter,
    fake_upstreams,
    lanes_router,
    metric_value,
    router_settings,
    run_router,
    wait_until,
)
from tests.fakes.upstream import Behaviour, FakeUpstream

CHAT = [{"role": "user", "content": "hi"}]
FAST_SPEC = {
    "window_size": 16,
    "min_sample": 8,
    "off_threshold": 0.3,
    "on_threshold": 0.45,
    "speed_window": 16,
    "min_speed_samples": 16,
    "probe_min_spacing": 0.05,
    "probe_initial": 0.1,
    "probe_max": 1.0,
    "probe_backoff": 2.0,
    "probes_to_enable": 2,
    "probe_min_drafted": 4,
    "baseline_spacing": 0,
}
# For run_cycle, which asserts that the request right after speculation turned off is
# routed around it: with the first probe due 0.1 s later, a pause of the machine between
# the two requests made that request the probe (seen once in a full run).
CYCLE_SPEC = {**FAST_SPEC, "probe_initial": 0.5}


def speclane_stats(
    drafted: int, accepted: int, source: str | None = None, chosen: str | None = None
) -> Behaviour:
    """A lane's answer; ``chosen``: the one source it drafted with under ``auto``, reported
    in its per-source breakdown."""
    spec: dict[str, Any] = {
        "drafted": drafted,
        "accepted": accepted,
        "rejected": drafted - accepted,
        "steps": 3,
        "num_draft_tokens": 3,
    }
    if source is not None:
        spec["source"] = source
    if chosen is not None:
        spec["sources"] = {chosen: {"drafted": drafted, "accepted": accepted, "steps": 3}}
    return Behaviour(usage_extra={"speclane_spec": spec})


def lmstudio_stats(drafted: int, accepted: int) -> Behaviour:
    stats = {
        "total_draft_tokens_count": drafted,
        "accepted_draft_tokens_count": accepted,
        "rejected_draft_tokens_count": drafted - accepted,
        "ignored_draft_tokens_count": 0,
    }
    return Behaviour(body_extra={"stats": stats})


def llamacpp_stats(drafted: int, accepted: int) -> Behaviour:
    timings = {
        "prompt_n": 7,
        "predicted_n": 5,
        "predicted_per_second": 40.0,
        "draft_n": drafted,
        "draft_n_accepted": accepted,
    }
    return Behaviour(final_extra={"timings": timings})


async def chat(r: RunningRouter, stream: bool = False) -> str:
    """One request; the backend that served it."""
    return (await chat_headers(r, stream))["x-speclane-backend"]


async def chat_headers(r: RunningRouter, stream: bool = False) -> Any:
    """One request; its response headers."""
    client = r.client()
    if stream:
        resp = await client.chat.completions.with_raw_response.create(
            model="fake-model", messages=CHAT, stream=True
        )
        async for _ in resp.parse():
            pass
    else:
        resp = await client.chat.completions.with_raw_response.create(
            model="fake-model", messages=CHAT
        )
    return resp.headers


async def metrics_text(r: RunningRouter) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"{r.url}/metrics") as resp:
        return await resp.text()


async def admin(r: RunningRouter, path: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(f"{r.url}/admin/{path}") as resp:
        assert resp.status == 200
        return await resp.json()


async def probe_due(r: RunningRouter, key: SpecKey) -> None:
    auto = r.services.spec.auto
    await wait_until(lambda: auto.peek(key, time.monotonic()).probe, 10)


async def run_cycle(
    r: RunningRouter,
    spec_fake: FakeUpstream,
    key: SpecKey,
    low: Behaviour,
    high: Behaviour,
    other: str,
    stream: bool = False,
) -> None:
    """Low acceptance turns the key off, probes come with back-off, high acceptance
    turns it back on."""
    spec_fake.behaviour = low
    assert await chat(r, stream) == key.backend  # first request speculates, 1/9 accepted
    assert not r.services.spec.auto.enabled(key)
    assert await chat(r, stream) == other  # off: routed around speculation
    seen = len(spec_fake.requests)
    await probe_due(r, key)
    probe = await chat_headers(r, stream)  # a probe, observed at the fake, and said so
    assert probe["x-speclane-backend"] == key.backend
    assert probe["x-speclane-decision"].endswith(f",spec-probe->{key.backend}")
    assert len(spec_fake.requests) == seen + 1
    assert await chat(r, stream) == other  # a bad probe: the next waits (backed off)
    spec_fake.behaviour = high
    for _ in range(2):  # probes_to_enable good probes
        await probe_due(r, key)
        assert await chat(r, stream) == key.backend
    assert r.services.spec.auto.enabled(key)
    assert await chat(r, stream) == key.backend


async def test_speculative_lane_turns_off_probes_and_recovers() -> None:
    async with (
        fake_upstreams("spec", "batch") as (spec, batch),
        lanes_router(
            spec, batch, spec=CYCLE_SPEC, lanes={"enabled": False, "draft_source": "draft_model"}
        ) as r,
    ):  # one source
        key = SpecKey("speculative", "fake-model", "default:none:chat")
        await run_cycle(r, spec, key, speclane_stats(9, 1), speclane_stats(9, 8), "batching")
        text = await metrics_text(r)
        snapshot = await admin(r, "spec")
    key_labels = {"backend": "speculative", "model": "fake-model", "workload": "default:none:chat"}
    assert metric_value(text, "speclane_spec_enabled", **key_labels) == 1
    assert (
        metric_value(
            text,
            "speclane_spec_state_changes_total",
            **key_labels,
            reason="low_acceptance",
            state="off",
        )
        == 1
    )
    assert (
        metric_value(
            text,
            "speclane_spec_state_changes_total",
            **key_labels,
            reason="probe_recovered",
            state="on",
        )
        == 1
    )
    assert metric_value(text, "speclane_spec_probes_total", **key_labels) == 3
    assert (metric_value(text, "speclane_spec_draft_tokens_total", **key_labels) or 0) > 0
    row = next(w for w in snapshot["workloads"] if w["backend"] == "speculative")
    assert row["state"] == "on" and row["changes"] == 2
    assert (row["client"], row["preset"], row["family"]) == ("default", "none", "chat")
    # These fake answers name no draft source: counted under their kind.
    assert (
        metric_value(
            text,
            "speclane_spec_source_tokens_total",
            backend="speculative",
            model="fake-model",
            source="draft",
            outcome="drafted",
        )
        or 0
    ) > 0
    assert batch.requests and all("num_draft_tokens" not in r.body for r in spec.requests)


async def test_one_client_two_families_judged_apart_under_auto() -> None:
    """Under ``auto`` both families ask the lane to choose and are keyed apart by family,
    each with source ``auto``: edits drafted with prompt lookup (kept 8 of 9), chat with
    the draft model (kept 1 of 9). Neither is turned off for its acceptance: the lane drafts
    only what it measures to pay. The per-source token counts name the sources it chose."""
    code = (
        "Fix this:\n```python\n"
        + "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(6))
        + "```\n"
    )
    edit = [{"role": "user", "content": code}]
    chat_key = SpecKey("speculative", "fake-model", "default:none:chat", "auto")
    edit_key = SpecKey("speculative", "fake-model", "default:none:code-block", "auto")
    async with (
        fake_upstreams("spec", "batch") as (spec, batch),
        lanes_router(spec, batch, spec=CYCLE_SPEC) as r,
    ):
        client = r.client()
        for i in range(3):
            spec.behaviour = speclane_stats(9, 8, "auto", "prompt_lookup")
            await client.chat.completions.create(model="fake-model", messages=edit)
            assert spec.requests[-1].body["draft_source"] == "auto"
            if i == 0:  # a window's worth of poor acceptance: not the router's to judge
                spec.behaviour = speclane_stats(9, 1, "auto", "draft_model")
                await client.chat.completions.create(model="fake-model", messages=CHAT)
                assert spec.requests[-1].body["draft_source"] == "auto"
        auto = r.services.spec.auto
        assert auto.enabled(edit_key) and auto.enabled(chat_key)
        # chat stays on the speculative lane, which is asked to choose again
        spec.behaviour = speclane_stats(9, 8, "auto", "prompt_lookup")
        assert (await chat_headers(r))["x-speclane-backend"] == "speculative"
        assert spec.requests[-1].body["draft_source"] == "auto"
        served = await client.chat.completions.with_raw_response.create(
            model="fake-model", messages=edit
        )
        assert served.headers["x-speclane-backend"] == "speculative"
        assert spec.requests[-1].body["draft_source"] == "auto"
        text = await metrics_text(r)
        snapshot = await admin(r, "spec")
    rows = {
        (w["family"], w["source"]): w
        for w in snapshot["workloads"]
        if w["backend"] == "speculative"
    }
    assert rows[("code-block", "auto")]["state"] == "on"
    assert rows[("chat", "auto")]["state"] == "on"
    assert len(rows) == 2
    for workload in ("default:none:code-block", "default:none:chat"):
        assert metric_value(text, "speclane_spec_enabled", workload=workload, source="auto") == 1
    assert (
        metric_value(
            text,
            "speclane_spec_draft_tokens_total",
            workload="default:none:code-block",
            source="auto",
        )
        == 36
    )
    for source, accepted in (("prompt_lookup", 5 * 8), ("draft_model", 1)):
        assert (
            metric_value(
                text, "speclane_spec_source_tokens_total", source=source, outcome="accepted"
            )
            == accepted
        )  # the edits' and chat's one try, by the source the lane chose


@pytest.mark.parametrize(
    ("kind", "low", "high", "stream"),
    [
        ("lmstudio", lmstudio_stats(9, 1), lmstudio_stats(9, 8), False),
        ("llamacpp", llamacpp_stats(9, 1), llamacpp_stats(9, 8), True),
    ],
)
async def test_external_speculative_backend_is_routed_around_and_back(
    kind: str, low: Behaviour, high: Behaviour, stream: bool
) -> None:
    async with fake_upstreams("lms", "plain") as (lms, plain):
        backends = [
            {"name": "lms", "kind": kind, "base_url": lms.base_url, "speculative": True},
            {"name": "plain", "kind": "openai", "base_url": plain.base_url},
        ]
        settings = router_settings(backends=backends, spec=CYCLE_SPEC)
        async with run_router(settings) as r:
            key = SpecKey("lms", "fake-model", "default:none:chat")
            await run_cycle(r, lms, key, low, high, "plain", stream=stream)
            text = await metrics_text(r)
    key_labels = {"backend": "lms", "model": "fake-model", "workload": "default:none:chat"}
    assert (metric_value(text, "speclane_spec_accepted_tokens_total", **key_labels) or 0) > 0
    assert (
        metric_value(
            text,
            "speclane_spec_state_changes_total",
            **key_labels,
            reason="low_acceptance",
            state="off",
        )
        == 1
    )


async def test_probes_back_off_while_acceptance_stays_at_zero() -> None:
    """A fixed source (under ``auto`` acceptance turns nothing off)."""
    lanes = {"enabled": False, "draft_source": "prompt_lookup"}
    async with (
        fake_upstreams("spec", "batch") as (spec, batch),
        lanes_router(spec, batch, spec=FAST_SPEC, lanes=lanes) as r,
    ):
        spec.behaviour = speclane_stats(9, 0, "prompt_lookup")
        key = SpecKey("speculative", "fake-model", "default:none:chat", "prompt_lookup")
        await chat(r)
        gaps, last = [], None
        for _ in range(4):
            await probe_due(r, key)
            started = time.monotonic()
            assert await chat(r) == "speculative"
            if last is not None:
                gaps.append(started - last)
            last = started
    # 0.1 s, then doubling: each gap at least the previous spacing, growing
    assert gaps[0] >= 0.19 and gaps[1] >= 0.39 and gaps[2] >= 0.79


@pytest.mark.parametrize(
    ("kind", "observation", "gauge"),
    [
        ("mlx_lm", "unobservable", -1),  # never reports drafts: cannot be observed
        ("ollama", "unobservable", -1),
        ("llamacpp", "not_observed", 0),  # could report draft_n and did not: observed false
    ],
)
async def test_backend_reporting_nothing_is_labelled_not_zero(
    kind: str, observation: str, gauge: int
) -> None:
    async with fake_upstreams("sp") as (up,):
        backends = [{"name": "sp", "kind": kind, "base_url": up.base_url, "speculative": True}]
        async with run_router(router_settings(backends=backends)) as r:
            for _ in range(20):
                await chat(r)
            text = await metrics_text(r)
            lanes = await admin(r, "lanes")
            spec = await admin(r, "spec")
    assert metric_value(text, "speclane_spec_draft_tokens_total") is None  # no fake zero
    status = next(b for b in lanes["backends"] if b["name"] == "sp")["speculation"]
    row = next(b for b in spec["backends"] if b["backend"] == "sp")
    assert {k: row[k] for k in status} == status  # both views say the same
    assert status["requested"] is True and status["observation"] == observation
    assert metric_value(text, "speclane_spec_observed", backend="sp") == gauge
    if observation == "unobservable":
        assert status["observed"] is None and status["observable"] is False
        assert status["reason"].startswith("cannot be observed on this backend")
        assert (
            metric_value(
                text,
                "speclane_spec_telemetry_unavailable_total",
                backend="sp",
                reason="not_supported",
            )
            == 20
        )
        # auto-disable cannot judge what it cannot see: no workload shown as "on"
        assert spec["workloads"] == []
    else:
        assert status["observed"] is False and status["observable"] is True
        assert "no draft tokens in the last 20 responses" in status["reason"]
        assert (
            metric_value(
                text, "speclane_spec_telemetry_unavailable_total", backend="sp", reason="absent"
            )
            == 20
        )


async def test_malformed_statistics_never_fail_the_request(fake: FakeUpstream) -> None:
    fake.behaviour = Behaviour(body_extra={"stats": {"total_draft_tokens_count": "lots"}})
    backends = [{"name": "fake", "kind": "lmstudio", "base_url": fake.base_url}]
    async with run_router(router_settings(backends=backends)) as r:
        assert await chat(r) == "fake"
        text = await metrics_text(r)
    assert (
        metric_value(
            text,
            "speclane_spec_telemetry_unavailable_total",
            backend="fake",
            reason="malformed_bad_type",
        )
        == 1
    )


async def test_a_lane_stream_without_usage_asked_still_reports_its_drafts() -> None:
    """A client that did not ask for usage gets none (as OpenAI's); the lane's figures ride on
    the finish chunk under speclane's own field, and the router counts them from there."""
    spec_stats = {"drafted": 9, "accepted": 8, "rejected": 1, "steps": 3, "num_draft_tokens": 3}
    ours = {"prompt_tokens": 7, "completion_tokens": 5, "speclane_spec": spec_stats}
    async with (
        fake_upstreams("spec", "batch") as (spec, batch),
        lanes_router(spec, batch, spec=FAST_SPEC, lanes={"enabled": False}) as r,
    ):
        spec.behaviour = Behaviour(final_extra={STREAM_USAGE_FIELD: ours})
        stream = await r.client().chat.completions.create(
            model="fake-model",
            messages=CHAT,
            stream=True,
            extra_headers={"X-Speclane-Lane": "speculative"},
        )
        chunks = [chunk async for chunk in stream]
        await wait_until(lambda: r.services.spec.auto.keys(), 10)  # observed
        text = await metrics_text(r)
    assert chunks and all(c.usage is None for c in chunks)
    drafted = metric_value(text, "speclane_spec_draft_tokens_total", backend="speculative")
    assert drafted == 9
