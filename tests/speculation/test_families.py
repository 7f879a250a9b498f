"""The request-family classifier (pure, table-tested) and auto-disable judging families apart."""

from __future__ import annotations

from typing import Any

import pytest

from router.config.speculation import SpecSettings
from router.speculation.autodisable import AutoDisable, SpecKey
from router.speculation.families import (
    FAMILIES,
    LONG_BLOCK_LINES,
    classify_family,
    has_long_block,
    workload_key,
    workload_parts,
)
from router.speculation.record import Observation, SpecRecord, build_record

FUNCTION = "def f(x):\n" + "".join(f"    y{i} = x + {i}\n" for i in range(12)) + "    return y0\n"
FENCED = f"Change the return value:\n```python\n{FUNCTION}```\n"
QUOTED = "This fails:\n" + "".join(f"> line {i} of the traceback\n" for i in range(10))
SHORT_FENCE = "Why is `x` None here?\n```\nprint(x)\n```"


def user(content: Any, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": FENCED},  # only the last user counts
            {"role": "user", "content": content},
        ],
        **extra,
    }


@pytest.mark.parametrize(
    ("body", "family"),
    [
        (user("hi"), "chat"),
        (user("edit", prediction={"type": "content", "content": FUNCTION}), "prediction"),
        (
            user(
                "edit", prediction={"type": "content", "content": [{"type": "text", "text": "x"}]}
            ),
            "prediction",
        ),
        (user("edit", prediction={"type": "content", "content": ""}), "chat"),  # empty
        (user("edit", prediction={"type": "text", "content": "x"}), "chat"),  # malformed
        (user("edit", prediction="x"), "chat"),
        (
            user(
                FENCED, prediction={"type": "content", "content": "x"}, tools=[{"type": "function"}]
            ),
            "prediction",
        ),  # prediction comes first
        (user("weather?", tools=[{"type": "function"}]), "tools"),
        (user(FENCED, tools=[{"type": "function"}]), "tools"),
        (user("weather?", tools=[]), "chat"),
        (user("weather?", functions=[{"name": "f"}]), "tools"),
        # held to a grammar: a JSON answer, or tools the answer must call
        (user("json", response_format={"type": "json_object"}), "constrained"),
        (user("json", response_format={"type": "json_schema", "json_schema": {}}), "constrained"),
        (user("text", response_format={"type": "text"}), "chat"),
        (user("text", response_format="json_object"), "chat"),  # malformed
        (user("w?", tools=[{"type": "function"}], tool_choice="required"), "constrained"),
        (
            user("w?", tools=[{"type": "function"}], tool_choice={"type": "function"}),
            "constrained",
        ),  # a named function
        (user("w?", tools=[{"type": "function"}], tool_choice="auto"), "tools"),
        (user("w?", tools=[{"type": "function"}], tool_choice="none"), "tools"),
        (user("w?", tool_choice="required"), "chat"),  # nothing to call
        (user("w?", tools=[], tool_choice="required"), "chat"),
        (
            user(FENCED, tools=[{"type": "function"}], response_format={"type": "json_object"}),
            "constrained",
        ),
        (
            user(
                "e",
                prediction={"type": "content", "content": "x"},
                response_format={"type": "json_object"},
            ),
            "prediction",
        ),  # prediction still comes first
        (user(FENCED), "code-block"),
        (user(QUOTED), "code-block"),
        (user("Refactor:\n\n" + FUNCTION), "code-block"),  # indented lines
        (user(SHORT_FENCE), "chat"),
        (user([{"type": "text", "text": "see"}, {"type": "text", "text": FENCED}]), "code-block"),
        (user([{"type": "image_url", "image_url": {"url": "x"}}]), "chat"),
        (user(None), "chat"),
        (
            {
                "messages": [
                    {"role": "user", "content": FENCED},
                    {"role": "assistant", "content": "ok"},
                ]
            },
            "code-block",
        ),
        ({"messages": "not a list"}, "chat"),
        ({"messages": [None, 3, {"role": "user"}]}, "chat"),
        ({"prompt": FENCED}, "code-block"),
        ({"prompt": [FENCED]}, "code-block"),
        ({"prompt": [1, 2, 3]}, "chat"),
        ({}, "chat"),
    ],
)
def test_classify_family(body: dict[str, Any], family: str) -> None:
    assert classify_family(body) == family
    assert family in FAMILIES


@pytest.mark.parametrize(
    ("text", "long"),
    [
        ("```\n" + "x\n" * LONG_BLOCK_LINES + "```", True),
        ("```\n" + "x\n" * (LONG_BLOCK_LINES - 1) + "```", False),
        ("```\n" + "x" * 500 + "\n```", True),  # few lines but long
        ("```\n" + "x\n" * 20, True),  # an unterminated fence
        ("    a\n" * (LONG_BLOCK_LINES - 2) + "\n" + "    b\n" * 2, True),  # a blank line inside
        ("    a\n" * 3 + "prose\n" + "    b\n" * 3, False),
        ("", False),
    ],
)
def test_long_blocks(text: str, long: bool) -> None:
    assert has_long_block(text) is long


def test_workload_keys_round_trip() -> None:
    assert workload_key("aider", None, "code-block") == "aider:none:code-block"
    assert workload_parts("aider:none:code-block") == {
        "client": "aider",
        "preset": "none",
        "family": "code-block",
    }
    assert workload_parts("old:interactive") == {
        "client": "old",
        "preset": "interactive",
        "family": None,
    }


SETTINGS = SpecSettings(
    window_size=200,
    min_sample=100,
    off_threshold=0.30,
    on_threshold=0.45,
    speed_window=8,
    min_speed_samples=3,
    min_decode_tokens=16,
    off_speed_margin=0.05,
    on_speed_margin=0.10,
    probe_min_spacing=10,
    probe_initial=30,
    probe_max=600,
    probe_backoff=2.0,
    probes_to_enable=3,
    probe_min_drafted=16,
    probe_timeout=120,
    baseline_spacing=60,
)


def rec(acceptance: float, drafted: int = 50) -> SpecRecord:
    r = build_record(
        "speclane", "request", "draft", drafted=drafted, accepted=round(acceptance * drafted)
    )
    assert isinstance(r, SpecRecord)
    return r


def obs(tps: float, tokens: int = 101) -> Observation:
    return Observation(output_tokens=tokens, decode_seconds=(tokens - 1) / tps)


def test_one_family_of_a_client_keeps_speculation_while_another_loses_it() -> None:
    """The same client and preset: its edits (prompt lookup copies most of the answer) pay,
    its chat does not. With the family in the key, each ends where its own figures point."""
    auto = AutoDisable(SETTINGS)
    model = "smollm2-135m"
    edits = SpecKey("speculative", model, workload_key("aider", "interactive", "code-block"))
    chat = SpecKey("speculative", model, workload_key("aider", "interactive", "chat"))
    now = 1000.0
    for key in (edits, chat):  # plain decoding runs at 10 tok/s for both
        for _ in range(3):
            now += 1
            auto.record_baseline(model, key.workload, obs(10.0), now)
    for _ in range(20):  # interleaved, as one client sends them
        for key, acceptance, tps in ((edits, 0.8, 24.0), (chat, 0.15, 7.0)):
            now += 5
            verdict = auto.verdict(key, now)
            if verdict.use_speculation:
                auto.record(key, rec(acceptance), obs(tps), now, verdict.ticket)
            else:
                auto.record_baseline(model, key.workload, obs(10.0), now, verdict.ticket)
    assert auto.peek(edits, now).use_speculation
    assert not auto.peek(chat, now).use_speculation
    rows = {row["family"]: row for row in auto.snapshot(now)}
    assert (rows["code-block"]["state"], rows["chat"]["state"]) == ("on", "off")
    assert rows["chat"]["client"] == rows["code-block"]["client"] == "aider"


def test_a_lane_answer_without_drafting_is_a_plain_sample() -> None:
    """The client's num_draft_tokens 0 (or logits processors) on the speculative lane: its
    speed is plain decoding's, so it must not be judged as speculation's."""
    from types import SimpleNamespace

    from router.proxy.speculation import _ran_plain
    from router.speculation.record import NotReported

    lane = SimpleNamespace(lane="speculative")
    external = SimpleNamespace(lane=None)
    assert _ran_plain(lane, NotReported("speclane", "no_draft"))  # type: ignore[arg-type]
    assert not _ran_plain(lane, NotReported("speclane", "absent"))  # type: ignore[arg-type]
    assert not _ran_plain(lane, rec(0.5))  # type: ignore[arg-type]
    assert not _ran_plain(external, NotReported("lms", "no_draft"))  # type: ignore[arg-type]
