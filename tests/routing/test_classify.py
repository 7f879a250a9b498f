"""The classification decision: a table of cases, then properties over random inputs."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.config.policies import Policy
from router.config.presets import DEFAULT_PRESETS, PresetSpec
from router.kernel.errors import RouterError
from router.routing.classify import (
    RULES,
    SPECULATION_PAYS,
    Classification,
    RequestFacts,
    RoutingRules,
    SpecAdvice,
    classify,
    log_line,
)
from router.routing.load import LoadGate
from router.routing.types import BackendView, RouteRequest
from tests.fuzzing import examples

PRESETS = {
    **DEFAULT_PRESETS,
    "creative": PresetSpec(lane="auto", defaults={"temperature": 1.5}),
    "chatty": PresetSpec(lane="speculative", defaults={"temperature": 0.2, "max_tokens": 512}),
}
MODEL = "m"


def view(name: str, lane: str | None, **kw: Any) -> BackendView:
    base: dict[str, Any] = {"models": frozenset({MODEL}), "ready": True, "cooled_down": False}
    if lane == "speculative":
        base["speculative"] = True
    base.update(kw)
    return BackendView(name=name, lane=lane, **base)  # type: ignore[arg-type]


PRESENT: dict[str, Any] = {}  # a backend with the defaults of ``view``


def snapshot(
    spec: dict[str, Any] | None = PRESENT,
    batch: dict[str, Any] | None = PRESENT,
    ext: dict[str, Any] | None = None,
) -> tuple[BackendView, ...]:
    """The two lanes and optionally an external backend 'lms' (which also serves 'emb' and
    'q@q4_k_m'); each dict changes that backend's fields, ``None`` leaves it out."""
    views = []
    if spec is not None:
        views.append(view("speculative", "speculative", **spec))
    if batch is not None:
        views.append(view("batching", "batching", **batch))
    if ext is not None:
        ext = {"models": frozenset({MODEL, "emb", "q@q4_k_m"}), **ext}
        views.append(view("lms", None, **ext))
    return tuple(views)


@dataclass(frozen=True)
class Case:
    id: str
    expect: str | int  # the first candidate's lane, or the error's HTTP status
    rule: str  # labels["rule"], or the error's code
    model: str = MODEL
    endpoint: str = "chat"
    preset: str | None = None
    lane: str | None = None
    n: int = 1
    temperature: float | None = None
    max_tokens: int | None = None
    prompt_chars: int = 0
    policy: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] | None = field(default_factory=dict)
    batch: dict[str, Any] | None = field(default_factory=dict)
    ext: dict[str, Any] | None = None
    gate_busy: bool = False
    advice: SpecAdvice = SPECULATION_PAYS
    family: str = "chat"


CASES = [
    # presets and models
    Case("idle-interactive", "speculative", "spec-lane-free", preset="interactive"),
    Case("idle-no-preset-auto", "speculative", "spec-lane-free"),
    Case("throughput-header", "batching", "prefer-batching", preset="throughput"),
    Case("preset-header-case-insensitive", "batching", "prefer-batching", preset=" Throughput "),
    Case("model-suffix-preset", "batching", "prefer-batching", model="m@throughput"),
    Case(
        "header-beats-suffix",
        "speculative",
        "spec-lane-free",
        preset="interactive",
        model="m@throughput",
    ),
    Case("unknown-preset-header", 400, "unknown_preset", preset="turbo"),
    Case("unknown-preset-suffix", 400, "unknown_preset", model="m@turbo"),
    Case("served-at-name-not-split", "lms", "external", model="q@q4_k_m", ext={}),
    Case(
        "preset-not-allowed",
        403,
        "preset_not_allowed",
        preset="interactive",
        policy={"presets": ["throughput"]},
    ),
    Case(
        "policy-default-preset",
        "batching",
        "prefer-batching",
        policy={"default_preset": "throughput"},
    ),
    Case(
        "policy-lane-beats-preset-lane",
        "batching",
        "prefer-batching",
        preset="interactive",
        policy={"lanes": {"interactive": "batching"}},
    ),
    Case("model-not-allowed", 403, "model_not_allowed", policy={"models": {"allow": ["x*"]}}),
    Case(
        "model-allowed-by-pattern",
        "speculative",
        "spec-lane-free",
        policy={"models": {"allow": ["m*"]}},
    ),
    Case(
        "alias-resolved",
        "speculative",
        "spec-lane-free",
        model="fast",
        policy={"models": {"aliases": {"fast": MODEL}}},
    ),
    Case(
        "alias-with-suffix",
        "batching",
        "prefer-batching",
        model="fast@throughput",
        policy={"models": {"aliases": {"fast": MODEL}}},
    ),
    Case("unknown-model", 404, "model_not_found", model="nope"),
    # live load and the gate
    Case(
        "spec-lane-busy-inflight",
        "batching",
        "spec-lane-busy",
        preset="interactive",
        spec={"inflight": 1},
    ),
    Case("spec-lane-busy-worker-report", "batching", "spec-lane-busy", spec={"queued": 1}),
    Case(
        "spec-lane-capacity-two",
        "speculative",
        "spec-lane-free",
        spec={"inflight": 1, "capacity": 2},
    ),
    Case("gate-busy", "batching", "load-high", gate_busy=True, batch={"inflight": 2}),
    Case(
        "gate-busy-priority-passes",
        "speculative",
        "spec-lane-free",
        gate_busy=True,
        batch={"inflight": 2},
        policy={"priority": 5},
    ),
    Case(
        "priority-does-not-queue-on-spec",
        "batching",
        "spec-lane-busy",
        gate_busy=True,
        spec={"inflight": 1},
        policy={"priority": 5},
    ),
    Case(
        "sheddable-not-idle",
        "batching",
        "low-priority",
        batch={"inflight": 1},
        policy={"priority": -1},
    ),
    Case("sheddable-idle", "speculative", "spec-lane-free", policy={"priority": -1}),
    Case("load-reaches-busy-at", "batching", "load-high", batch={"inflight": 3}),
    Case("below-busy-at-stays-free", "speculative", "spec-lane-free", batch={"inflight": 2}),
    Case(
        "busy-gate-frees-at-free-at",
        "speculative",
        "spec-lane-free",
        gate_busy=True,
        batch={"inflight": 1},
    ),
    Case(
        "busy-gate-holds-above-free-at",
        "batching",
        "load-high",
        gate_busy=True,
        batch={"inflight": 2},
    ),
    Case("external-load-not-counted", "speculative", "spec-lane-free", ext={"inflight": 9}),
    # request shape
    Case("n-gt-1", "batching", "n>1", n=2),
    Case("long-prompt", "batching", "long-prompt", prompt_chars=16_001),
    Case("prompt-at-limit", "speculative", "spec-lane-free", prompt_chars=16_000),
    Case("high-temperature", "batching", "high-temperature", temperature=1.2),
    Case("temperature-at-limit", "speculative", "spec-lane-free", temperature=1.0),
    Case("preset-default-temperature", "batching", "high-temperature", preset="creative"),
    Case(
        "client-temperature-beats-default",
        "speculative",
        "spec-lane-free",
        preset="creative",
        temperature=0.3,
    ),
    Case("short-output", "batching", "short-output", max_tokens=16),
    Case("shape-before-load", "batching", "n>1", n=3, spec={"inflight": 1}),
    Case("throughput-ignores-shape", "batching", "prefer-batching", preset="throughput", n=2),
    # speculative state
    Case("spec-inactive", "batching", "spec-inactive", spec={"speculative": False}),
    Case("spec-not-paying", "batching", "spec-not-paying", advice=SpecAdvice(use=False)),
    Case("spec-probe", "speculative", "spec-probe", advice=SpecAdvice(use=False, probe=True)),
    Case(
        "probe-still-respects-busy",
        "batching",
        "spec-lane-busy",
        spec={"inflight": 1},
        advice=SpecAdvice(use=False, probe=True),
    ),
    # lanes down or cooling down
    Case("spec-lane-down", "batching", "spec-lane-down", spec={"ready": False}),
    Case("spec-lane-cooling", "batching", "spec-lane-down", spec={"cooled_down": True}),
    Case("no-spec-lane", "batching", "no-spec-lane", spec=None),
    Case(
        "batching-down-prefer-batching",
        "speculative",
        "batching-down",
        preset="throughput",
        batch={"ready": False},
    ),
    Case(
        "batching-down-spec-busy",
        "speculative",
        "batching-down",
        spec={"inflight": 1},
        batch={"cooled_down": True},
    ),
    Case("no-batching-lane", "speculative", "no-batching-lane", preset="throughput", batch=None),
    Case(
        "lanes-down-external",
        "lms",
        "external",
        spec={"ready": False},
        batch={"ready": False},
        ext={},
    ),
    Case(
        "everything-down",
        503,
        "no_backend_available",
        spec={"ready": False},
        batch={"cooled_down": True},
        ext={"ready": False},
    ),
    # manual override
    Case(
        "override-spec-while-busy",
        "speculative",
        "override",
        lane="speculative",
        spec={"inflight": 3},
    ),
    Case("override-batching", "batching", "override", lane="Batching", preset="interactive"),
    Case("override-external", "lms", "override", lane="lms", ext={}),
    Case(
        "override-beats-shape", "speculative", "override", lane="speculative", n=4, temperature=1.9
    ),
    Case(
        "override-beats-not-paying",
        "speculative",
        "override",
        lane="speculative",
        advice=SpecAdvice(use=False),
    ),
    Case(
        "override-forbidden",
        403,
        "lane_override_forbidden",
        lane="speculative",
        policy={"allow_lane_override": False},
    ),
    Case(
        "override-auto-always-fine",
        "speculative",
        "spec-lane-free",
        lane="auto",
        policy={"allow_lane_override": False},
    ),
    Case("override-unknown", 400, "unknown_lane", lane="gpu"),
    Case("override-unconfigured-lane", 400, "unknown_lane", lane="speculative", spec=None),
    Case("override-down", 503, "backend_unavailable", lane="speculative", spec={"ready": False}),
    Case("override-cooling", 503, "backend_unavailable", lane="lms", ext={"cooled_down": True}),
    Case(
        "override-not-serving-model",
        400,
        "model_not_served",
        lane="lms",
        ext={"models": frozenset({"other"})},
    ),
    # endpoints
    Case("embeddings-external-only", "lms", "external", endpoint="embeddings", ext={}),
    Case("embeddings-lane-model", 404, "model_not_found", endpoint="embeddings"),
    Case(
        "embeddings-override-lane",
        400,
        "lane_cannot_serve",
        endpoint="embeddings",
        lane="batching",
        ext={},
    ),
    Case("completions-like-chat", "speculative", "spec-lane-free", endpoint="completions"),
    # caps
    Case(
        "cap-reject",
        400,
        "cap_exceeded",
        max_tokens=5000,
        policy={"caps": {"max_tokens": 4096, "action": "reject"}},
    ),
    # a prediction goes to the speculative lane (rule "prediction") unless override or load
    Case("prediction-idle", "speculative", "prediction", family="prediction"),
    Case(
        "prediction-no-draft-model",
        "speculative",
        "prediction",
        family="prediction",
        spec={"speculative": False},
    ),
    Case(
        "prediction-busy-lane",
        "batching",
        "spec-lane-busy",
        family="prediction",
        spec={"inflight": 1},
    ),
    Case(
        "prediction-load-high", "batching", "load-high", family="prediction", batch={"inflight": 3}
    ),
    Case(
        "prediction-override",
        "batching",
        "override",
        family="prediction",
        lane="batching",
        policy={"allow_lane_override": True},
    ),
    Case(
        "prediction-not-paying",
        "batching",
        "spec-not-paying",
        family="prediction",
        advice=SpecAdvice(use=False),
    ),
    Case(
        "prediction-probe",
        "speculative",
        "spec-probe",
        family="prediction",
        advice=SpecAdvice(use=False, probe=True),
    ),
    Case(
        "cap-clamp",
        "speculative",
        "spec-lane-free",
        max_tokens=5000,
        policy={"caps": {"max_tokens": 4096}},
    ),
    Case(
        "n-cap-clamps-before-shape", "speculative", "spec-lane-free", n=3, policy={"caps": {"n": 1}}
    ),
    Case("cap-sets-short-output", "batching", "short-output", policy={"caps": {"max_tokens": 8}}),
]


def run(case: Case) -> Classification:
    policy = Policy.model_validate({"client": "c", **case.policy})
    request = RouteRequest(
        endpoint=case.endpoint,  # type: ignore[arg-type]
        model=case.model,
        n=case.n,
        temperature=case.temperature,
        max_tokens=case.max_tokens,
        prompt_chars=case.prompt_chars,
        family=case.family,
    )
    facts = RequestFacts(request, preset_header=case.preset, lane_header=case.lane)
    return classify(
        facts,
        policy,
        PRESETS,
        snapshot(case.spec, case.batch, case.ext),
        gate=LoadGate(busy=case.gate_busy),
        advice=case.advice,
    )


def test_the_table_is_big_and_names_are_unique() -> None:
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decision_table(case: Case) -> None:
    if isinstance(case.expect, int):
        with pytest.raises(RouterError) as info:
            run(case)
        assert (info.value.status, info.value.code) == (case.expect, case.rule)
        return
    result = run(case)
    first = result.decision.candidates[0]
    assert (first.lane, result.decision.labels["rule"]) == (case.expect, case.rule)
    assert case.rule in RULES
    assert result.decision.reason.split(",")[-1 if case.rule == "override" else 1].startswith(
        case.rule if case.rule != "override" else "override->"
    )


def test_reason_reads_preset_rule_and_lane() -> None:
    result = run(
        Case("x", "batching", "spec-lane-busy", preset="interactive", spec={"inflight": 1})
    )
    assert result.decision.reason == "preset=interactive,spec-lane-busy->batching"
    free = run(Case("x", "speculative", "spec-lane-free"))
    assert free.decision.reason == "preset=none,spec-lane-free->speculative"
    override = run(Case("x", "lms", "override", lane="lms", ext={}))
    assert override.decision.reason == "override->lms"


def test_fallbacks_follow_the_first_candidate_least_busy_first() -> None:
    views = (
        *snapshot(spec={"inflight": 1}, batch={"inflight": 2}, ext={"inflight": 5}),
        view("other", None, inflight=0),
    )
    result = classify(RequestFacts(RouteRequest("chat", MODEL)), Policy(client="c"), PRESETS, views)
    assert [c.backend for c in result.decision.candidates] == [
        "batching",
        "speculative",
        "other",
        "lms",
    ]


def test_spec_lane_as_fallback_decodes_speculatively_only_when_it_pays() -> None:
    paying = run(Case("x", "batching", "prefer-batching", preset="throughput"))
    assert [(c.lane, c.speculative) for c in paying.decision.candidates] == [
        ("batching", False),
        ("speculative", True),
    ]
    off = run(Case("x", "batching", "spec-not-paying", advice=SpecAdvice(use=False)))
    assert [(c.lane, c.speculative) for c in off.decision.candidates] == [
        ("batching", False),
        ("speculative", False),
    ]


def test_a_probe_is_named_only_when_the_probe_takes_the_speculative_lane() -> None:
    probe = SpecAdvice(use=False, probe=True)

    def rule(case: Case) -> str:
        return run(case).decision.labels["rule"]

    assert rule(Case("x", "speculative", "spec-probe", advice=probe)) == "spec-probe"
    assert rule(Case("x", "batching", "n>1", n=2, advice=probe)) == "n>1"
    assert (
        rule(Case("x", "speculative", "override", lane="speculative", advice=probe)) == "override"
    )
    assert rule(Case("x", "speculative", "spec-lane-free")) == "spec-lane-free"


def test_override_is_the_only_candidate() -> None:
    result = run(Case("x", "speculative", "override", lane="speculative", ext={}))
    assert [c.backend for c in result.decision.candidates] == ["speculative"]


def test_clamp_is_visible_and_changes_the_body() -> None:
    result = run(
        Case(
            "x",
            "speculative",
            "spec-lane-free",
            max_tokens=5000,
            n=2,
            policy={"caps": {"max_tokens": 4096, "n": 1}},
        )
    )
    assert result.body_changes == {"max_tokens": 4096, "n": 1}
    assert result.decision.reason.endswith(",clamped=max_tokens+n")
    assert result.decision.labels["clamped"] == "max_tokens,n"


def test_cap_applies_when_the_request_sets_no_max_tokens_without_calling_it_clamped() -> None:
    result = run(Case("x", "speculative", "spec-lane-free", policy={"caps": {"max_tokens": 99}}))
    assert result.body_changes == {"max_tokens": 99}
    assert "clamped" not in result.decision.reason
    assert result.decision.reason.endswith(",max_tokens_cap=99")


def test_cap_uses_max_completion_tokens_when_the_body_does() -> None:
    facts = RequestFacts(
        RouteRequest("chat", MODEL, max_tokens=500),
        body_keys=frozenset({"model", "messages", "max_completion_tokens"}),
    )
    result = classify(
        facts,
        Policy.model_validate({"client": "c", "caps": {"max_tokens": 100}}),
        PRESETS,
        snapshot(),
    )
    assert result.body_changes == {"max_completion_tokens": 100}


def test_preset_defaults_fill_only_fields_the_client_did_not_set() -> None:
    facts = RequestFacts(
        RouteRequest("chat", "m@chatty", temperature=0.9),
        body_keys=frozenset({"model", "messages", "temperature"}),
    )
    result = classify(facts, Policy(client="c"), PRESETS, snapshot())
    assert result.body_changes == {"max_tokens": 512, "model": MODEL}
    assert (result.model, result.preset, result.workload) == (MODEL, "chatty", "c:chatty:chat")


def test_preset_default_above_a_cap_is_lowered_without_an_error() -> None:
    policy = Policy.model_validate({"client": "c", "caps": {"max_tokens": 100, "action": "reject"}})
    facts = RequestFacts(RouteRequest("chat", MODEL), preset_header="chatty")
    assert classify(facts, policy, PRESETS, snapshot()).body_changes["max_tokens"] == 100


def test_embeddings_get_no_body_changes() -> None:
    policy = Policy.model_validate({"client": "c", "caps": {"max_tokens": 10}})
    facts = RequestFacts(RouteRequest("embeddings", "emb"), preset_header="chatty")
    result = classify(facts, policy, PRESETS, snapshot(ext={}))
    assert result.body_changes == {}


def test_no_preset_workload_and_labels() -> None:
    result = run(Case("x", "speculative", "spec-lane-free"))
    assert (result.preset, result.workload) == (None, "c:none:chat")
    labels = result.decision.labels
    assert labels["preset_source"] == "none" and labels["lane_pref"] == "auto"
    assert "rule='spec-lane-free'" in log_line(result)


def test_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(RouterError) as info:
        run(Case("x", 400, "unknown_preset", preset="turbo"))
    assert "chatty, creative, interactive, throughput" in info.value.message


def test_unknown_lane_names_the_known_ones() -> None:
    with pytest.raises(RouterError) as info:
        run(Case("x", 400, "unknown_lane", lane="gpu", ext={}))
    assert "auto, batching, lms, speculative" in info.value.message


def test_gate_state_is_returned_for_the_next_decision() -> None:
    busy = run(Case("x", "batching", "load-high", batch={"inflight": 3}))
    assert busy.gate.busy
    still = classify(
        RequestFacts(RouteRequest("chat", MODEL)),
        Policy(client="c"),
        PRESETS,
        snapshot(batch={"inflight": 2}),
        gate=busy.gate,
    )
    assert (still.decision.labels["rule"], still.gate.busy) == ("load-high", True)


def test_routing_rules_thresholds_are_configurable() -> None:
    rules = RoutingRules(long_prompt_chars=0, spec_max_temperature=2.0, short_output_tokens=0)
    facts = RequestFacts(
        RouteRequest("chat", MODEL, temperature=1.5, max_tokens=4, prompt_chars=10**6)
    )
    result = classify(facts, Policy(client="c"), PRESETS, snapshot(), rules=rules)
    assert result.decision.labels["rule"] == "spec-lane-free"
    with pytest.raises(ValueError):
        RoutingRules(spec_busy_at=2, spec_free_at=2)


# --- load hysteresis ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loads", "states"),
    [
        ([0, 1, 2], [False, False, False]),
        ([3], [True]),
        ([3, 2, 3, 2], [True, True, True, True]),  # hovering above free_at: no flapping
        ([3, 1], [True, False]),
        ([3, 0, 2, 3], [True, False, False, True]),
        ([2, 1, 2, 1], [False, False, False, False]),  # hovering below busy_at: no flapping
    ],
)
def test_load_gate_transitions(loads: list[int], states: list[bool]) -> None:
    gate, seen = LoadGate(), []
    for load in loads:
        gate = gate.observe(load)
        seen.append(gate.busy)
    assert seen == states


def test_load_gate_with_hybridengine_thresholds() -> None:
    gate = LoadGate(busy_at=2, free_at=0)
    assert [g.busy for g in _walk(gate, [1, 2, 1, 0])] == [False, True, True, False]
    with pytest.raises(ValueError):
        LoadGate(busy_at=1, free_at=1)


def _walk(gate: LoadGate, loads: list[int]) -> list[LoadGate]:
    out = []
    for load in loads:
        gate = gate.observe(load)
        out.append(gate)
    return out


def test_defaults_keep_every_lone_request_speculative_like_hybridengine() -> None:
    # HybridEngine: speculative while fewer than 2 requests are active. Whatever happened
    # before, a request arriving at an idle machine goes to the speculative lane.
    for previous in (LoadGate(), LoadGate(busy=True)):
        result = classify(
            RequestFacts(RouteRequest("chat", MODEL)),
            Policy(client="c"),
            PRESETS,
            snapshot(),
            gate=previous,
        )
        assert result.decision.candidates[0].lane == "speculative"


def test_one_long_batch_request_does_not_block_speculation() -> None:
    # HybridEngine returns to speculation only at 0 active; here one background request
    # on the batching lane leaves the speculative lane usable once the burst is over.
    result = classify(
        RequestFacts(RouteRequest("chat", MODEL)),
        Policy(client="c"),
        PRESETS,
        snapshot(batch={"inflight": 1}),
        gate=LoadGate(busy=True),
    )
    assert result.decision.labels["rule"] == "spec-lane-free"


# --- properties --------------------------------------------------------------------------


def _lane_view(name: str) -> st.SearchStrategy[BackendView]:
    return st.builds(
        view,
        st.just(name),
        st.just(name),
        models=st.sampled_from([frozenset({MODEL}), frozenset({"other"})]),
        ready=st.booleans(),
        cooled_down=st.booleans(),
        inflight=st.integers(0, 4),
        queued=st.integers(0, 3),
        capacity=st.sampled_from([None, 1, 2]),
        speculative=st.booleans(),
    )


def _external(name: str) -> st.SearchStrategy[BackendView]:
    return st.builds(
        view,
        st.just(name),
        st.none(),
        models=st.sampled_from([frozenset({MODEL}), frozenset({MODEL, "e"}), frozenset()]),
        ready=st.booleans(),
        cooled_down=st.booleans(),
        inflight=st.integers(0, 4),
        speculative=st.booleans(),
    )


@st.composite
def backends(draw: st.DrawFn) -> tuple[BackendView, ...]:
    views = []
    for name in ("speculative", "batching"):
        if draw(st.booleans()):
            views.append(draw(_lane_view(name)))
    for name in draw(st.sets(st.sampled_from(["lms", "ollama"]))):
        views.append(draw(_external(name)))
    return tuple(views)


requests = st.builds(
    RouteRequest,
    endpoint=st.sampled_from(["chat", "completions", "embeddings"]),
    model=st.sampled_from([MODEL, "m@interactive", "m@throughput", "m@creative"]),
    n=st.integers(1, 3),
    temperature=st.none() | st.floats(0, 2),
    max_tokens=st.none() | st.integers(1, 10_000),
    prompt_chars=st.integers(0, 40_000),
)
policies = st.builds(
    lambda priority, lanes, cap: Policy.model_validate(
        {"client": "p", "priority": priority, "lanes": lanes, "caps": {"max_tokens": cap}}
    ),
    st.integers(-3, 3),
    st.dictionaries(
        st.sampled_from(["interactive", "throughput"]),
        st.sampled_from(["speculative", "batching", "auto"]),
    ),
    st.none() | st.integers(1, 64),
)
advices = st.builds(SpecAdvice, use=st.booleans(), probe=st.booleans())
gates = st.builds(LoadGate, busy=st.booleans())
preset_headers = st.sampled_from([None, "interactive", "throughput", "chatty"])


def _classify(
    request: RouteRequest,
    policy: Policy,
    views: tuple[BackendView, ...],
    gate: LoadGate,
    advice: SpecAdvice,
    preset: str | None = None,
    lane: str | None = None,
) -> Classification:
    facts = RequestFacts(request, preset_header=preset, lane_header=lane)
    return classify(facts, policy, PRESETS, views, gate=gate, advice=advice)


@settings(max_examples=examples(300), deadline=None)
@given(requests, policies, backends(), gates, advices, preset_headers, st.data())
def test_an_allowed_override_always_wins(
    request: RouteRequest,
    policy: Policy,
    views: tuple[BackendView, ...],
    gate: LoadGate,
    advice: SpecAdvice,
    preset: str | None,
    data: st.DataObject,
) -> None:
    usable = [
        v
        for v in views
        if v.ready
        and not v.cooled_down
        and MODEL in v.models
        and (request.endpoint != "embeddings" or v.lane is None)
    ]
    if not usable:
        return
    target = data.draw(st.sampled_from(usable))
    header = target.lane or target.name
    result = _classify(request, policy, views, gate, advice, preset, header)
    assert [c.backend for c in result.decision.candidates] == [target.name]
    assert result.decision.labels["rule"] == "override"


@settings(max_examples=examples(500), deadline=None)
@given(
    requests,
    policies,
    backends(),
    gates,
    advices,
    preset_headers,
    st.sampled_from([None, "speculative", "batching", "lms", "auto"]),
)
def test_a_down_or_cooling_backend_is_never_a_candidate(
    request: RouteRequest,
    policy: Policy,
    views: tuple[BackendView, ...],
    gate: LoadGate,
    advice: SpecAdvice,
    preset: str | None,
    lane: str | None,
) -> None:
    try:
        result = _classify(request, policy, views, gate, advice, preset, lane)
    except RouterError as e:
        assert e.status in (400, 403, 404, 503)
        return
    by_name = {v.name: v for v in views}
    assert result.decision.candidates
    for candidate in result.decision.candidates:
        chosen = by_name[candidate.backend]
        assert chosen.ready and not chosen.cooled_down
        assert result.model in chosen.models
    assert result.decision.labels["rule"] in RULES


@settings(max_examples=examples(300), deadline=None)
@given(requests, policies, backends(), gates, advices, preset_headers, st.randoms())
def test_the_decision_is_deterministic_and_ignores_snapshot_order(
    request: RouteRequest,
    policy: Policy,
    views: tuple[BackendView, ...],
    gate: LoadGate,
    advice: SpecAdvice,
    preset: str | None,
    rnd: random.Random,
) -> None:
    shuffled = list(views)
    rnd.shuffle(shuffled)
    outcomes: list[object] = []
    for order in (views, views, tuple(shuffled)):
        try:
            outcomes.append(_classify(request, policy, order, gate, advice, preset))
        except RouterError as e:
            outcomes.append((e.status, e.code))
    assert outcomes[0] == outcomes[1] == outcomes[2]


@settings(max_examples=examples(300), deadline=None)
@given(requests, policies, backends(), advices, st.integers(0, 6))
def test_a_busy_spec_lane_never_takes_a_request_without_an_override(
    request: RouteRequest,
    policy: Policy,
    views: tuple[BackendView, ...],
    advice: SpecAdvice,
    extra: int,
) -> None:
    views = tuple(
        dataclasses.replace(v, inflight=max(v.inflight, v.capacity or 1) + extra)
        if v.lane == "speculative"
        else v
        for v in views
    )
    other_lane = any(
        v.lane == "batching" and v.ready and not v.cooled_down and MODEL in v.models for v in views
    )
    try:
        result = _classify(request, policy, views, LoadGate(), advice)
    except RouterError:
        return
    if other_lane:
        assert result.decision.candidates[0].lane != "speculative"


def test_random_inputs_exercise_every_rule() -> None:
    # Guards the property tests: the generators reach each routing rule at least once.
    rng, seen = random.Random(7), set()
    for _ in range(3000):
        case = Case(
            "r",
            "",
            "",
            preset=rng.choice([None, "interactive", "throughput"]),
            n=rng.choice([1, 1, 1, 2]),
            temperature=rng.choice([None, 0.5, 1.5]),
            max_tokens=rng.choice([None, 8, 500]),
            prompt_chars=rng.choice([0, 20_000]),
            policy={"priority": rng.choice([-1, 0, 1])},
            spec=rng.choice([None, {}, {"inflight": 1}, {"ready": False}, {"speculative": False}]),
            batch=rng.choice([None, {}, {"inflight": 1}, {"inflight": 3}, {"ready": False}]),
            ext=rng.choice([None, {}]),
            gate_busy=rng.random() < 0.3,
            advice=SpecAdvice(rng.random() < 0.7, rng.random() < 0.5),
            family=rng.choice(["chat", "chat", "prediction"]),
        )
        try:
            seen.add(run(case).decision.labels["rule"])
        except RouterError:
            pass
    assert seen >= set(RULES) - {
        "override",
        "cache-affinity",
        "faster-lane",
    }  # test_affinity, test_pace


def test_the_family_is_part_of_the_workload_and_a_prediction_always_drafts() -> None:
    result = run(
        Case("x", "speculative", "prediction", family="prediction", spec={"speculative": False})
    )
    assert result.workload == "c:none:prediction"
    assert result.decision.candidates[0].speculative
    assert result.decision.reason == "preset=none,prediction->speculative"
