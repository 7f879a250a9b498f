"""The Grafana dashboard and the Prometheus rules against a real Prometheus (Debian's).

A router with fake upstreams (two fake lanes, the speculative one reporting drafts; an
external backend that fails) and a real lane supervisor running the fake worker (killed
once, so that restarts exist) serves traffic of every kind: streams, answers, 5xx with
retries, a queue and 429s. Prometheus scrapes it every second and evaluates the rules; then
every panel's and every rule's expression goes through the query API: each must parse and
return data (an alert's expression is run without its threshold: the signal must exist;
whether it fires depends on the figures). ``promtool check rules`` must pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from router.bench.common import procs
from router.lanes.group import apply_status, lane_backend
from router.lanes.process import WorkerCommand
from router.lanes.status import LaneState, LaneStatus
from router.lanes.supervisor import LaneSupervisor
from tests.conftest import RunningRouter, lanes_router
from tests.fakes.upstream import Behaviour, FakeUpstream

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "examples" / "prometheus" / "speclane-rules.yml"
DASHBOARD = REPO / "examples" / "grafana" / "speclane.json"
FAKE_WORKER = REPO / "tests" / "fakes" / "fake_worker.py"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
CHAT = [{"role": "user", "content": "hi"}]
THRESHOLD = re.compile(r"^(?P<signal>.+?)\s*(==|!=|>=|<=|>|<)\s*[-+0-9.e]+\s*$", re.S)

needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="needs the prometheus and promtool binaries (Debian package 'prometheus'; "
    "./docker-less-run.sh test installs it)",
)


def panel_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel '{panel['title']}' {target['refId']}", target["expr"]))
    return found


PARSE_ONLY = " (parse)"  # an alert's whole expression: must parse; empty while it does not fire


def rule_exprs() -> list[tuple[str, str]]:
    found = []
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            name = rule.get("record") or rule["alert"]
            expr = rule["expr"].strip()
            if "alert" in rule:
                m = THRESHOLD.match(expr)
                assert m is not None, f"alert {name}: expected 'signal op number'"
                found.append((f"alert {name}{PARSE_ONLY}", expr))
                expr = m.group("signal")
            found.append((f"rule {name}", expr))
    return found


def test_dashboard_and_rules_are_there() -> None:
    assert len(panel_exprs()) >= 20
    assert len(rule_exprs()) >= 19
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "speclane"
    assert all(
        p["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in dash["panels"] if p["type"] != "row"
    )


@needs_prometheus
def test_promtool_check_rules() -> None:
    done = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def prometheus(tmp: Path, target_port: int):  # type: ignore[no-untyped-def]
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {
                        "job_name": "speclane",
                        "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}],
                    }
                ],
            }
        )
    )
    proc = await asyncio.create_subprocess_exec(
        str(PROMETHEUS),
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await procs.stop(proc, 20)


async def query(s: aiohttp.ClientSession, base: str, expr: str) -> dict[str, Any]:
    async with s.get(f"{base}/api/v1/query", params={"query": expr}) as resp:
        return await resp.json()


async def until(check: Any, deadline: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not await check():
        assert loop.time() < end, f"{what} not reached within {deadline:g}s"
        await asyncio.sleep(0.5)


async def traffic(r: RunningRouter) -> None:
    client = r.client()
    for _ in range(3):
        stream = await client.chat.completions.create(
            model="fake-model", messages=CHAT, stream=True, stream_options={"include_usage": True}
        )
        async for _ in stream:
            pass
    await client.chat.completions.create(
        model="fake-model", messages=CHAT, extra_headers={"X-Speclane-Lane": "batching"}
    )
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="flaky-model", messages=CHAT)
    # three at once for a client limited to one with a short queue timeout: 429s
    results = await asyncio.gather(
        *(
            client.chat.completions.create(
                model="fake-model", messages=CHAT, extra_headers={"X-Speclane-Lane": "batching"}
            )
            for _ in range(3)
        ),
        return_exceptions=True,
    )
    assert any(isinstance(x, openai.RateLimitError) for x in results), results


@contextlib.asynccontextmanager
async def supervised_fake_worker(r: RunningRouter):  # type: ignore[no-untyped-def]
    """A real supervisor of the fake worker, reporting into the router's metrics (its
    worker_* series); the fake lanes in the pool keep serving the traffic."""
    metrics, settings = r.services.metrics, r.services.settings
    shadow = lane_backend("speculative", settings, "fake-model")  # not in the pool
    ready = asyncio.Event()

    def on_change(status: LaneStatus) -> None:
        apply_status(shadow, status, metrics)
        if status.state is LaneState.READY:
            ready.set()

    argv = (
        sys.executable,
        str(FAKE_WORKER),
        "--mode",
        "speculative",
        "--model",
        "fake-model",
        "--draft-model",
        "fake-draft",
        "--port",
        "0",
        "--parent-pid",
        str(os.getpid()),
    )
    sup = LaneSupervisor(
        WorkerCommand("speculative", argv, {**os.environ}),
        startup_timeout=30,
        health_interval=0.2,
        backoff_initial=0.05,
        backoff_max=0.2,
        kill_grace=1.0,
        metrics=metrics,
        on_change=on_change,
    )
    await sup.start()
    try:
        await asyncio.wait_for(ready.wait(), 30)
        ready.clear()
        first = sup.status.pid
        assert first is not None
        os.kill(first, 9)  # a crash: the supervisor restarts it (worker_restarts_total)
        await asyncio.wait_for(ready.wait(), 30)
        assert sup.status.pid != first
        yield
    finally:
        await sup.stop(grace=1.0)


@needs_prometheus
async def test_every_panel_and_rule_expression_returns_data(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "default.toml").write_text(
        'client = "default"\nmax_concurrency = 1\nqueue_timeout = 0.05\n'
        "allow_lane_override = true\n"
    )
    spec, batch = FakeUpstream(name="spec"), FakeUpstream(name="batch")
    flaky = FakeUpstream(name="flaky", models=("flaky-model",))
    spec.behaviour = Behaviour(
        chunks=12,
        interval=0.005,
        usage_extra={
            "speclane_spec": {
                "drafted": 12,
                "accepted": 5,
                "rejected": 7,
                "steps": 4,
                "num_draft_tokens": 3,
            }
        },
    )
    batch.behaviour = Behaviour(chunks=8, delay_headers=0.5)  # holds its slot a while
    flaky.behaviour = Behaviour(status=500)
    for f in (spec, batch, flaky):
        await f.start()
    exprs = panel_exprs() + rule_exprs()
    missing: dict[str, Any] = {}
    try:
        external = [{"name": "flaky", "kind": "openai", "base_url": flaky.base_url}]
        async with (
            lanes_router(spec, batch, backends=external, policies_dir=str(policies)) as r,
            supervised_fake_worker(r),
            prometheus(tmp_path, r.port) as prom,
            aiohttp.ClientSession() as s,
        ):
            await traffic(r)

            async def everything_answers() -> bool:
                missing.clear()
                for name, expr in exprs:
                    answer = await query(s, prom, expr)
                    if answer.get("status") != "success":
                        missing[name] = answer.get("error") or answer
                    elif not answer["data"]["result"] and not name.endswith(PARSE_ONLY):
                        missing[name] = f"no data: {expr}"
                return not missing

            # rate() over [5m] needs two scrapes after the traffic; the recording rules
            # one evaluation more: a few seconds at 1 s intervals
            await until(everything_answers, 60, "data for every expression")
    finally:
        for f in (spec, batch, flaky):
            await f.stop()
        if missing:
            print(json.dumps(missing, indent=2))
    assert not missing
