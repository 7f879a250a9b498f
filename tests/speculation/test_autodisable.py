"""The auto-disable state machine on deterministic sequences."""

from __future__ import annotations

import itertools
import json

import pytest

from router.config.speculation import SpecSettings
from router.speculation.autodisable import AutoDisable, SpecKey, Transition, Verdict
from router.speculation.record import NotReported, Observation, SpecRecord, build_record

KEY = SpecKey("speculative", "smollm2-135m", "chat")

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


def rec(acceptance: float, drafted: int = 50, kind: str = "draft") -> SpecRecord:
    r = build_record(
        "speclane",
        "request",
        kind,
        drafted=drafted,  # type: ignore[arg-type]
        accepted=round(acceptance * drafted),
    )
    assert isinstance(r, SpecRecord)
    return r


def obs(tps: float, tokens: int = 101) -> Observation:
    return Observation(output_tokens=tokens, decode_seconds=(tokens - 1) / tps)


class Traffic:
    """Requests arriving every ``step`` seconds on one key, routed the way verdict says."""

    def __init__(self, auto: AutoDisable, key: SpecKey = KEY, now: float = 1000.0) -> None:
        self.auto, self.key, self.now = auto, key, now
        self.transitions: list[Transition] = []
        self.probes: list[float] = []

    def send(
        self,
        acceptance: float | None,
        tps: float | None = None,
        baseline_tps: float | None = None,
        step: float = 5.0,
    ) -> Verdict:
        self.now += step
        v = self.auto.verdict(self.key, self.now)
        if v.probe:
            self.probes.append(self.now)
        if v.use_speculation:
            result = None if acceptance is None else rec(acceptance)
            self.transitions += self.auto.record(
                self.key, result, None if tps is None else obs(tps), self.now, v.ticket
            )
        elif baseline_tps is not None:
            self.auto.record_baseline(
                self.key.model, self.key.workload, obs(baseline_tps), self.now, v.ticket
            )
        return v


def turned_off(auto: AutoDisable, now: float = 1000.0) -> Traffic:
    t = Traffic(auto, now=now)
    for _ in range(4):
        t.send(0.0)
    assert [tr.state for tr in t.transitions] == ["off"]
    return t


# --- acceptance collapsing ---------------------------------------------------------------------


def test_collapse_turns_off_once_with_figures() -> None:
    t = Traffic(AutoDisable(SETTINGS))
    for _ in range(10):
        t.send(0.7)
    assert t.transitions == []
    t.send(0.0)
    t.send(0.0)
    assert t.transitions == []  # 35 + 35 of 200: 0.35, still above 0.30
    t.send(0.0)
    (off,) = t.transitions
    assert (off.key, off.state, off.reason) == (KEY, "off", "low_acceptance")
    assert off.figures["acceptance"] == pytest.approx(35 / 200)
    assert off.figures["window_units"] == 200 and off.figures["next_probe_in"] == 30
    assert "low_acceptance" in off.describe() and "speculative/smollm2-135m/chat" in off.describe()
    for _ in range(3):
        assert t.send(0.0) == Verdict(False, False, "low_acceptance")
    assert len(t.transitions) == 1


def test_no_judgement_before_the_minimum_sample() -> None:
    t = Traffic(AutoDisable(SETTINGS))
    t.send(0.0)  # 50 of the 100 draft tokens needed
    assert t.transitions == []
    assert t.auto.snapshot(t.now)[0]["window"]["judging"] is False
    t.send(0.0)
    assert [tr.reason for tr in t.transitions] == ["low_acceptance"]


def test_zero_acceptance_probes_back_off_exponentially_to_the_cap() -> None:
    """Seed 003: at 0.000 acceptance vllm-mlx probed every ~1.5 s for the whole run."""
    t = turned_off(AutoDisable(SETTINGS))
    off_at = t.transitions[0].at
    for _ in range(7200):
        t.send(0.0, step=1.0)
    gaps = [b - a for a, b in itertools.pairwise(t.probes)]
    assert t.probes[0] - off_at == 30
    assert gaps[:5] == [60, 120, 240, 480, 600]
    assert set(gaps[4:]) == {600}
    # After 30 s, then 60 + 120 + 240 + 480 s apart, then every 600 s: 15 in two hours.
    assert len(t.probes) == 15
    assert len(t.transitions) == 1


# --- recovery --------------------------------------------------------------------------------


def test_a_good_probe_series_turns_it_back_on() -> None:
    t = turned_off(AutoDisable(SETTINGS))
    while len(t.probes) < 3:
        t.send(0.8, step=1.0)
    assert [p - t.probes[0] for p in t.probes] == [0, 10, 20]  # min spacing after good ones
    on = t.transitions[-1]
    assert (on.state, on.reason) == ("on", "probe_recovered")
    assert on.figures["probes"] == 3 and on.figures["acceptance"] == pytest.approx(0.8)
    window = t.auto.snapshot(t.now)[0]["window"]
    assert (window["drafted"], window["acceptance"]) == (150, 0.8)  # fresh, seeded by probes
    assert t.send(0.8).use_speculation


def test_a_bad_probe_breaks_the_series() -> None:
    t = turned_off(AutoDisable(SETTINGS))
    results = iter([0.8, 0.8, 0.1, 0.8, 0.8, 0.8])
    current = next(results)
    while len(t.transitions) < 2:
        before = len(t.probes)
        t.send(current, step=1.0)
        if len(t.probes) > before:
            current = next(results, 0.8)
    assert len(t.probes) == 6
    # good, good, bad (spacing 30 -> 60), then three good ones
    gaps = [b - a for a, b in itertools.pairwise(t.probes)]
    assert gaps == [10, 10, 60, 10, 10]


def test_small_probe_is_inconclusive_for_acceptance() -> None:
    auto = AutoDisable(SETTINGS)
    t = turned_off(auto)
    while not t.probes:
        t.now += 1
        v = auto.verdict(KEY, t.now)
        if v.probe:
            t.probes.append(t.now)
            assert auto.record(KEY, rec(1.0, drafted=8), None, t.now, v.ticket) == []
    row = auto.snapshot(t.now)[0]
    assert row["probe"]["last_outcome"] == "inconclusive" and row["probe"]["good_streak"] == 0
    assert row["probe"]["spacing"] == 60


def test_relapse_soon_after_recovery_starts_probing_further_apart() -> None:
    t = turned_off(AutoDisable(SETTINGS))
    while len(t.transitions) < 2:
        t.send(0.8, step=1.0)
    recovered = t.now
    while len(t.transitions) < 3:
        t.send(0.0)
    assert t.now - recovered < SETTINGS.probe_max
    assert t.transitions[-1].figures["next_probe_in"] == 60  # 2 x probe_initial


# --- flapping ---------------------------------------------------------------------------------


def oscillating(auto: AutoDisable, start: list[float]) -> Traffic:
    t = Traffic(auto)
    for a in start:
        t.send(a)
    for _ in range(30):
        for a in [0.32] * 4 + [0.42] * 4:
            t.send(a)
    return t


def test_hysteresis_holds_acceptance_oscillating_between_the_thresholds() -> None:
    assert oscillating(AutoDisable(SETTINGS), [0.6] * 4).transitions == []
    stays_off = oscillating(AutoDisable(SETTINGS), [0.0] * 4)
    assert [tr.state for tr in stays_off.transitions] == ["off"]


def test_without_hysteresis_the_same_traffic_flaps() -> None:
    single = SETTINGS.model_copy(
        update={"off_threshold": 0.37, "on_threshold": 0.37, "probes_to_enable": 1}
    )
    flapping = oscillating(AutoDisable(single), [0.6] * 4)
    # The relapse back-off slows it down, but it still flips every few cycles.
    assert len(flapping.transitions) >= 4


# --- speed ---------------------------------------------------------------------------------------


def test_good_acceptance_but_slower_turns_off_as_not_faster() -> None:
    auto = AutoDisable(SETTINGS)
    t = Traffic(auto)
    for _ in range(3):
        auto.record_baseline(KEY.model, KEY.workload, obs(50.0), t.now)
    t.send(0.8, tps=45.0)
    t.send(0.8, tps=46.0)
    assert t.transitions == []
    t.send(0.8, tps=44.0)
    (off,) = t.transitions
    assert (off.reason, off.figures["spec_tps"], off.figures["baseline_tps"]) == (
        "not_faster",
        45.0,
        50.0,
    )
    assert off.figures["ratio"] == pytest.approx(0.9)
    # Probes with fine acceptance but no speed gain stay bad; faster ones bring it back.
    while len(t.probes) < 2:
        t.send(0.8, tps=48.0, step=1.0)
    assert len(t.transitions) == 1
    while len(t.transitions) < 2:
        t.send(0.8, tps=60.0, step=1.0)
    assert t.transitions[-1].reason == "probe_recovered"


def test_not_faster_needs_a_speed_measured_on_the_probe() -> None:
    auto = AutoDisable(SETTINGS)
    t = Traffic(auto)
    for _ in range(3):
        auto.record_baseline(KEY.model, KEY.workload, obs(50.0), t.now)
    for _ in range(3):
        t.send(0.9, tps=40.0)
    assert t.transitions[-1].reason == "not_faster"
    for _ in range(400):
        t.send(0.9, tps=None, step=1.0)  # acceptance alone cannot clear a speed verdict
    assert len(t.transitions) == 1
    assert auto.snapshot(t.now)[0]["probe"]["last_outcome"] == "inconclusive"


def test_backend_without_statistics_is_judged_on_speed_alone() -> None:
    auto = AutoDisable(SETTINGS)
    key = SpecKey("ollama", "llama3.2", "chat")
    for i in range(3):
        auto.record_baseline(key.model, key.workload, obs(30.0), float(i))
    out = []
    for i in range(3):
        out += auto.record(key, NotReported("ollama", "not_supported"), obs(25.0), 10.0 + i)
    assert [tr.reason for tr in out] == ["not_faster"]
    assert auto.acceptance(key) is None


def test_speeds_measured_under_load_are_not_compared() -> None:
    auto = AutoDisable(SETTINGS)
    for i in range(5):
        auto.record_baseline(KEY.model, KEY.workload, obs(50.0), float(i))
        busy = Observation(output_tokens=101, decode_seconds=10.0, solo=False)
        assert auto.record(KEY, rec(0.8), busy, float(i)) == []
    assert auto.snapshot(10.0)[0]["speed"]["spec_samples"] == 0


def test_model_wide_baseline_stands_in_for_a_workload_without_one() -> None:
    auto = AutoDisable(SETTINGS)
    for i in range(3):
        auto.record_baseline(KEY.model, "code", obs(50.0), float(i))
    out = []
    for i in range(3):
        out += auto.record(KEY, rec(0.8), obs(40.0), 10.0 + i)
    assert [tr.reason for tr in out] == ["not_faster"]
    assert auto.snapshot(20.0)[0]["speed"]["baseline_scope"] == "model"


# --- claims: probes and baseline samples ---------------------------------------------------------


def test_only_one_of_two_concurrent_requests_probes() -> None:
    auto = AutoDisable(SETTINGS)
    t = turned_off(auto)
    due = t.now + 30
    first, second = auto.verdict(KEY, due), auto.verdict(KEY, due)
    assert first.probe and first.use_speculation and first.ticket is not None
    assert second == Verdict(False, False, "low_acceptance")
    assert auto.peek(KEY, due) == second
    auto.cancel(first.ticket, due + 1)  # the client went away: inconclusive, backed off
    assert not auto.verdict(KEY, due + 59).probe
    assert auto.verdict(KEY, due + 60).probe


def test_an_unreturned_probe_lapses_and_its_late_result_is_ignored() -> None:
    auto = AutoDisable(SETTINGS)
    t = turned_off(auto)
    claimed = auto.verdict(KEY, t.now + 30)
    assert claimed.probe
    assert not auto.verdict(KEY, t.now + 30 + 119).probe
    again = auto.verdict(KEY, t.now + 30 + 120)  # lapsed: inconclusive, next due at +60
    assert again.probe and again.ticket != claimed.ticket
    assert auto.record(KEY, rec(0.9), None, t.now + 200, claimed.ticket) == []
    assert auto.snapshot(t.now + 200)[0]["probe"]["good_streak"] == 0


def test_baseline_sample_is_asked_once_per_spacing_until_known() -> None:
    auto = AutoDisable(SETTINGS)
    for i in range(3):
        assert auto.verdict(KEY, float(i)) == Verdict(True, False, "on")
        auto.record(KEY, rec(0.8), obs(40.0), float(i))
    ask = auto.verdict(KEY, 10.0)
    assert (ask.use_speculation, ask.reason) == (False, "baseline_sample")
    assert auto.verdict(KEY, 10.0) == Verdict(True, False, "on")  # one at a time
    auto.record_baseline(KEY.model, KEY.workload, obs(35.0), 12.0, ask.ticket)
    assert auto.verdict(KEY, 69.0).reason == "on"
    second = auto.verdict(KEY, 70.0)
    assert second.reason == "baseline_sample"
    auto.cancel(second.ticket, 71.0)  # could not run without speculation
    for i in range(2):
        auto.record_baseline(KEY.model, KEY.workload, obs(35.0), 72.0 + i)
    assert auto.verdict(KEY, 500.0).reason == "on"  # baseline known: no more asks


def test_predicted_outputs_do_not_count_as_drafts() -> None:
    auto = AutoDisable(SETTINGS)
    for i in range(10):
        assert auto.record(KEY, rec(0.0, kind="predicted_output"), None, float(i)) == []
    assert auto.acceptance(KEY) is None


# --- configuration -----------------------------------------------------------------------------


def test_disabled_auto_disable_only_watches() -> None:
    auto = AutoDisable(SETTINGS.model_copy(update={"enabled": False}))
    t = Traffic(auto)
    for _ in range(10):
        assert t.send(0.0) == Verdict(True, False, "auto_disable_off")
    assert t.transitions == []
    assert auto.acceptance(KEY) == 0.0 and auto.enabled(KEY)


def test_per_policy_settings_by_workload() -> None:
    strict = SETTINGS.model_copy(update={"off_threshold": 0.6, "on_threshold": 0.7})
    auto = AutoDisable(SETTINGS, resolve=lambda k: strict if k.workload == "code" else SETTINGS)
    code = SpecKey(KEY.backend, KEY.model, "code")
    out = []
    for i in range(4):
        out += auto.record(KEY, rec(0.5), None, float(i))
        out += auto.record(code, rec(0.5), None, float(i))
    assert [(tr.key.workload, tr.reason) for tr in out] == [("code", "low_acceptance")]
    assert auto.enabled(KEY) and not auto.enabled(code)


def test_reconfigure_keeps_state_and_resizes_windows() -> None:
    auto = AutoDisable(SETTINGS)
    turned_off(auto)
    auto.reconfigure(SETTINGS.model_copy(update={"window_size": 100, "min_sample": 50}))
    row = auto.snapshot(2000.0)[0]
    assert row["state"] == "off" and row["window"]["units"] == 100


def test_keys_are_bounded_and_switched_off_ones_are_kept_longest() -> None:
    auto = AutoDisable(SETTINGS.model_copy(update={"max_keys": 3}))
    turned_off(auto)
    for i in range(5):
        auto.record(SpecKey("b", "m", f"w{i}"), rec(0.8), None, 2000.0 + i)
    assert len(auto.keys()) == 3 and KEY in auto.keys()
    assert not auto.enabled(KEY)


def test_snapshot_is_json_ready() -> None:
    auto = AutoDisable(SETTINGS)
    off_at = turned_off(auto).transitions[0].at
    (row,) = auto.snapshot(off_at + 5)
    json.dumps(row)
    assert (row["state"], row["reason"], row["workload"]) == ("off", "low_acceptance", "chat")
    assert row["probe"]["next_in"] == 25 and row["probe"]["in_flight"] is False
    assert row["window"]["acceptance"] == 0.0
    assert row["thresholds"] == {
        "off": 0.3,
        "on": 0.45,
        "off_speed_margin": 0.05,
        "on_speed_margin": 0.1,
    }


def test_where_the_lane_chooses_low_acceptance_turns_nothing_off_but_slowness_does() -> None:
    """Under ``auto`` the lane drafts only what it measures to pay: cheap drafts kept one
    time in five are its choice. Only decoding no faster than plain turns the key off."""
    key = SpecKey("speculative", "smollm2-135m", "code", "auto")
    t = Traffic(AutoDisable(SETTINGS), key=key)
    for i in range(5):  # the lane's plain traffic (penalties, num_draft_tokens: 0)
        t.auto.record_baseline(key.model, key.workload, obs(20.0), float(i), lane=key.backend)
    for _ in range(10):
        t.send(0.2, tps=30.0)
    assert t.transitions == []
    for _ in range(20):
        t.send(0.9, tps=15.0)  # kept well, and slower than plain
    assert [tr.reason for tr in t.transitions] == ["not_faster"]


def test_where_the_lane_chooses_no_request_is_spent_on_a_baseline_sample() -> None:
    key = SpecKey("speculative", "smollm2-135m", "code", "auto")
    t = Traffic(AutoDisable(SETTINGS), key=key)
    verdicts = [t.send(0.5, tps=30.0, step=60.0) for _ in range(40)]
    assert all(v.use_speculation for v in verdicts)
    assert "baseline_sample" not in {v.reason for v in verdicts}
