"""Cache-aware routing: fingerprints, the bounded map, the steering table, the classify hook."""

from __future__ import annotations

from typing import Any

import pytest

from router.config.policies import Policy
from router.config.presets import DEFAULT_PRESETS
from router.routing.affinity import (
    RULE,
    AffinityMap,
    AffinityThresholds,
    fingerprints,
    imbalanced,
    one_cache,
    steer,
    wait,
)
from router.routing.classify import RequestFacts, RoutingRules, classify
from router.routing.types import BackendView, Candidate, RouteRequest

MODEL = "m"
SYSTEM = {"role": "system", "content": "You are an agent. " * 200}
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


def chat(*messages: dict[str, Any], tools: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": list(messages)}
    if tools is not None:
        body["tools"] = tools
    return body


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_a_later_turn_extends_the_fingerprints_of_the_earlier_one() -> None:
    turn1 = fingerprints("chat", chat(SYSTEM, user("hi"), tools=TOOLS))
    turn2 = fingerprints(
        "chat",
        chat(SYSTEM, user("hi"), {"role": "assistant", "content": "yo"}, user("more"), tools=TOOLS),
    )
    assert len(turn1) == 2 and len(turn2) == 4
    assert turn2[:2] == turn1


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (chat(SYSTEM, user("hi"), tools=TOOLS), chat(SYSTEM, user("hi"))),  # tools differ
        (chat(SYSTEM, user("hi")), chat({"role": "system", "content": "other"}, user("hi"))),
        (chat(user("hi")), chat({"role": "assistant", "content": "hi"})),  # role counts
    ],
)
def test_a_different_prefix_shares_no_fingerprint(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert not set(fingerprints("chat", a)) & set(fingerprints("chat", b))


def test_key_order_does_not_matter_but_content_does() -> None:
    a = fingerprints("chat", chat({"content": "x", "role": "user"}))
    assert a == fingerprints("chat", chat({"role": "user", "content": "x"}))
    assert a != fingerprints("chat", chat({"role": "user", "content": "y"}))


def test_text_prompts_are_fingerprinted_by_blocks_and_others_not_at_all() -> None:
    long = "x" * 5000
    assert len(fingerprints("completions", {"prompt": long})) == 3
    assert (
        fingerprints("completions", {"prompt": long})[:2]
        == fingerprints("completions", {"prompt": long[:4096] + "y"})[:2]
    )
    assert fingerprints("completions", {"prompt": [1, 2, 3]}) == ()
    assert fingerprints("embeddings", {"input": "x"}) == ()
    assert fingerprints("chat", {"messages": "not a list"}) == ()


def test_the_map_finds_the_longest_known_prefix_and_stays_bounded() -> None:
    amap = AffinityMap(max_entries=4)
    t1 = fingerprints("chat", chat(SYSTEM, user("a")))
    t2 = fingerprints(
        "chat", chat(SYSTEM, user("a"), {"role": "assistant", "content": "b"}, user("c"))
    )
    assert amap.holder(t2) is None
    amap.record(t1, "speculative")
    assert amap.holder(t2) == "speculative"
    amap.record(t2, "batching")  # the conversation moved: the newest lane holds it
    assert amap.holder(t1) == "batching"
    amap.record(fingerprints("chat", chat(user("other"), user("x"), user("y"))), "speculative")
    assert len(amap) == 4
    with pytest.raises(ValueError):
        AffinityMap(0)


def lane(name: str, inflight: int = 0, capacity: int = 1, **kw: Any) -> BackendView:
    return BackendView(
        name=name,
        lane=name,
        models=frozenset({MODEL}),
        ready=True,  # type: ignore[arg-type]
        cooled_down=False,
        inflight=inflight,
        capacity=capacity,
        **kw,
    )


SPEC, BATCH = Candidate("speculative", "speculative", True), Candidate("batching", "batching")
EXT = Candidate("lms", "lms")
T = AffinityThresholds(abs_threshold=1, rel_threshold=1.5)
KEPT = "long-prompt"  # the rule's own choice, kept when affinity changes nothing


@pytest.mark.parametrize(
    ("name", "candidates", "holder", "spec_load", "batch_load", "first", "rule"),
    [
        ("no holder", (SPEC, BATCH), None, 0, 0, "speculative", KEPT),
        ("holder already first", (SPEC, BATCH), "speculative", 0, 0, "speculative", KEPT),
        ("holder batching, both idle", (SPEC, BATCH), "batching", 0, 0, "batching", RULE),
        ("holder batching below capacity", (SPEC, BATCH), "batching", 0, 5, "batching", RULE),
        # The spec lane runs one request: one running means one to wait for; 1 - 0 is not
        # more than abs_threshold 1, so affinity holds.
        (
            "holder spec busy, small imbalance",
            (BATCH, SPEC),
            "speculative",
            1,
            0,
            "speculative",
            RULE,
        ),
        ("holder spec, 2 ahead: load wins", (BATCH, SPEC), "speculative", 2, 0, "batching", KEPT),
        (
            "holder batching over capacity vs spec busy",
            (SPEC, BATCH),
            "batching",
            1,
            9,
            "batching",
            RULE,
        ),  # waits: batching 2, spec 1: 2 - 1 = 1, not more than 1
        (
            "holder batching far over capacity",
            (SPEC, BATCH),
            "batching",
            0,
            11,
            "speculative",
            KEPT,
        ),
        ("holder not a candidate (down)", (SPEC,), "batching", 0, 0, "speculative", KEPT),
        ("first is external", (EXT,), "batching", 0, 0, "lms", KEPT),
    ],
)
def test_steering_table(
    name: str,
    candidates: tuple[Candidate, ...],
    holder: str | None,
    spec_load: int,
    batch_load: int,
    first: str,
    rule: str,
) -> None:
    lanes = [lane("speculative", spec_load), lane("batching", batch_load, capacity=8)]
    out, out_rule = steer(candidates, KEPT, holder, lanes, T)
    assert (out[0].lane, out_rule) == (first, rule), name
    assert sorted(c.lane for c in out) == sorted(c.lane for c in candidates)  # only reordered


@pytest.mark.parametrize(
    ("holder_wait", "other_wait", "abs_t", "rel_t", "expected"),
    [
        (0, 0, 1, 1.5, False),
        (2, 0, 1, 1.5, True),
        (2, 1, 1, 1.5, False),
        (5, 3, 1, 1.5, True),
        (5, 4, 1, 1.5, False),
        (6, 4, 1, 1.5, False),
        (7, 4, 1, 1.5, True),
        (7, 4, 1, 2.0, False),
        (3, 0, 3, 1.0, False),
    ],
)
def test_imbalance_needs_both_thresholds(
    holder_wait: int, other_wait: int, abs_t: int, rel_t: float, expected: bool
) -> None:
    assert imbalanced(holder_wait, other_wait, AffinityThresholds(abs_t, rel_t)) is expected


def test_wait_counts_requests_ahead_beyond_capacity() -> None:
    assert [wait(lane("b", n, capacity=4)) for n in (0, 3, 4, 6)] == [0, 0, 1, 3]
    assert wait(lane("s", 0, capacity=1)) == 0 and wait(lane("s", 1, capacity=1)) == 1


def decide(
    holder: str | None,
    rules: RoutingRules | None = None,
    n: int = 1,
    preset_header: str | None = None,
    domain: str | None = None,
) -> tuple[str, str]:
    views = (
        lane("speculative", speculative=True, cache_domain=domain),
        lane("batching", capacity=8, cache_domain=domain),
    )
    facts = RequestFacts(
        RouteRequest("chat", MODEL, n=n), cache_holder=holder, preset_header=preset_header
    )
    result = classify(
        facts, Policy(client="c"), DEFAULT_PRESETS, views, rules=rules or RoutingRules()
    )
    return result.decision.candidates[0].lane, result.decision.reason


def test_classify_sends_a_conversation_back_to_the_lane_holding_it() -> None:
    assert decide(None) == ("speculative", "preset=none,spec-lane-free->speculative")
    assert decide("batching") == ("batching", "preset=none,cache-affinity->batching")
    assert decide("batching", RoutingRules(cache_affinity=False))[0] == "speculative"
    assert decide("speculative", n=2)[0] == "batching"  # the spec lane cannot decode n>1


def test_a_batching_preference_is_not_overridden_by_affinity() -> None:
    batching_presets = [p for p, spec in DEFAULT_PRESETS.items() if spec.lane == "batching"]
    if not batching_presets:
        pytest.skip("no default preset prefers batching")
    assert decide("speculative", preset_header=batching_presets[0])[0] == "batching"


def test_a_cached_prefix_never_overrules_a_shape_or_speculation_rule() -> None:
    from router.routing.classify import AFFINITY_MAY_OVERRULE, RULES

    assert AFFINITY_MAY_OVERRULE <= set(RULES)
    for rule in (
        "n>1",
        "long-prompt",
        "high-temperature",
        "short-output",
        "spec-inactive",
        "spec-not-paying",
        "spec-probe",
        "prefer-batching",
        "override",
    ):
        assert rule not in AFFINITY_MAY_OVERRULE


def test_the_same_conversation_in_two_partitions_shares_no_fingerprint() -> None:
    body = chat(SYSTEM, user("hi"), tools=TOOLS)
    alice = fingerprints("chat", body, "client:alice")
    assert alice == fingerprints("chat", body, "client:alice")
    assert not set(alice) & set(fingerprints("chat", body, "client:bob"))
    assert not set(alice) & set(fingerprints("chat", body))
    # the pair is encoded unambiguously: no partition name can pose as another endpoint
    assert fingerprints("completions", {"prompt": "x"}, "a") != fingerprints(
        "completions", {"prompt": "x"}, ""
    )
    affinity = AffinityMap()
    affinity.record(alice, "batching")
    assert affinity.holder(fingerprints("chat", body, "client:bob")) is None
    assert affinity.holder(alice) == "batching"


def test_lanes_of_one_worker_share_one_cache_and_nothing_is_held() -> None:
    """The shared layout: a prefix is found by either lane, so affinity stays out of the way
    and the decision says why."""
    assert decide("batching", domain="shared") == (
        "speculative",
        "preset=none,spec-lane-free->speculative,cache=shared",
    )
    assert decide(None, domain="shared")[1].endswith(",cache=shared")
    assert decide("batching") == ("batching", "preset=none,cache-affinity->batching")


def test_one_cache_needs_two_lanes_in_one_domain() -> None:
    shared = [lane("speculative", cache_domain="shared"), lane("batching", cache_domain="shared")]
    assert one_cache(shared)
    assert not one_cache(shared[:1])
    assert not one_cache([lane("speculative"), lane("batching")])
    assert not one_cache([shared[0], lane("batching", cache_domain="other")])
    external = BackendView(
        name="x", lane=None, models=frozenset({MODEL}), ready=True, cooled_down=False
    )
    assert one_cache([*shared, external])
