"""A scorecard's pairs as ``[[gating.pairs]]`` rules: what they record, and that the TOML
round-trips into the gating settings (strict mode then denies a pair below its floor)."""

from __future__ import annotations

import tomllib

import pytest

from router.bench.scorecard.pair_rules import pair_rule_from_bench, rules_to_toml
from router.config.gating import SETTINGS_KEY, GatingSettings
from router.lanes.gating.decide import decide
from router.lanes.gating.findings import PairReport

PAIRS = [
    {
        "target": "/home/u/.local/share/speclane/models/SmolLM2-135M-Instruct",
        "draft": "/home/u/.local/share/speclane/models/SmolLM2-135M-Instruct-draft",
        "acceptance_by_family": {"fact": 0.4, "code": 0.7, "counting": 0.9, "story": 0.35},
        "passed_floor": True,
        "floor": 0.3,
    },
    {
        "target": "mlx-community/Qwen2.5-7B-Instruct-4bit",
        "draft": "mlx-community/Qwen2.5-0.5B-Instruct-4bit",
        "acceptance": 0.21,
        "acceptance_by_family": {"code": 0.1, 'chat "long"': 0.32},
        "passed_floor": False,
    },
]


def test_pair_rule_from_bench() -> None:
    rule = pair_rule_from_bench(PAIRS[0], when="2026-02-23")
    assert (rule.target, rule.draft) == ("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct-draft")
    assert rule.action == "allow" and rule.passed_floor is True
    assert rule.measured_acceptance == pytest.approx((0.4 + 0.7 + 0.9 + 0.35) / 4, abs=1e-3)
    assert rule.note == "speclane bench 2026-02-23, floor 0.3"
    failed = pair_rule_from_bench(PAIRS[1])
    assert failed.measured_acceptance == 0.21 and failed.passed_floor is False
    assert failed.target == "mlx-community/Qwen2.5-7B-Instruct-4bit"


def test_rules_round_trip_through_toml() -> None:
    rules = tuple(pair_rule_from_bench(p, when="2026-02-23") for p in PAIRS)
    parsed = tomllib.loads(rules_to_toml(rules))
    assert GatingSettings(**parsed[SETTINGS_KEY]).pairs == rules
    strict = GatingSettings(mode="strict", pairs=rules)
    d = decide(
        PairReport("a", "b"),
        strict,
        "mlx-community/Qwen2.5-7B-Instruct-4bit",
        "mlx-community/Qwen2.5-0.5B-Instruct-4bit",
    )
    assert d.fatal and d.code == "below_floor"
    assert rules_to_toml(()) == ""
