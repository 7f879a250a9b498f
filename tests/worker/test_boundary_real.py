"""Hostile fields against the real lane workers (issue #44): what reaches MLX is checked.

Each group (``logit_bias``, ``stop``, token-id prompts, every numeric field) gets
``CASES`` generated requests (seeded: the same cases every run), most of them at or past an
edge and a few inside every rule (those reach MLX: one token each). The properties, for
every case: a 200 or a 400 in the OpenAI shape, never a 5xx, never a traceback; and after
the group the worker process is alive and answers a plain request. A ``logit_bias`` id of
2**31-1 crashed the shared worker (SIGSEGV) before; one of 99,999,999 wrote outside the
logits and answered 200.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tests.fuzzing import examples
from tests.worker.conftest import WorkerProcess

pytestmark = pytest.mark.realmodel

CASES = examples(10_000)  # a group's, both lanes together
# Cases inside every rule reach MLX and cost a forward pass each: a fixed number per lane
# (edges first), the rest at or past an edge.
VALID_CASES = 12
VOCAB = 49152  # the default model's
CONCURRENCY = 8
PROMPT = [1, 2, 3]

EDGE_INTS: list[Any] = [
    -1, 0, 1, 2, VOCAB - 1, VOCAB, 2**31 - 1, 2**31, 99_999_999, 2**63 - 1, 2**63, 2**64 - 1,
    2**64, -(2**63), -(2**63) - 1, 10**30,
]  # fmt: skip
EDGE_NUMBERS: list[Any] = [*EDGE_INTS, 0.5, -0.0, 1e-300, 1e308, -1e308, 2.0000001, 100.5]
EDGE_OTHER: list[Any] = [True, False, None, "1", "", [], {}, [1], {"a": 1}]
KEY_TEXTS = [
    "²", "³¹", "①", "٣", "-1", "+1", " 1", "1 ", "1e3", "0x10", "1.0", "", "abc", "1" * 11,
    "1" * 5000, str(VOCAB), str(2**31 - 1), str(99_999_999), str(2**63),
]  # fmt: skip


def hostile(rng: random.Random) -> Any:
    pool = rng.choice([EDGE_INTS, EDGE_NUMBERS, EDGE_OTHER])
    return rng.choice(pool)


def logit_bias_case(rng: random.Random, valid: bool) -> dict[str, Any]:
    if valid:
        ids = rng.sample([0, 1, VOCAB - 1, rng.randrange(VOCAB)], rng.randint(1, 3))
        return {"logit_bias": {f"{i:0{rng.randint(1, 6)}d}": rng.uniform(-100, 100) for i in ids}}
    bias: dict[str, Any] = {}
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(KEY_TEXTS) if rng.random() < 0.7 else str(rng.randrange(VOCAB))
        bias[key] = hostile(rng) if rng.random() < 0.5 else rng.uniform(-100, 100)
    if all(k.isascii() and k.isdigit() and len(k) <= 10 and int(k) < VOCAB for k in bias):
        bias[str(VOCAB + rng.randrange(2**31))] = 1  # at least one fault
    return {"logit_bias": bias}


def stop_case(rng: random.Random, valid: bool) -> dict[str, Any]:
    def text(n: int) -> str:
        return "".join(rng.choice("ab \n<|>é✓\x00") for _ in range(n))

    if valid:
        return {"stop": [text(rng.randint(1, 40)) for _ in range(rng.randint(1, 16))]}
    faults: list[Callable[[], Any]] = [
        lambda: [text(3)] * 17,
        lambda: [text(1025)],
        lambda: "",
        lambda: [""],
        lambda: [text(2), hostile(rng)],
        lambda: hostile(rng),
        lambda: [[text(2)]],
    ]
    return {"stop": rng.choice(faults)()}


def prompt_case(rng: random.Random, valid: bool) -> dict[str, Any]:
    if valid:
        return {"prompt": [rng.choice([0, VOCAB - 1, rng.randrange(VOCAB)]) for _ in range(3)]}
    prompt: list[Any] = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 3))]
    prompt.insert(rng.randint(0, len(prompt)), hostile(rng))
    if all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < VOCAB for t in prompt):
        prompt.append(VOCAB)
    return {"prompt": rng.choice([prompt, [prompt], [prompt, prompt]])}


NUMERIC: dict[str, tuple[float, float | None, bool]] = {  # field: (lo, hi, integer)
    "temperature": (0, 2, False),
    "top_p": (0, 1, False),
    "top_k": (0, None, True),
    "min_p": (0, 1, False),
    "max_tokens": (1, 1, True),  # valid cases decode one token
    "seed": (-(2**63), 2**64 - 1, True),
    "presence_penalty": (-2, 2, False),
    "frequency_penalty": (-2, 2, False),
    "repetition_penalty": (0, 10, False),
    "num_draft_tokens": (0, 3, True),
    "n": (1, 1, True),
}


# (null is no limit at all: until the end of the context)
BOUNDED: dict[str, list[Any]] = {
    "max_tokens": [0, -1, 1.5, 2**64, True, "1", []],
    "n": [0, -1, 1.5, 2**31, 2**64, True, "1", []],
}


def numeric_case(rng: random.Random, valid: bool) -> dict[str, Any]:
    fields = rng.sample(sorted(NUMERIC), rng.randint(1, 4))
    body: dict[str, Any] = {}
    for name in fields:
        lo, hi, whole = NUMERIC[name]
        top = hi if hi is not None else 10**12
        if valid:
            edge = [lo, top, rng.uniform(lo, top)] if not whole else [lo, top, VOCAB, VOCAB - 1]
            value = rng.choice(edge)
            body[name] = int(min(max(value, lo), top)) if whole else float(value)
        elif name in BOUNDED:  # a hostile value that is a large valid count would decode for
            body[name] = rng.choice(BOUNDED[name])  # minutes: only faults here
        else:
            body[name] = hostile(rng)
    if not valid and all(inside(name, v) for name, v in body.items()):
        body["top_p"] = 1.5
    return body


def inside(name: str, value: Any) -> bool:
    lo, hi, whole = NUMERIC[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value is None
    if whole and not isinstance(value, int):
        return False
    return value >= lo and (hi is None or value <= hi) and not (name == "max_tokens" and value > 1)


GROUPS = {
    "logit_bias": logit_bias_case,
    "stop": stop_case,
    "prompt": prompt_case,
    "numeric": numeric_case,
}


WORKERS = {"batching": "batch_worker", "speculative": "spec_worker"}


async def send_all(url: str, bodies: list[bytes]) -> list[tuple[int, str]]:
    gate = asyncio.Semaphore(CONCURRENCY)
    timeout = aiohttp.ClientTimeout(total=120)

    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(body: bytes) -> tuple[int, str]:
            async with gate:
                async with session.post(
                    f"{url}/v1/completions",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as r:
                    return r.status, (await r.read()).decode(errors="replace")

        return await asyncio.gather(*(one(b) for b in bodies))


@pytest.mark.parametrize("group", sorted(GROUPS))
@pytest.mark.parametrize("lane", ["batching", "speculative"])
async def test_hostile_fields_never_crash_a_worker_nor_answer_5xx(
    group: str, lane: str, request: pytest.FixtureRequest
) -> None:
    worker: WorkerProcess = request.getfixturevalue(WORKERS[lane])
    rng = random.Random(f"{group}-{lane}")
    make = GROUPS[group]
    cases = []
    for i in range(CASES // 2):  # each lane half of the group's cases
        valid = i % (CASES // 2 // VALID_CASES) == 0
        body = {"prompt": PROMPT, "max_tokens": 1, **make(rng, valid)}
        if rng.random() < 0.1:
            body["stream"] = True
        cases.append((valid, json.dumps(body).encode()))  # json writes any integer
    answers = await send_all(worker.url, [b for _, b in cases])
    statuses = Counter(status for status, _ in answers)
    assert set(statuses) <= {200, 400}, statuses
    for (valid, body), (status, text) in zip(cases, answers, strict=True):
        assert "Traceback" not in text and 'File "' not in text, text[:500]
        if status == 400:
            assert json.loads(text)["error"]["type"] == "invalid_request_error", text[:300]
        if valid:
            assert status == 200, (body[:300], text[:300])
    assert worker.proc.poll() is None, worker.stderr_tail()
    plain = json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode()
    [(status, _)] = await send_all(worker.url, [plain])
    assert status == 200
