"""The real worker process on the prepared default model (short generations, run serially)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import openai
import psutil
import pytest

from router.lanes.blas import preload_env
from router.lanes.modelprep import DEFAULT_DRAFT_NAME, DEFAULT_MODEL_NAME
from tests.worker.conftest import (
    BATCH_SIZE,
    WorkerProcess,
    read_line,
    spawn,
    wait_ready,
    worker_command,
)

pytestmark = pytest.mark.realmodel

WAIT = 60.0
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
COUNTING = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
# A generation that cannot end early: both end-of-text tokens are banned (SmolLM2: 0 and 2).
ENDLESS = {"prompt": "Once upon a time", "max_tokens": 4096, "logit_bias": {"0": -100, "2": -100}}


def client(worker: WorkerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{worker.url}/v1", api_key="x", max_retries=0, timeout=120)


def health(worker: WorkerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"{worker.url}/health", timeout=10) as r:
        return json.loads(r.read())


def spec_of(usage: Any) -> dict[str, int]:
    return usage.model_extra["speclane_spec"]


async def wait_for(worker: WorkerProcess, predicate: Any, what: str) -> dict[str, Any]:
    """Poll /health (answered by the event loop, never blocked by decoding) until it holds."""
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            async with session.get(f"{worker.url}/health") as r:
                state = await r.json()
            if predicate(state):
                return state
            await asyncio.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}; last /health: {state}")


def measured_costs(reported: Any) -> bool:
    """A lane's measured draft-position costs: batch size -> seconds (none before it decodes)."""
    return isinstance(reported, dict) and all(
        size.isdigit() and isinstance(cost, int | float) for size, cost in reported.items()
    )


def test_ready_lines_name_the_mode_and_model(
    spec_worker: WorkerProcess, batch_worker: WorkerProcess
) -> None:
    for worker, mode in ((spec_worker, "speculative"), (batch_worker, "batching")):
        assert set(worker.ready) == {"port", "mode", "model"}
        assert (worker.ready["mode"], worker.ready["model"]) == (mode, DEFAULT_MODEL_NAME)
        assert worker.ready["port"] > 0


def test_health_reports_each_lane(spec_worker: WorkerProcess, batch_worker: WorkerProcess) -> None:
    reported = health(spec_worker)
    assert set(reported.pop("prompt_cache")) >= {"max_bytes", "bytes", "entries", "lookups"}
    index = reported.pop("suffix_index")
    assert set(index) == {
        "entries",
        "bytes",
        "max_bytes",
        "evicted",
        "partitions",
        "largest_partition_bytes",
    }
    assert index["max_bytes"] == 64 * 1024 * 1024
    assert isinstance(reported.pop("progress_tokens"), int)  # what the stall watch reads
    # Measured (auto): per batch size, once something decoded (the worker is the session's).
    assert measured_costs(reported.pop("draft_position_cost"))
    assert measured_costs(reported.pop("draft_pass_jump"))  # the step once wider than one
    # The draft model's cost: timed once a request could use it (None before).
    cost = reported.pop("draft_model_cost")
    assert cost is None or cost > 0
    assert isinstance(reported.pop("evidence_partitions"), int)
    assert reported == {
        "status": "ok",
        "mode": "speculative",
        "model": DEFAULT_MODEL_NAME,
        "draft_model": DEFAULT_DRAFT_NAME,
        "speculative": True,
        "num_draft_tokens": 3,
        "draft_source": "draft_model",
        "context_length": 8192,  # SmolLM2-135M's max_position_embeddings
        "architecture": "llama",
        "active": 0,
        "queued": 0,
        "capacity": 1,
        "pid": spec_worker.proc.pid,
    }
    batching = health(batch_worker)
    assert batching["draft_model"] is None
    assert measured_costs(batching["draft_position_cost"])
    assert measured_costs(batching["draft_pass_jump"])
    assert (batching["speculative"], batching["num_draft_tokens"]) == (False, 0)
    assert (batching["capacity"], batching["pid"]) == (BATCH_SIZE, batch_worker.proc.pid)
    models = client(spec_worker).models.list()
    assert [m.id for m in models.data] == [DEFAULT_MODEL_NAME]


def test_greedy_answer_and_honest_draft_statistics(spec_worker: WorkerProcess) -> None:
    reply = client(spec_worker).chat.completions.create(
        model=DEFAULT_MODEL_NAME, messages=FRANCE, max_tokens=16, temperature=0
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    usage = reply.usage
    assert usage is not None
    spec = spec_of(usage)
    assert spec["num_draft_tokens"] == 3
    assert spec["drafted"] > 0
    assert 0 <= spec["accepted"] <= spec["drafted"] <= 3 * spec["steps"]
    assert spec["rejected"] == spec["drafted"] - spec["accepted"]
    assert spec["accepted"] <= usage.completion_tokens <= 16
    # No ``prediction`` was sent: OpenAI's prediction counts are not the drafts'.
    assert usage.completion_tokens_details is None


def test_a_prediction_drafts_and_a_repeated_prompt_reuses_the_cache(
    spec_worker: WorkerProcess,
) -> None:
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    ask = client(spec_worker).chat.completions.create
    plain = ask(
        model=DEFAULT_MODEL_NAME,
        messages=messages,
        max_tokens=16,
        temperature=0,
        extra_body={"num_draft_tokens": 0},
    )
    text = plain.choices[0].message.content or ""
    predicted = ask(
        model=DEFAULT_MODEL_NAME,
        messages=messages,
        max_tokens=16,
        temperature=0,
        prediction={"type": "content", "content": text.replace("add", "sum", 1)},
    )
    assert predicted.choices[0].message.content == text  # lossless
    usage = predicted.usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert spec_of(usage)["source"] == "prediction"
    assert spec_of(usage)["accepted"] > 0
    assert usage.completion_tokens_details.accepted_prediction_tokens > 0
    # The same prompt again: everything but its last token came from the prompt cache.
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1


def test_zero_draft_tokens_decodes_without_the_draft(spec_worker: WorkerProcess) -> None:
    reply = client(spec_worker).chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=FRANCE,
        max_tokens=8,
        temperature=0,
        extra_body={"num_draft_tokens": 0},
    )
    assert reply.usage is not None
    assert spec_of(reply.usage) == {
        "drafted": 0,
        "accepted": 0,
        "rejected": 0,
        "steps": 0,
        "num_draft_tokens": 0,
        "source": None,
        "forced": 0,
    }
    assert reply.usage.completion_tokens_details is None
    assert "Paris" in (reply.choices[0].message.content or "")


def test_a_request_names_its_draft_source(spec_worker: WorkerProcess) -> None:
    """prompt_lookup on a lane configured with draft_model: that source drafts, and the text
    is plain decoding's (lossless); an unknown source is a 400 naming the field."""
    code = "def add(a, b):\n    return a + b\n"
    messages = [{"role": "user", "content": f"Repeat this code exactly:\n{code}"}]
    ask = client(spec_worker).chat.completions.create
    plain = ask(
        model=DEFAULT_MODEL_NAME,
        messages=messages,
        max_tokens=16,
        temperature=0,
        extra_body={"num_draft_tokens": 0},
    )
    looked = ask(
        model=DEFAULT_MODEL_NAME,
        messages=messages,
        max_tokens=16,
        temperature=0,
        extra_body={"draft_source": "prompt_lookup"},
    )
    assert looked.choices[0].message.content == plain.choices[0].message.content
    assert looked.usage is not None and plain.usage is not None
    assert spec_of(plain.usage)["source"] is None
    assert spec_of(looked.usage)["source"] == "prompt_lookup"
    assert spec_of(looked.usage)["num_draft_tokens"] == 8  # --lookup-max-draft's default
    with pytest.raises(openai.BadRequestError) as info:
        ask(
            model=DEFAULT_MODEL_NAME,
            messages=messages,
            max_tokens=4,
            extra_body={"draft_source": "prediction"},
        )
    assert info.value.body["param"] == "draft_source"  # type: ignore[index]


@pytest.mark.parametrize("lane", ["spec_worker", "batch_worker"])
def test_streaming_chat_with_usage(lane: str, request: pytest.FixtureRequest) -> None:
    worker: WorkerProcess = request.getfixturevalue(lane)
    stream = client(worker).chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=FRANCE,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1
    # Usage once, on the include_usage chunk (the last one), not also on the finish chunk.
    assert [c for c in chunks if c.usage is not None] == [chunks[-1]]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    drafted = spec_of(chunks[-1].usage)["drafted"]
    assert (drafted > 0) == (lane == "spec_worker")


def test_max_tokens_ends_with_length(batch_worker: WorkerProcess) -> None:
    reply = client(batch_worker).completions.create(
        model=DEFAULT_MODEL_NAME, prompt="1, 2, 3, 4,", max_tokens=4, temperature=0
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 4


@pytest.mark.parametrize("lane", ["spec_worker", "batch_worker"])
def test_stop_strings_truncate_the_output(lane: str, request: pytest.FixtureRequest) -> None:
    worker: WorkerProcess = request.getfixturevalue(lane)
    ask = {"model": DEFAULT_MODEL_NAME, "messages": COUNTING, "max_tokens": 12, "temperature": 0}
    full = client(worker).chat.completions.create(**ask).choices[0].message.content or ""
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop, f"the greedy answer is too short to cut: {full!r}"
    cut = client(worker).chat.completions.create(**ask, stop=[stop]).choices[0]
    assert cut.message.content == full[: full.find(stop)]
    assert cut.finish_reason == "stop"


async def test_batching_lane_decodes_two_requests_together(batch_worker: WorkerProcess) -> None:
    async with openai.AsyncOpenAI(
        base_url=f"{batch_worker.url}/v1", api_key="x", max_retries=0
    ) as api:

        async def ask(content: str) -> str:
            reply = await api.chat.completions.create(
                model=DEFAULT_MODEL_NAME,
                messages=[{"role": "user", "content": content}],
                max_tokens=16,
                temperature=0,
            )
            return reply.choices[0].message.content or ""

        both = asyncio.gather(ask("What is the capital of France?"), ask("Name a color."))
        state = await wait_for(batch_worker, lambda s: s["active"] == 2, "two active sequences")
        assert state["queued"] == 0
        answers = await both
        assert all(answers)
        assert "Paris" in answers[0]


@pytest.mark.parametrize("lane", ["spec_worker", "batch_worker"])
async def test_a_client_disconnect_stops_its_generation(
    lane: str, request: pytest.FixtureRequest
) -> None:
    worker: WorkerProcess = request.getfixturevalue(lane)
    async with aiohttp.ClientSession() as session:
        body = {**ENDLESS, "stream": True}
        response = await session.post(f"{worker.url}/v1/completions", json=body)
        assert (await response.content.readline()).startswith(b"data: ")
        assert health(worker)["active"] == 1
        response.close()
    await wait_for(worker, lambda s: s["active"] == 0 and s["queued"] == 0, "the lane to idle")
    again = client(worker).completions.create(model=DEFAULT_MODEL_NAME, prompt="Hi", max_tokens=2)
    assert again.usage is not None and again.usage.completion_tokens >= 1


async def test_sigterm_aborts_generation_and_exits_zero(
    prepared_models: tuple[Path, Path], worker_factory: Any
) -> None:
    # Its own worker: the test stops it.
    worker: WorkerProcess = worker_factory(worker_command(prepared_models[0], "batching"))
    async with aiohttp.ClientSession() as session:
        body = {**ENDLESS, "stream": True}
        response = await session.post(f"{worker.url}/v1/completions", json=body)
        assert (await response.content.readline()).startswith(b"data: ")
        worker.proc.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(response.content.read(), WAIT)
    assert await asyncio.to_thread(worker.proc.wait, 15) == 0
    assert b"data: [DONE]" in rest  # the stream was ended, not cut
    assert worker.proc.stdout is not None and worker.proc.stdout.read() == ""  # one line only


PARENT = """
import os, subprocess, sys
worker = subprocess.Popen(sys.argv[1:] + ["--parent-pid", str(os.getpid())])
print(worker.pid, flush=True)
worker.wait()
"""


def test_the_worker_exits_when_its_parent_dies(prepared_models: tuple[Path, Path]) -> None:
    # Its own worker, under a parent of its own that the test kills.
    command = worker_command(prepared_models[0], "batching")
    with tempfile.TemporaryFile("w+") as stderr:
        parent = spawn([sys.executable, "-c", PARENT, *command], stderr)
        assert parent.stdout is not None
        worker_pid = int(read_line(parent.stdout, 30))
        wait_ready(parent, stderr)
        parent.kill()  # like the router being SIGKILLed
        parent.wait()
        try:
            assert exited(worker_pid, timeout=15), "the worker outlived its parent"
        finally:
            if not exited(worker_pid, timeout=0):
                psutil.Process(worker_pid).kill()


def exited(pid: int, timeout: float) -> bool:
    """Gone, or a zombie (its parent is dead; in a container init may never reap it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def test_load_failure_exits_nonzero_with_a_reason(tmp_path: Path) -> None:
    done = subprocess.run(
        worker_command(tmp_path / "missing", "batching"),
        capture_output=True,
        text=True,
        env=preload_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert done.stdout == ""
    assert "cannot load the model" in done.stderr.strip().splitlines()[-1]
