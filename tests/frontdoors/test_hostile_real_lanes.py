"""One client's hostile requests against the real lanes, through every door (issue #44).

The properties: no answer is a 5xx or carries a traceback; no lane is ever cooled down (the
cooldown counter does not move); and another client is served on both lanes right after.
The attack of the fourth round first (the requests that crashed both lanes, answered 500 and
cooled both lanes down, or held the tokenizer), repeated past the cooldown's allowed
failures; then generated numeric fields on every door (OpenAI chat and completions,
Responses, Anthropic, Ollama chat and generate).
"""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from typing import Any

import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME
from tests.conftest import metric_value
from tests.fuzzing import examples
from tests.realmodel import Router

pytestmark = pytest.mark.realmodel

MODEL = DEFAULT_MODEL_NAME
LANES = ("speculative", "batching")
CHAT = [{"role": "user", "content": "Say yes."}]
ATTACKS: list[tuple[dict[str, Any], int]] = [  # (fields, the answer's status)
    ({"logit_bias": {"2147483647": 1}}, 400),  # SIGSEGV in both lanes before
    ({"logit_bias": {"99999999": 1}}, 400),  # wrote outside the logits, answered 200
    ({"logit_bias": {"²": 1}}, 400),  # a 500 with the exception's text, retried 3 times
    ({"logit_bias": {"1" * 5000: 1}}, 400),
    ({"top_k": 10**12}, 200),  # filters nothing (mlx-lm raised: a 500 for the batch)
    ({"seed": -1}, 200),  # MLX takes unsigned seeds (a TypeError before)
    ({"seed": 2**64 - 1}, 200),
    ({"stop": ["x" * 5000]}, 400),
    ({"messages": [{"role": "user", "content": "y" * (3 << 20)}]}, 400),  # past the context
]


def post(router: Router, path: str, body: Any, lane: str | None = None) -> tuple[int, str]:
    root = router.base_url.removesuffix("/v1")
    headers = {"Content-Type": "application/json", "X-Speclane-Client": "hostile"}
    if lane is not None:
        headers["X-Speclane-Lane"] = lane
    request = urllib.request.Request(
        root + path, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def cooldowns(router: Router) -> float:
    text = router.metrics()
    return sum(
        metric_value(text, "speclane_backend_cooldowns_total", backend=b) or 0 for b in LANES
    )


def served_on_both_lanes(router: Router) -> None:
    for lane in LANES:
        body = {"model": MODEL, "messages": CHAT, "max_tokens": 2}
        status, text = post(router, "/v1/chat/completions", body, lane)
        assert status == 200, text[:300]


def test_the_attack_neither_crashes_nor_cools_a_lane_down(real_lanes_router: Router) -> None:
    router = real_lanes_router
    before = cooldowns(router)
    workers = router.workers()
    for _ in range(4):  # past the cooldown's allowed_fails (3)
        for lane in LANES:
            for attack, expected in ATTACKS:
                body = {"model": MODEL, "messages": CHAT, "max_tokens": 2, **attack}
                status, text = post(router, "/v1/chat/completions", body, lane)
                assert status == expected, (attack.keys(), text[:300])
                assert "Traceback" not in text
    assert router.workers().keys() == workers.keys()
    assert all(p.is_running() for p in router.workers().values())
    assert cooldowns(router) == before
    served_on_both_lanes(router)


# --- numeric fields of every door --------------------------------------------------------

FAULTS: list[Any] = [-1, -(2**63) - 1, 2**64, 10**30, 1e308, -1e308, 1.5, True, "1", [], {}]
LIMIT_FAULTS: list[Any] = [0, 1.5, True, "1", [], 2**64, 10**30]  # never a large valid limit
DOORS: dict[str, tuple[str, dict[str, Any], str, dict[str, list[Any]]]] = {
    # door: (path, body, where the numbers go ("" top level, else that object), fields)
    "chat": (
        "/v1/chat/completions",
        {"messages": CHAT, "max_tokens": 1},
        "",
        {
            "temperature": [0, 2, 0.7],
            "top_p": [0, 1, 0.5],
            "top_k": [0, 1, 49151, 49152, 10**12],
            "min_p": [0, 1],
            "seed": [0, -(2**63), 2**64 - 1],
            "presence_penalty": [-2, 2],
            "frequency_penalty": [-2, 2],
            "repetition_penalty": [0.5, 1, 2],
            "max_tokens": [1],
            "n": [1],
        },
    ),
    "completions": (
        "/v1/completions",
        {"prompt": "Say yes.", "max_tokens": 1},
        "",
        {"temperature": [0, 2], "top_p": [0, 1], "seed": [0, 2**64 - 1], "max_tokens": [1]},
    ),
    "responses": (
        "/v1/responses",
        {"input": "Say yes.", "max_output_tokens": 1},
        "",
        {"temperature": [0, 2], "top_p": [0, 1], "max_output_tokens": [1]},
    ),
    "anthropic": (
        "/v1/messages",
        {"messages": CHAT, "max_tokens": 1},
        "",
        {"temperature": [0, 1], "top_p": [0, 1], "top_k": [0, 1, 10**12], "max_tokens": [1]},
    ),
    "ollama-chat": (
        "/api/chat",
        {"messages": CHAT, "stream": False, "options": {"num_predict": 1}},
        "options",
        {
            "temperature": [0, 2],
            "top_k": [0, 1, 10**12],
            "top_p": [0, 1],
            "min_p": [0, 1],
            "seed": [0, 2**63 - 1],
            "repeat_penalty": [0.5, 1, 2],
            "num_predict": [1],
        },
    ),
    "ollama-generate": (
        "/api/generate",
        {"prompt": "Say yes.", "stream": False, "options": {"num_predict": 1}},
        "options",
        {"temperature": [0, 2], "top_k": [0, 10**12], "seed": [0], "num_predict": [1]},
    ),
}
LIMITS = {"max_tokens", "max_output_tokens", "num_predict", "n"}
# Per door. Doors ignore some fields they do not know in a type they do not expect (Ollama's
# options), so many cases reach a lane and decode: a few hundred per door here; the doors'
# translations get 10,000 cases each before a scripted lane (test_fuzz_doors.py), and the
# lane's own boundary 10,000 per field group (tests/worker/test_boundary_real.py).
CASES = examples(300)
VALID_CASES = 6  # per door, inside every rule


@pytest.mark.parametrize("door", sorted(DOORS))
def test_numeric_fields_of_every_door_never_5xx_nor_cool_a_lane_down(
    real_lanes_router: Router, door: str
) -> None:
    router = real_lanes_router
    path, base, where, fields = DOORS[door]
    rng = random.Random(door)
    before = cooldowns(router)
    for i in range(CASES):
        valid = i % (CASES // VALID_CASES) == 0
        body = json.loads(json.dumps({"model": MODEL, **base}))
        target = body.setdefault(where, {}) if where else body
        for name in rng.sample(sorted(fields), rng.randint(1, 3)):
            if valid:
                target[name] = rng.choice(fields[name])
            else:
                target[name] = rng.choice(LIMIT_FAULTS if name in LIMITS else FAULTS)
        status, text = post(router, path, body, LANES[i % 2])
        assert status < 500, (door, body, text[:300])
        assert "Traceback" not in text and 'File "' not in text, text[:300]
        if valid:
            assert status == 200, (door, body, text[:300])
    assert cooldowns(router) == before
    served_on_both_lanes(router)
