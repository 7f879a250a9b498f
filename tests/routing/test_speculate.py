"""The draft source the router asks its lanes for (pure): under ``auto`` the lane chooses at
every step, a fixed setting is that source for every family; and how classification names
the sources auto-disable is asked about (``resolve``) and carries its advice, given as
values, to the candidates (``route``)."""

from __future__ import annotations

from typing import Any

import pytest

from router.config.policies import Policy
from router.config.presets import DEFAULT_PRESETS
from router.routing.classify import Advised, Classification, RequestFacts, resolve, route
from router.routing.speculate import (
    SpecAdvice,
    asked_source,
    batch_request_sources,
    candidate_source,
    lane_sources,
    paused_last,
    request_sources,
)
from router.routing.types import BackendView, Candidate, RouteRequest
from router.speculation.families import FAMILIES


@pytest.mark.parametrize(
    ("family", "configured", "has_draft", "expected"),
    [
        # auto: the lane chooses, whatever the family and whether a draft model runs
        ("code-block", "auto", True, "auto"),
        ("tools", "auto", True, "auto"),
        ("chat", "auto", True, "auto"),
        ("chat", "auto", False, "auto"),
        ("code-block", "auto", False, "auto"),
        ("prediction", "auto", True, None),  # the lane drafts from the prediction: ask nothing
        # a fixed value is that source for every family
        ("code-block", "draft_model", True, "draft_model"),
        ("chat", "draft_model", False, None),  # no draft model loaded: nothing to ask for
        ("chat", "prompt_lookup", True, "prompt_lookup"),
        ("tools", "prompt_lookup", False, "prompt_lookup"),
        ("tools", "suffix", False, "suffix"),
        ("chat", "none", True, None),
        ("code-block", "none", True, None),
        ("prediction", "prompt_lookup", True, None),
    ],
)
def test_the_preferred_lane_source_per_family(
    family: str, configured: str, has_draft: bool, expected: str | None
) -> None:
    sources = lane_sources(family, configured, has_draft)
    assert (sources[0] if sources else None) == expected


@pytest.mark.parametrize(
    ("family", "asked", "configured", "has_draft", "expected"),
    [
        ("prediction", "draft_model", "auto", True, "prediction"),  # a prediction always wins
        ("chat", "prompt_lookup", "auto", True, "prompt_lookup"),  # the client's own choice
        ("chat", "suffix", "auto", True, "suffix"),
        ("code-block", "draft_model", "auto", True, "draft_model"),
        ("code-block", None, "auto", True, "auto"),
        ("chat", None, "auto", True, "auto"),
        ("chat", None, "prompt_lookup", True, "prompt_lookup"),
        ("chat", None, "none", True, "none"),
        ("chat", None, "draft_model", False, "none"),
    ],
)
def test_request_source_is_the_key_part(
    family: str, asked: str | None, configured: str, has_draft: bool, expected: str
) -> None:
    assert request_sources(family, asked, configured, has_draft)[0] == expected


@pytest.mark.parametrize(
    ("family", "configured", "has_draft", "expected"),
    [
        # auto: one source, the lane's own choice, for every family but prediction
        ("chat", "auto", True, ("auto",)),
        ("code-block", "auto", True, ("auto",)),
        ("tools", "auto", True, ("auto",)),
        ("chat", "auto", False, ("auto",)),
        ("constrained", "auto", True, ("auto",)),
        ("constrained", "auto", False, ("auto",)),
        ("constrained", "prompt_lookup", True, ("prompt_lookup",)),
        ("constrained", "draft_model", True, ("draft_model",)),
        ("tools", "suffix", True, ("suffix",)),
        ("chat", "suffix", False, ("suffix",)),
        ("prediction", "auto", True, ()),
        # a fixed value is one source
        ("chat", "prompt_lookup", True, ("prompt_lookup",)),
        ("code-block", "draft_model", True, ("draft_model",)),
        ("chat", "none", True, ()),
    ],
)
def test_lane_sources_per_family_and_setting(
    family: str, configured: str, has_draft: bool, expected: tuple[str, ...]
) -> None:
    assert lane_sources(family, configured, has_draft) == expected


def test_a_request_source_of_its_own_is_the_only_one() -> None:
    assert request_sources("chat", "prompt_lookup", "auto", True) == ("prompt_lookup",)
    assert request_sources("prediction", "draft_model", "auto", True) == ("prediction",)
    assert request_sources("chat", None, "none", True) == ("none",)


ON, OFF, PROBE = SpecAdvice(), SpecAdvice(use=False), SpecAdvice(use=False, probe=True)


def test_every_family_and_setting_gives_a_known_source() -> None:
    for family in FAMILIES:
        for configured in ("auto", "draft_model", "prompt_lookup", "suffix", "none"):
            for has_draft in (True, False):
                source = request_sources(family, None, configured, has_draft)[0]
                known = ("prediction", "auto", "draft_model", "prompt_lookup", "suffix", "none")
                assert source in known


@pytest.mark.parametrize(
    ("candidate", "asked", "key"),
    [
        (
            Candidate("speculative", "speculative", True, "prompt_lookup"),
            "prompt_lookup",
            "prompt_lookup",
        ),
        (
            Candidate("speculative", "speculative", True, "draft_model"),
            "draft_model",
            "draft_model",
        ),
        (Candidate("speculative", "speculative", True, "auto"), "auto", "auto"),
        (Candidate("speculative", "speculative", True, "prediction"), None, "prediction"),
        (Candidate("speculative", "speculative", False, "none"), None, "none"),
        (Candidate("llamacpp", "llamacpp", True), None, "draft_model"),  # external: its draft
    ],
)
def test_what_the_body_asks_and_what_the_state_is_keyed_by(
    candidate: Candidate, asked: str | None, key: str
) -> None:
    assert asked_source(candidate) == asked
    assert candidate_source(candidate) == key


def lanes(has_draft: bool, setting: str = "auto") -> tuple[BackendView, ...]:
    common: dict[str, Any] = {"models": frozenset({"m"}), "ready": True, "cooled_down": False}
    return (
        BackendView(
            "speculative",
            "speculative",
            speculative=True,
            source_setting=setting,
            has_draft=has_draft,
            **common,
        ),
        BackendView("batching", "batching", **common),
        BackendView("ext", None, speculative=True, **common),
    )


def routed(
    request: RouteRequest,
    views: tuple[BackendView, ...],
    advice: SpecAdvice = ON,
    batching: SpecAdvice | None = None,
) -> Classification:
    """``resolve`` then ``route`` with ``advice`` for the preferred source of each lane."""
    resolved = resolve(RequestFacts(request), Policy(client="c"), DEFAULT_PRESETS, views)
    batch = None
    if batching is not None and resolved.batch_sources:
        batch = (resolved.batch_sources[0], batching)
    return route(resolved, Advised(resolved.spec_sources[0], advice, batch))


@pytest.mark.parametrize(
    ("family", "asked", "has_draft", "source"),
    [
        ("chat", None, True, "auto"),
        ("code-block", None, True, "auto"),
        ("chat", None, False, "auto"),
        ("chat", "prompt_lookup", True, "prompt_lookup"),
        ("prediction", None, False, "prediction"),
    ],
)
def test_resolve_names_what_to_ask_and_route_marks_the_lane_candidate(
    family: str, asked: str | None, has_draft: bool, source: str
) -> None:
    request = RouteRequest("chat", "m", family=family, draft_source=asked)
    resolved = resolve(RequestFacts(request), Policy(client="c"), DEFAULT_PRESETS, lanes(has_draft))
    assert (resolved.model, resolved.workload) == ("m", f"c:none:{family}")
    assert resolved.spec_sources == (source,)
    result = route(resolved, Advised(source))
    by_backend = {c.backend: c for c in result.decision.candidates}
    assert by_backend["speculative"].source == source
    assert by_backend["batching"].source is None and by_backend["ext"].source is None
    assert result.decision.labels["spec_source"] == source


def test_without_a_lane_auto_disable_is_asked_about_the_external_draft_model() -> None:
    views = tuple(v for v in lanes(True) if v.lane is None)
    request = RouteRequest("chat", "m", family="code-block")
    resolved = resolve(RequestFacts(request), Policy(client="c"), DEFAULT_PRESETS, views)
    assert resolved.spec_sources == ("draft_model",) and resolved.batch_sources is None


def test_under_auto_a_workload_turned_off_goes_to_batching_and_is_probed() -> None:
    """Under ``auto`` there is one source to judge, the lane's choice: a family off there goes
    to batching (no other source to fall back on), another family stays (keyed apart), and a
    due probe brings the family back to the speculative lane."""

    def decision(family: str, advice: SpecAdvice) -> Any:
        return routed(RouteRequest("chat", "m", family=family), lanes(True), advice).decision

    chat = decision("chat", OFF)
    assert chat.candidates[0].backend == "batching"
    assert (chat.labels["rule"], chat.labels["spec_source"]) == ("spec-not-paying", "auto")
    edit = decision("code-block", ON)
    assert (edit.candidates[0].backend, edit.candidates[0].source) == ("speculative", "auto")
    assert edit.labels["rule"] == "spec-lane-free"
    probed = decision("chat", PROBE)
    first = probed.candidates[0]
    assert (first.backend, first.source, first.speculative) == ("speculative", "auto", True)
    assert probed.labels["rule"] == "spec-probe"


@pytest.mark.parametrize(
    ("family", "asked", "configured", "sources"),
    [
        # auto: the lane chooses among its free sources (no draft model runs there)
        ("chat", None, "auto", ("auto",)),
        ("code-block", None, "auto", ("auto",)),
        ("prediction", None, "auto", ("prediction",)),
        ("chat", "suffix", "auto", ("suffix",)),
        ("chat", "draft_model", "auto", ("none",)),
        ("chat", None, "draft_model", ("none",)),
        ("chat", None, "prompt_lookup", ("prompt_lookup",)),
        ("chat", None, "none", ("none",)),
    ],
)
def test_the_batching_lane_drafts_from_the_free_sources(
    family: str, asked: str | None, configured: str, sources: tuple[str, ...]
) -> None:
    assert batch_request_sources(family, asked, configured) == sources


def test_the_batching_lane_is_judged_apart_from_the_speculative_lane() -> None:
    request = RouteRequest("chat", "m", family="code-block")
    resolved = resolve(RequestFacts(request), Policy(client="c"), DEFAULT_PRESETS, lanes(True))
    assert resolved.batch_sources == ("auto",)
    result = routed(request, lanes(True), ON, batching=OFF)
    by_backend = {c.backend: c for c in result.decision.candidates}
    # on for the speculative lane; off for the same workload and source on the batching
    # lane, which decodes plainly there
    assert by_backend["speculative"] == Candidate("speculative", "speculative", True, "auto")
    assert by_backend["batching"] == Candidate("batching", "batching", False, "auto")
    # and the other way round: off on the speculative lane, the batching lane still drafts
    result = routed(request, lanes(True), OFF, batching=ON)
    first = result.decision.candidates[0]
    assert first == Candidate("batching", "batching", True, "auto")
    assert result.decision.labels["rule"] == "spec-not-paying"


def test_paused_backends_go_last_in_their_order_unless_all_are() -> None:
    a, b, c = (Candidate(n, n) for n in ("a", "b", "c"))
    assert paused_last((a, b, c), frozenset({"a"})) == (b, c, a)
    assert paused_last((a, b, c), frozenset({"a", "b"})) == (c, a, b)
    assert paused_last((a, b), frozenset({"a", "b"})) == (a, b)  # nothing else can serve
    assert paused_last((a,), frozenset({"a"})) == (a,)
    assert paused_last((a, b), frozenset()) == (a, b)
