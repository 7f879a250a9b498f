"""The router's speculation decision (``router.proxy.speculation``): advise peeks each lane's
state and takes nothing, claim takes the verdict of the first candidate only, complete
returns what was taken; and the claim's pure rules."""

from __future__ import annotations

import time

import pytest

from router.backends.base import Backend
from router.backends.cooldown import Cooldown
from router.backends.pool import BackendPool
from router.config.policies import Policy, PolicySet
from router.config.presets import DEFAULT_PRESETS
from router.config.settings import Settings
from router.metrics import Metrics
from router.proxy.outcome import Outcome
from router.proxy.speculation import SpecClaim, Speculation, settle, speculates
from router.routing.classify import RequestFacts, Resolved, resolve, route
from router.routing.speculate import SpecAdvice
from router.routing.types import Candidate, RouteRequest
from router.speculation.autodisable import AutoDisable, Verdict
from router.speculation.keystate import SpecKey
from router.speculation.record import SpecRecord, build_record

MODEL = "m"


def lane(name: str, speculative: bool, source: str) -> Backend:
    backend = Backend(
        name,
        "speclane",
        "http://127.0.0.1:1/v1",
        Cooldown(allowed_fails=3, seconds=5),
        lane=name,  # type: ignore[arg-type]
        speculative_requested=speculative,
        configured_models=frozenset({MODEL}),
    )
    backend.ready, backend.speculative_active = True, speculative
    backend.source_setting = source
    return backend


def owner(source: str = "auto") -> tuple[Speculation, BackendPool]:
    """A source fixed by the configuration is judged on acceptance; ``auto`` on speed."""
    pool = BackendPool([lane("speculative", True, source), lane("batching", False, source)])
    policies = PolicySet.implied()  # client "c" has no policy of its own: the defaults
    spec = Speculation(Settings(), Metrics(), pool, lambda: policies)
    return spec, pool


def resolved(pool: BackendPool, family: str = "chat") -> Resolved:
    request = RouteRequest("chat", MODEL, family=family)
    return resolve(RequestFacts(request), Policy(client="c"), DEFAULT_PRESETS, pool.snapshot())


def low_acceptance() -> SpecRecord:
    record = build_record("speclane", "request", "draft", drafted=200, accepted=4)
    assert isinstance(record, SpecRecord)
    return record


ON, OFF, PROBE = SpecAdvice(), SpecAdvice(use=False), SpecAdvice(use=False, probe=True)


class Peeks(AutoDisable):
    """The real auto-disable, noting the sources it is asked about."""

    asked: list[str]

    def peek(self, key: SpecKey, now: float) -> Verdict:
        self.asked.append(key.source)
        return super().peek(key, now)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({"draft_model": ON, "prompt_lookup": ON}, ("draft_model", ON)),
        # the preferred source stopped paying: the next one that is on
        ({"draft_model": OFF, "prompt_lookup": ON}, ("prompt_lookup", ON)),
        # ...unless the preferred one's probe is due: it is probed on its schedule
        ({"draft_model": PROBE, "prompt_lookup": ON}, ("draft_model", PROBE)),
        ({"draft_model": OFF, "prompt_lookup": PROBE}, ("prompt_lookup", PROBE)),
        # off everywhere: the first, off (the request decodes plainly)
        ({"draft_model": OFF, "prompt_lookup": OFF}, ("draft_model", OFF)),
    ],
)
def test_the_source_chosen_is_the_first_that_pays_and_none_after_it_is_asked(
    states: dict[str, SpecAdvice], expected: tuple[str, SpecAdvice]
) -> None:
    spec, _ = owner()
    auto = spec.auto = Peeks(Settings().spec)
    auto.asked = []
    t0 = time.monotonic()
    probe_after = Settings().spec.probe_initial
    for source, state in states.items():
        if state is not ON:  # off long enough ago for its first probe to be due, or not
            key = SpecKey("speculative", MODEL, "c:none:chat", source)
            at = t0 if state is PROBE else t0 + probe_after - 5
            for _ in range(4):
                auto.record(key, low_acceptance(), None, at)
    chosen = spec._choose(
        "speculative", MODEL, "c:none:chat", ("draft_model", "prompt_lookup"), t0 + probe_after + 5
    )
    assert chosen == expected
    assert auto.asked[0] == "draft_model"  # the preferred source is always asked first
    assert len(auto.asked) == (1 if states["draft_model"] is not OFF else 2)


def test_advise_peeks_each_lane_apart_and_takes_nothing() -> None:
    spec, pool = owner()
    advised = spec.advise(resolved(pool))
    assert (advised.source, advised.advice.use, advised.advice.probe) == ("auto", True, False)
    assert advised.batching is not None and advised.batching[0] == "auto"
    assert advised.batching[1].use
    assert not spec.auto.keys()  # a peek creates no state


def test_a_workload_turned_off_is_advised_off_and_its_claim_goes_to_batching() -> None:
    spec, pool = owner("prompt_lookup")
    request = resolved(pool)
    key = SpecKey("speculative", MODEL, request.workload, "prompt_lookup")
    now = time.monotonic()
    for _ in range(4):
        spec.auto.record(key, low_acceptance(), None, now)
    assert not spec.auto.enabled(key)
    advised = spec.advise(request)
    assert not advised.advice.use and not advised.advice.probe  # the first probe is not due
    result, claim = spec.claim(route(request, advised))
    assert result.decision.labels["rule"] == "spec-not-paying"
    first = result.decision.candidates[0]
    assert first.backend == "batching"
    # the batching lane is judged on its own key: its verdict is the one taken
    assert (claim.model, claim.workload) == (MODEL, request.workload)
    assert claim.key == SpecKey("batching", MODEL, request.workload, "prompt_lookup")
    # the speculative lane behind it decodes plainly while it does not pay
    assert [c.speculative for c in result.decision.candidates if c.backend == "speculative"] == [
        False
    ]


def test_a_claim_on_a_plain_first_candidate_takes_nothing() -> None:
    spec, pool = owner()
    request = resolved(pool, "prediction")
    result, claim = spec.claim(route(request, spec.advise(request)))
    assert result.decision.candidates[0].backend == "speculative"
    assert claim.key == SpecKey("speculative", MODEL, request.workload, "prediction")
    # a request that never reached a backend returns its ticket (if any): nothing is judged
    spec.complete(Outcome(endpoint="chat", arrival=0.0), claim, None)
    assert all(row["state"] == "on" for row in spec.auto.snapshot(time.monotonic()))


def test_the_claims_names_fall_back_to_the_answer_when_never_classified() -> None:
    outcome = Outcome(endpoint="chat", arrival=0.0, body_json={"model": "served"})
    assert SpecClaim().names(outcome) == ("served", "unclassified")
    assert SpecClaim("m", "c:none:chat").names(outcome) == ("m", "c:none:chat")


def test_a_batching_candidate_that_drafts_speculates_and_settles_plain_when_off() -> None:
    drafting = Candidate("batching", "batching", True, "prompt_lookup")
    assert speculates("batching", False, drafting)
    assert not speculates("batching", False, Candidate("batching", "batching"))
    settled = settle((drafting,), "batching", use=False, probe=False, baseline_sample=True)
    assert settled.candidates[0].speculative is False and settled.baseline


def test_an_external_backend_speculates_as_configured_and_has_no_plain_mode() -> None:
    external = Candidate("llamacpp", "llamacpp")
    assert speculates(None, True, external) and not speculates(None, False, external)
    settled = settle((external,), None, use=False, probe=False, baseline_sample=False)
    assert settled.candidates == (external,) and not settled.keep_ticket
