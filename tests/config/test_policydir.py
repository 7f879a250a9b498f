"""Where the policies come from: relative to the configuration file, ./policies, policies/
next to the configuration, the defaults shipped in the package; serve from elsewhere."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from router.app import initial_policies
from router.cli.policy import run_check
from router.config import policydir
from router.config.policies import load_policies
from router.config.settings import load_settings
from tests.conftest import fake_upstreams
from tests.reliability import harness
from tests.reliability.harness import RouterProcess, chat_body, config_text

REPO = Path(__file__).resolve().parents[2]


def test_policies_dir_in_a_config_file_is_relative_to_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "etc").mkdir()
    config = tmp_path / "etc" / "speclane.toml"
    config.write_text('policies_dir = "mine"\n')
    monkeypatch.chdir(REPO)  # a ./policies here must not win over the file's setting
    assert load_settings(config).policies_dir == tmp_path / "etc" / "mine"
    config.write_text(f'policies_dir = "{tmp_path}/abs"\n')
    assert load_settings(config).policies_dir == tmp_path / "abs"


def test_a_flag_or_the_environment_stays_relative_to_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "speclane.toml"
    config.write_text('policies_dir = "mine"\n')
    assert load_settings(config, policies_dir=Path("flag")).policies_dir == Path("flag")
    monkeypatch.setenv("SPECLANE_POLICIES_DIR", "env")
    assert load_settings(config).policies_dir == Path("env")


def test_default_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECLANE_POLICIES_DIR", raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = tmp_path / "speclane.toml"
    config.write_text("port = 9000\n")
    # nothing here, nothing next to the config: the defaults shipped in the package
    settings = load_settings(config)
    assert settings.policies_dir == policydir.PACKAGED_POLICIES
    assert "policies_dir" not in settings.model_fields_set
    # policies/ next to the configuration file
    (tmp_path / "policies").mkdir()
    assert load_settings(config).policies_dir == tmp_path / "policies"
    # ./policies first
    (elsewhere / "policies").mkdir()
    assert load_settings(config).policies_dir == Path("policies")


def test_the_shipped_defaults_are_the_repository_policies() -> None:
    shipped = load_policies(policydir.PACKAGED_POLICIES)
    assert {p.client for p in shipped} >= {"default", "openclaw", "opta-cli"}
    assert sorted(p.name for p in policydir.PACKAGED_POLICIES.glob("*.toml")) == sorted(
        p.name for p in (REPO / "policies").glob("*.toml")
    )


def test_policy_check_from_another_directory_checks_what_serve_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SPECLANE_POLICIES_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert run_check(None, None) == 0
    assert "all valid" in capsys.readouterr().out


def test_no_policies_anywhere_is_said_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SPECLANE_POLICIES_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(policydir, "PACKAGED_POLICIES", tmp_path / "not-installed")
    settings = load_settings()
    policies = initial_policies(settings)
    assert [p.client for p in policies] == ["default"]
    err = capsys.readouterr().err
    assert "EVERY CLIENT GETS THE PERMISSIVE DEFAULT POLICY" in err


async def test_serve_started_from_another_directory_uses_the_shipped_policies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with fake_upstreams("fake") as (fake,):
        config = tmp_path / "speclane.toml"
        config.write_text(
            config_text(log_level="info", backends=[{"name": "fake", "base_url": fake.base_url}])
        )
        monkeypatch.setattr(harness, "REPO", tmp_path)  # the subprocess's working directory
        env = harness.clean_env(PYTHONPATH=str(REPO))
        proc = await RouterProcess.start(config, "--no-lanes", env=env)
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.post(
                    f"{proc.base_url}/chat/completions",
                    json=chat_body(),
                    headers={"X-Speclane-Client": "openclaw"},
                ) as resp,
            ):
                assert resp.status == 200
                client = resp.headers["X-Speclane-Client"]
        finally:
            await proc.stop()
    assert client == "openclaw"  # the shipped openclaw policy matched
    assert any("the defaults shipped with speclane" in line for line in proc.stderr)
