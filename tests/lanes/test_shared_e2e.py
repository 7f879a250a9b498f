"""The router with its two lanes in ONE real worker process (the shared layout), on the
embedded default model (slow, serial).

The router runs with ``layout = "auto"`` and its machine memory overridden to 8 GiB: two
copies of the default model would take over a quarter of that, so auto shares. Then: both
lanes answer as before, a conversation's prefix cached through one lane is found by the
other, a killed worker brings both lanes back, SIGTERM leaves no process; and the guard
refuses a setup that does not fit before starting anything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME, ensure_default_models
from tests.conftest import metric_value
from tests.lanes.test_lanes_e2e import ask
from tests.realmodel import Router, start_router, stop_router

pytestmark = pytest.mark.realmodel

SMALL_MACHINE = "machine_memory_bytes = 8589934592\n"  # 8 GiB: auto picks shared


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    """Its own router: one worker process serving both lanes (the layout on a small machine)."""
    r = start_router(tmp_path_factory.mktemp("shared"), SMALL_MACHINE)
    yield r
    stop_router(r)


def admin_lanes(router: Router) -> dict[str, Any]:
    with urllib.request.urlopen(router.base_url.removesuffix("/v1") + "/admin/lanes") as resp:
        return json.loads(resp.read())


def test_auto_shares_one_process_when_two_copies_take_a_quarter_of_the_memory(
    router: Router,
) -> None:
    lanes = admin_lanes(router)
    layout = lanes["layout"]
    assert (layout["requested"], layout["layout"], layout["total_bytes"]) == (
        "auto",
        "shared",
        8 << 30,
    )
    assert layout["shared_bytes"] < layout["separate_bytes"] and layout["fits"]
    assert list(router.workers()) == ["shared"]  # one process
    states = {b["name"]: b["state"] for b in lanes["backends"]}
    assert states == {"speculative": "ready", "batching": "ready"}
    assert any("lanes layout shared (requested auto" in line for line in router.output)


@pytest.mark.parametrize("lane", ["speculative", "batching"])
def test_both_lanes_answer_from_the_one_process(router: Router, lane: str) -> None:
    for stream in (False, True):
        text, usage, headers = ask(router, lane, stream)
        assert "Paris" in text and headers["x-speclane-lane"] == lane
        # both lanes choose their draft at every step (the batching lane among free sources)
        spec = usage["speclane_spec"]
        assert spec["source"] == "auto" and 0 <= spec["accepted"] <= spec["drafted"]
        assert "draft_model" not in spec.get("sources", {})


def test_alternating_turns_keep_their_cache_and_affinity_is_off(router: Router) -> None:
    client = router.client()
    fresh = {"role": "system", "content": "You name things, one word each time. " * 20}
    messages: list[Any] = [fresh, {"role": "user", "content": "Name a colour."}]
    hits = []
    for turn, lane in enumerate(("speculative", "batching", "speculative")):
        raw = client.chat.completions.with_raw_response.create(
            model=DEFAULT_MODEL_NAME,
            messages=messages,
            max_tokens=6,
            temperature=0,
            extra_headers={"X-Speclane-Lane": lane},
        )
        done = raw.parse()
        details = done.usage.prompt_tokens_details  # type: ignore[union-attr]
        hits.append((details.cached_tokens or 0) if details else 0)
        messages += [
            {"role": "assistant", "content": done.choices[0].message.content or ""},
            {"role": "user", "content": f"And another one ({turn})?"},
        ]
    assert hits[0] < 10 and hits[1] > 100 and hits[2] > hits[1]
    # Unforced, the decision routes by load and speculation value and says why.
    raw = client.chat.completions.with_raw_response.create(
        model=DEFAULT_MODEL_NAME, messages=messages, max_tokens=4, temperature=0
    )
    assert raw.headers["x-speclane-decision"].endswith(",cache=shared")


def test_worker_memory_is_in_metrics_and_admin(router: Router) -> None:
    deadline = time.monotonic() + 60  # until the supervisor's next /health poll
    while True:
        pss = metric_value(
            router.metrics(),
            "speclane_worker_memory_bytes",
            lanes="speculative+batching",
            kind="pss",
        )
        if pss or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert pss and pss > 100 << 20
    (worker,) = admin_lanes(router)["workers"]
    assert worker["lanes"] == ["speculative", "batching"]
    assert worker["rss_bytes"] >= worker["pss_bytes"] > 0
    assert metric_value(router.metrics(), "speclane_lanes_layout", layout="shared") == 1


def test_a_killed_worker_brings_both_lanes_back(router: Router) -> None:
    victim = router.workers()["shared"]
    before = {
        lane: metric_value(router.metrics(), "speclane_worker_restarts_total", lane=lane) or 0
        for lane in ("speculative", "batching")
    }
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    deadline = time.monotonic() + 240
    while True:
        new = router.workers().get("shared")
        text = router.metrics()
        if (
            new is not None
            and new.pid != victim.pid
            and all(
                metric_value(text, "speclane_worker_up", lane=lane) == 1
                for lane in ("speculative", "batching")
            )
        ):
            break
        assert time.monotonic() < deadline, "the shared worker was not restarted"
        time.sleep(0.5)
    for lane, count in before.items():
        assert (
            metric_value(router.metrics(), "speclane_worker_restarts_total", lane=lane) or 0
        ) > count
    for lane in ("speculative", "batching"):
        text, _, headers = ask(router, lane, False)
        assert "Paris" in text and headers["x-speclane-lane"] == lane


def test_sigterm_leaves_no_worker_process(router: Router) -> None:
    """The module's router, stopped: keep this the last test here that uses it."""
    workers = list(router.workers().values())
    assert len(workers) == 1
    stop_router(router)
    assert router.proc.returncode == 0
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive, f"workers survived SIGTERM: {[p.pid for p in alive]}"


def test_the_guard_refuses_a_setup_that_does_not_fit_and_starts_nothing(tmp_path: Path) -> None:
    ensure_default_models(quiet=True)
    (tmp_path / "policies").mkdir()
    config = tmp_path / "speclane.toml"
    config.write_text(
        f'policies_dir = "{tmp_path}/policies"\n[lanes]\nmemory_limit_bytes = 1073741824\n'
    )  # 1 GiB: too little
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
    done = subprocess.run(
        [sys.executable, "-m", "router", "serve", "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    line = next(x for x in output.splitlines() if "the lanes need about" in x)
    assert "GiB may be used (lanes.memory_limit_bytes)" in line
    assert 'layout = "shared"' in line
    assert "worker[" not in output and "listening on" not in output  # nothing started
