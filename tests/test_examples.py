"""The shipped examples stay true: the example configuration documents the real defaults,
and the shipped policies validate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from router.config import load_settings
from router.policy import load_policies

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SPECLANE_"):
            monkeypatch.delenv(key)


def test_example_config_states_every_default() -> None:
    example = load_settings(ROOT / "examples" / "speclane.toml")
    assert example.model_dump() == load_settings().model_dump()


def test_example_config_mentions_every_top_level_key() -> None:
    text = (ROOT / "examples" / "speclane.toml").read_text()
    settings = load_settings()
    for key in type(settings).model_fields:
        assert f"{key} =" in text or f"[{key}" in text or f"[[{key}" in text or (
            f"# {key} =" in text), key


def test_shipped_policies_are_valid() -> None:
    policies = load_policies(ROOT / "policies", presets=load_settings().presets.keys())
    assert {p.client for p in policies} >= {"default", "openclaw", "opta-cli"}
