"""A configuration key with a typo gets a "did you mean", in a file and in a policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.config.policies import PolicyError, load_policies
from router.config.settings import ConfigError, load_settings


@pytest.mark.parametrize(
    ("toml", "wrong", "right"),
    [
        ("max_body_byte = 100\n", "max_body_byte", "max_body_bytes"),
        (
            '[[backends]]\nname = "a"\nbase_url = "http://x/v1"\nmax_concurency = 2\n',
            "backends.0.max_concurency",
            "max_concurrency",
        ),
        ("[spec]\non_treshold = 0.5\n", "spec.on_treshold", "on_threshold"),
        ("[lanes]\nenabeld = false\n", "lanes.enabeld", "enabled"),
    ],
)
def test_settings_typo_gets_did_you_mean(tmp_path: Path, toml: str, wrong: str, right: str) -> None:
    path = tmp_path / "speclane.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert f"{wrong}: Extra inputs are not permitted (did you mean '{right}'?)" in message


def test_no_suggestion_for_a_key_like_nothing(tmp_path: Path) -> None:
    path = tmp_path / "speclane.toml"
    path.write_text("zzzz_qqq = 1\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert "did you mean" not in str(info.value)


def test_policy_typo_gets_did_you_mean(tmp_path: Path) -> None:
    (tmp_path / "agent.toml").write_text(
        'client = "agent"\nmax_concurency = 4\n[match]\nclient_headr = ["agent"]\n'
    )
    with pytest.raises(PolicyError) as info:
        load_policies(tmp_path)
    message = str(info.value)
    assert (
        "max_concurency: Extra inputs are not permitted (did you mean 'max_concurrency'?)"
        in message
    )
    assert (
        "match.client_headr: Extra inputs are not permitted (did you mean 'client_header'?)"
        in message
    )
