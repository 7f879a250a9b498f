"""The router with its two real MLX lanes on the embedded default model (slow, serial).

The session's router (``real_lanes_router``, tests/realmodel.py: ``python -m router serve``)
takes the requests, sent with the official openai client as a user's tool would send them.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME
from tests.conftest import metric_value
from tests.realmodel import Router, start_router, stop_router

pytestmark = pytest.mark.realmodel

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def router(real_lanes_router: Router) -> Router:
    return real_lanes_router


def ask(router: Router, lane: str, stream: bool, **body: object) -> tuple[str, dict, dict]:
    """(text, usage dict, response headers) for one greedy request forced onto ``lane``."""
    client = router.client()
    kwargs = dict(
        model=DEFAULT_MODEL_NAME,
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        extra_headers={"X-Speclane-Lane": lane},
        extra_body=body or None,
    )
    if not stream:
        raw = client.chat.completions.with_raw_response.create(**kwargs)  # type: ignore[arg-type]
        done = raw.parse()
        return done.choices[0].message.content or "", done.usage.model_dump(), dict(raw.headers)
    raw = client.chat.completions.with_raw_response.create(
        stream=True, stream_options={"include_usage": True}, **kwargs
    )  # type: ignore[arg-type]
    text, usage = "", {}
    for chunk in raw.parse():
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage.model_dump()
    return text, usage, dict(raw.headers)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_speculative_lane_answers_and_reports_drafts(router: Router, stream: bool) -> None:
    text, usage, headers = ask(router, "speculative", stream)
    assert "Paris" in text
    assert headers["x-speclane-lane"] == "speculative"
    spec = usage["speclane_spec"]
    # The lane chooses at every step; the default draft (the target's size) is never one.
    assert spec["source"] == "auto" and "draft_model" not in spec["sources"]
    assert 0 <= spec["accepted"] <= spec["drafted"]
    assert spec["rejected"] == spec["drafted"] - spec["accepted"]
    assert spec["drafted"] == sum(s["drafted"] for s in spec["sources"].values())
    assert usage["completion_tokens_details"] is None  # no ``prediction`` was sent


def test_the_lane_chooses_the_draft_at_every_step(router: Router) -> None:
    """Both families ask the lane to choose; a request quoting a file drafts by copying it
    (prompt lookup or the client's suffix index), counted per chosen source."""
    code = "```python\n" + "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(5))
    edit = [{"role": "user", "content": f"Repeat this code exactly:\n{code}```"}]
    client = router.client()
    answers = {}
    for family, messages in (("chat", QUESTION), ("code-block", edit)):
        done = client.chat.completions.create(
            model=DEFAULT_MODEL_NAME,
            messages=messages,
            max_tokens=24,  # type: ignore[arg-type]
            temperature=0,
            extra_headers={"X-Speclane-Lane": "speculative"},
        )
        answers[family] = done.usage.model_extra["speclane_spec"]  # type: ignore[union-attr]
    assert answers["chat"]["source"] == answers["code-block"]["source"] == "auto"
    copied = answers["code-block"]["sources"]
    assert sum(s["accepted"] for s in copied.values()) > 0 and "draft_model" not in copied
    text = router.metrics()
    assert any(
        (
            metric_value(
                text,
                "speclane_spec_source_tokens_total",
                backend="speculative",
                source=source,
                outcome="accepted",
            )
            or 0
        )
        > 0
        for source in ("prompt_lookup", "suffix")
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_batching_lane_answers_drafting_from_a_free_source(router: Router, stream: bool) -> None:
    """The batching lane drafts too (no draft model there): under ``auto`` it chooses among
    its free sources at every step."""
    text, usage, headers = ask(router, "batching", stream)
    assert "Paris" in text
    assert headers["x-speclane-lane"] == "batching"
    spec = usage["speclane_spec"]
    assert spec["source"] == "auto" and 0 <= spec["accepted"] <= spec["drafted"]


def test_the_batching_lanes_prompt_cache_reaches_usage_and_metrics(router: Router) -> None:
    for _ in range(2):  # the second request repeats the first: its prompt is in the cache
        _, usage, _ = ask(router, "batching", False)
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < usage["prompt_tokens"]
    deadline = time.monotonic() + 60  # until the supervisor's next /health poll
    while True:
        reused = metric_value(
            router.metrics(), "speclane_prompt_cache_tokens_total", lane="batching", kind="reused"
        )
        if (reused or 0) >= cached or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert reused is not None and reused >= cached
    hits = metric_value(
        router.metrics(), "speclane_prompt_cache_lookups_total", lane="batching", result="hit"
    )
    assert hits is not None and hits >= 1


def test_num_draft_tokens_zero_decodes_plainly_on_the_speculative_lane(router: Router) -> None:
    text, usage, _ = ask(router, "speculative", False, num_draft_tokens=0)
    assert "Paris" in text
    assert usage["speclane_spec"] == {
        "drafted": 0,
        "accepted": 0,
        "rejected": 0,
        "steps": 0,
        "num_draft_tokens": 0,
        "source": None,
        "forced": 0,
    }


def test_the_default_pair_starts_with_speculation_active(router: Router) -> None:
    import json
    import urllib.request

    with urllib.request.urlopen(router.base_url.removesuffix("/v1") + "/admin/lanes") as resp:
        lanes = {b["name"]: b for b in json.loads(resp.read())["backends"]}
    spec = lanes["speculative"]["speculation"]
    assert spec["requested"] is True and spec["active"] is True and spec["mode"] == "graceful"
    assert lanes["speculative"]["state"] == "ready" and lanes["batching"]["state"] == "ready"
    assert lanes["batching"]["speculation"]["requested"] is False
    # the draft the speculative lane loaded is named; the batching lane has none
    assert lanes["speculative"]["draft"].endswith("SmolLM2-135M-Instruct-draft")
    assert lanes["batching"]["draft"] is None
    assert metric_value(router.metrics(), "speclane_spec_active", backend="speculative") == 1


def test_auto_keeps_the_default_model_in_two_processes(router: Router) -> None:
    """Two copies of the default model take well under a quarter of this machine's memory."""
    import json
    import urllib.request

    with urllib.request.urlopen(router.base_url.removesuffix("/v1") + "/admin/lanes") as resp:
        data = json.loads(resp.read())
    assert (data["layout"]["requested"], data["layout"]["layout"]) == ("auto", "separate")
    assert data["layout"]["fits"] and data["layout"]["separate_bytes"] > 0
    assert sorted(w["lanes"][0] for w in data["workers"]) == ["batching", "speculative"]
    assert sorted(router.workers()) == ["batching", "speculative"]
    assert any("lanes layout separate (requested auto" in line for line in router.output)


def test_a_lane_at_work_alone_takes_both_cores(router: Router) -> None:
    """The separate layout's lanes share the cores as they work (router.worker.engines.cores): the
    speculative lane, serving while the batching lane idles, raised its OpenBLAS threads
    from its start's one to the machine's cores, and /admin/lanes shows it."""
    import json
    import os
    import urllib.request

    ask(router, "speculative", False)
    cores = min(2, len(os.sched_getaffinity(0)))
    deadline = time.monotonic() + 60
    while True:  # the supervisor's /health poll brings the worker's figures
        with urllib.request.urlopen(router.base_url.removesuffix("/v1") + "/admin/lanes") as r:
            worker = {w["lanes"][0]: w for w in json.loads(r.read())["workers"]}
        spec = worker["speculative"]
        if spec.get("blas_thread_changes") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert spec["blas_threads"] == cores
    assert spec["blas_thread_changes"] >= (1 if cores > 1 else 0)
    assert worker["batching"]["blas_threads"] >= 1


def test_metrics_show_the_speculative_lanes_draft_counters(router: Router) -> None:
    ask(router, "speculative", False)
    text = router.metrics()
    drafted = metric_value(text, "speclane_spec_draft_tokens_total", backend="speculative")
    accepted = metric_value(text, "speclane_spec_accepted_tokens_total", backend="speculative")
    assert drafted and drafted > 0
    assert accepted is not None and accepted <= drafted
    assert metric_value(text, "speclane_worker_up", lane="speculative") == 1


def test_killed_worker_is_restarted_while_the_other_lane_answers(router: Router) -> None:
    """On the session's router: it returns once the lane is back and answers, so the
    router is whole again for the tests after it."""
    victim = router.workers()["speculative"]
    restarts_before = (
        metric_value(router.metrics(), "speclane_worker_restarts_total", lane="speculative") or 0
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    # Meanwhile an unforced request is served by the batching lane.
    client = router.client()
    raw = client.chat.completions.with_raw_response.create(
        model=DEFAULT_MODEL_NAME, messages=QUESTION, max_tokens=8, temperature=0
    )
    assert raw.headers["x-speclane-lane"] == "batching"
    deadline = time.monotonic() + 180
    while True:
        workers = router.workers()
        new = workers.get("speculative")
        if (
            new is not None
            and new.pid != victim.pid
            and metric_value(router.metrics(), "speclane_worker_up", lane="speculative") == 1
        ):
            break
        assert time.monotonic() < deadline, "speculative worker was not restarted"
        time.sleep(0.5)
    assert (
        metric_value(router.metrics(), "speclane_worker_restarts_total", lane="speculative") or 0
    ) > restarts_before
    text, _, headers = ask(router, "speculative", False)
    assert "Paris" in text and headers["x-speclane-lane"] == "speculative"


def test_sigterm_leaves_no_worker_process(tmp_path: Path) -> None:
    router = start_router(tmp_path)  # its own: the test stops it
    workers = list(router.workers().values())
    assert len(workers) == 2
    stop_router(router)
    assert router.proc.returncode == 0
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive, f"workers survived SIGTERM: {[p.pid for p in alive]}"


def test_sigkill_of_the_router_leaves_no_worker_process(tmp_path: Path) -> None:
    router = start_router(tmp_path)  # its own: the test kills it
    workers = list(router.workers().values())
    router.proc.kill()
    router.proc.wait(10)
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive, f"workers outlived a SIGKILLed router: {[p.pid for p in alive]}"


def test_openai_shapes_through_the_router(router: Router) -> None:
    """#46 end to end: a stream nobody asked usage for carries none and its drafts are still
    counted; ``n=2`` goes to the batching lane and answers two choices; log-probabilities
    through the Responses door join to the text."""
    client = router.client()

    def drafted() -> float:
        """Speculative-lane requests whose usage the router read (their decode speed needs
        the completion tokens; drafts alone may be none: the lane drafts only where it pays)."""
        from prometheus_client.parser import text_string_to_metric_families

        return sum(
            sample.value
            for family in text_string_to_metric_families(router.metrics())
            for sample in family.samples
            if sample.name == "speclane_decode_tokens_per_second_count"
            and sample.labels.get("lane") == "speculative"
        )

    before = drafted()
    chunks = list(
        client.chat.completions.create(
            model=DEFAULT_MODEL_NAME,
            messages=QUESTION,  # type: ignore[arg-type]
            max_tokens=12,
            temperature=0,
            stream=True,
            extra_headers={"X-Speclane-Lane": "speculative"},
        )
    )
    assert chunks and all(c.usage is None for c in chunks)
    deadline = time.monotonic() + 10  # booked as the stream ends: a moment after [DONE]
    while drafted() <= before:
        assert time.monotonic() < deadline, "the stream's usage was not read"
        time.sleep(0.05)
    raw = client.chat.completions.with_raw_response.create(
        model=DEFAULT_MODEL_NAME,
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=4,
        temperature=0,
        n=2,
    )
    assert raw.headers["x-speclane-lane"] == "batching"
    reply = raw.parse()
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].message.content == reply.choices[1].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    response = client.responses.create(
        model=DEFAULT_MODEL_NAME, input="Say hello.", max_output_tokens=4, top_logprobs=2
    )
    part = response.output[0].content[0]  # type: ignore[union-attr]
    assert part.type == "output_text" and part.logprobs
    assert "".join(e.token for e in part.logprobs) == part.text
    assert all(len(e.top_logprobs) == 2 for e in part.logprobs)
