"""Properties of the auto-disable: probe spacing and hysteresis, on random traffic."""

from __future__ import annotations

import itertools
import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from router.config.speculation import SpecSettings
from router.speculation.autodisable import AutoDisable, SpecKey, Transition
from router.speculation.record import Observation, SpecRecord, build_record
from tests.fuzzing import examples

KEY = SpecKey("speculative", "m", "chat")
EPS = 1e-9


def rec(drafted: int, accepted: int) -> SpecRecord:
    r = build_record("speclane", "request", "draft", drafted=drafted, accepted=accepted)
    assert isinstance(r, SpecRecord)
    return r


@st.composite
def probe_settings(draw: st.DrawFn) -> SpecSettings:
    min_spacing = draw(st.floats(1, 30))
    initial = min_spacing * draw(st.floats(1, 4))
    return SpecSettings(
        window_size=100,
        min_sample=50,
        speed_window=4,
        min_speed_samples=2,
        probe_min_spacing=min_spacing,
        probe_initial=initial,
        probe_max=initial * draw(st.floats(1, 20)),
        probe_backoff=draw(st.floats(1, 3)),
        probes_to_enable=draw(st.integers(1, 3)),
        probe_timeout=draw(st.floats(1, 200)),
        probe_min_drafted=10,
        baseline_spacing=draw(st.sampled_from([0.0, 5.0, 60.0])),
    )


ACTIONS = (
    ["verdict"] * 4
    + ["good"] * 2
    + ["bad", "empty", "cancel", "low", "high", "baseline", "fast", "slow"]
)
delays = st.one_of(st.just(0.0), st.floats(0, 5), st.floats(0, 60))
# Starting with a collapse, so that every example spends its time probing.
operations = st.lists(st.tuples(delays, st.sampled_from(ACTIONS)), min_size=30, max_size=150).map(
    lambda ops: [(0.0, "low"), *ops]
)


@settings(max_examples=examples(300), deadline=None)
@given(s=probe_settings(), ops=operations)
def test_probes_never_closer_than_the_minimum_spacing_nor_two_at_once(
    s: SpecSettings, ops: list[tuple[float, str]]
) -> None:
    auto = AutoDisable(s)
    now, claims, out = 0.0, [], None
    for dt, action in ops:
        now += dt
        if action == "verdict":
            v = auto.verdict(KEY, now)
            if v.probe:
                if claims and out is not None:
                    # A second probe while one is out only after the first has lapsed.
                    assert now - claims[-1] >= s.probe_timeout - EPS
                claims.append(now)
                out = v.ticket
            continue
        if action in ("good", "bad", "empty") and out is not None:
            result = {"good": rec(100, 90), "bad": rec(100, 0), "empty": None}[action]
            auto.record(KEY, result, Observation(101, 1.0), now, out)
            out = None
        elif action == "cancel" and out is not None:
            auto.cancel(out, now)
            out = None
        elif action in ("low", "high", "fast", "slow"):
            accepted = 0 if action == "low" else 90
            tps = {"fast": 200.0, "slow": 10.0}.get(action, 100.0)
            auto.record(KEY, rec(100, accepted), Observation(101, 100 / tps), now)
        elif action == "baseline":
            auto.record_baseline(KEY.model, KEY.workload, Observation(101, 1.0), now)
    gaps = [b - a for a, b in itertools.pairwise(claims)]
    assert all(g >= s.probe_min_spacing - EPS for g in gaps), (gaps, s.probe_min_spacing)


@st.composite
def hysteresis_case(draw: st.DrawFn) -> tuple[SpecSettings, list[tuple[float, int, int]]]:
    off = draw(st.integers(5, 60)) / 100
    on = min(1.0, off + draw(st.integers(5, 35)) / 100)
    s = SpecSettings(
        off_threshold=off,
        on_threshold=on,
        window_size=draw(st.integers(50, 400)),
        min_sample=50,
        probe_min_spacing=1,
        probe_initial=5,
        probe_max=50,
        probes_to_enable=draw(st.integers(1, 3)),
        probe_min_drafted=10,
    )
    traffic = []
    for _ in range(draw(st.integers(1, 120))):
        drafted = draw(st.integers(20, 200))
        # Strictly between the thresholds, by at least half a token.
        low, high = math.ceil(off * drafted + 0.5), math.floor(on * drafted - 0.5)
        assume(low <= high)
        traffic.append((draw(st.floats(0, 30)), drafted, draw(st.integers(low, high))))
    return s, traffic


def run(auto: AutoDisable, traffic: list[tuple[float, int, int]], now: float) -> list[Transition]:
    transitions = []
    for dt, drafted, accepted in traffic:
        now += dt
        v = auto.verdict(KEY, now)
        if v.use_speculation:
            transitions += auto.record(KEY, rec(drafted, accepted), None, now, v.ticket)
    return transitions


@settings(max_examples=examples(300), deadline=None)
@given(case=hysteresis_case())
def test_acceptance_between_the_thresholds_never_turns_speculation_off(
    case: tuple[SpecSettings, list[tuple[float, int, int]]],
) -> None:
    s, traffic = case
    auto = AutoDisable(s)
    assert run(auto, traffic, 0.0) == []
    assert auto.enabled(KEY)


@settings(max_examples=examples(300), deadline=None)
@given(case=hysteresis_case())
def test_acceptance_between_the_thresholds_never_turns_it_back_on(
    case: tuple[SpecSettings, list[tuple[float, int, int]]],
) -> None:
    s, traffic = case
    auto = AutoDisable(s)
    off = [t for i in range(4) for t in auto.record(KEY, rec(50, 0), None, float(i))]
    assert [t.state for t in off] == ["off"]
    assert run(auto, traffic, 10.0) == []
    assert not auto.enabled(KEY)


@settings(max_examples=examples(200), deadline=None)
@given(s=probe_settings(), ops=operations)
def test_transitions_alternate_and_snapshots_stay_json_ready(
    s: SpecSettings, ops: list[tuple[float, str]]
) -> None:
    auto = AutoDisable(s)
    now, transitions = 0.0, []
    for dt, action in ops:
        now += dt
        v = auto.verdict(KEY, now)
        if v.use_speculation:
            accepted = 0 if action in ("low", "bad") else 90
            tps = 10.0 if action == "slow" else 100.0
            transitions += auto.record(
                KEY, rec(100, accepted), Observation(101, 100 / tps), now, v.ticket
            )
        else:
            auto.record_baseline(KEY.model, KEY.workload, Observation(101, 1.0), now, v.ticket)
    states = [t.state for t in transitions]
    assert all(a != b for a, b in itertools.pairwise(states))
    assert not states or states[0] == "off"
    for row in auto.snapshot(now):
        assert row["state"] == ("on" if auto.enabled(KEY) else "off")
