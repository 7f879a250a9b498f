"""``speclane policy check``: the resolved table, and errors that name file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.cli.main import main as speclane
from router.cli.policy import main

REPO_POLICIES = Path(__file__).resolve().parents[2] / "policies"


def test_shipped_policies_print_the_table(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPECLANE_BATCH_API_KEY", "batch-secret-value")
    assert speclane(["policy", "check", str(REPO_POLICIES)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    rows = {line.split()[0]: line for line in out.splitlines() if line and line[0].isalpha()}
    assert "5 client(s), all valid" in out
    assert "user-agent: /^claude-cli//" in rows["claude-code"]
    assert "header: openclaw" in rows["openclaw"]
    assert "interactive * -> speculative (policy)" in rows["openclaw"]
    assert "priority 10" in rows["openclaw"]
    assert "api key: $SPECLANE_BATCH_API_KEY" in rows["batch"]
    assert "throughput * -> batching (policy)" in rows["batch"]
    assert "batch-secret-value" not in out
    assert "every other request" in rows["default"]
    # The default comes last: it is what is left when nothing else matched.
    assert [name for name in rows if name in ("batch", "default", "openclaw", "opta-cli")] == [
        "batch",
        "openclaw",
        "opta-cli",
        "default",
    ]


def test_notes_and_warnings_go_to_stderr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SPECLANE_BATCH_API_KEY", raising=False)
    assert main(["check", str(REPO_POLICIES)]) == 0
    err = capsys.readouterr().err
    assert "note: " in err and "until $SPECLANE_BATCH_API_KEY is set" in err
    assert "warning: " not in err  # the shipped files are right; the machine lacks the key
    (tmp_path / "a.toml").write_text('require_api_key = true\n[match]\nclient_header = ["a"]\n')
    assert main(["check", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "warning: " in err and "no usable key" in err


def test_invalid_policies_exit_1_naming_file_and_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "a.toml").write_text('[match]\nuser_agent = ["(oops"]\n')
    (tmp_path / "b.toml").write_text("max_concurrency = 0\n")
    assert main(["check", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{tmp_path / 'a.toml'}: match.user_agent: " in err
    assert "invalid regular expression" in err
    assert f"{tmp_path / 'b.toml'}: max_concurrency: " in err


def test_inline_keys_are_masked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.toml").write_text('[match]\napi_keys = ["sk-very-secret"]\n')
    assert main(["check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "sk-very-secret" not in out and "api key: key#" in out
    assert "(implied)" in out


def test_presets_come_from_the_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policies = tmp_path / "p"
    policies.mkdir()
    (policies / "a.toml").write_text('default_preset = "fast"\n')
    assert main(["check", str(policies)]) == 1
    assert "unknown preset 'fast' (configured presets: interactive, throughput)" in (
        capsys.readouterr().err
    )
    config = tmp_path / "speclane.toml"
    config.write_text(f'policies_dir = "{policies}"\n[presets.fast]\nlane = "speculative"\n')
    assert main(["check", "--config", str(config)]) == 0
    assert "fast * -> speculative (preset)" in capsys.readouterr().out


def test_a_missing_directory_and_usage_errors(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", str(tmp_path / "nope")]) == 1
    assert "not a directory" in capsys.readouterr().err
    assert main([]) == 2
    assert main(["check", "--help"]) == 0
    assert "policies directory" in capsys.readouterr().out


def test_the_table_says_whose_prompt_cache_a_client_shares(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.toml").write_text('require_api_key = true\n[match]\napi_keys = ["sk-a-0001"]\n')
    (tmp_path / "b.toml").write_text(
        'cache_group = "team"\n[match]\napi_keys = ["sk-b-0001"]\nclient_header = ["b"]\n'
    )
    (tmp_path / "c.toml").write_text('[match]\nclient_header = ["c"]\n')
    assert main(["check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [line.rstrip() for line in out.splitlines()]
    assert any(line.endswith("prompt cache: own") for line in lines)  # a: keys only
    b = next(i for i, line in enumerate(lines) if line.endswith("prompt cache: group team"))
    assert lines[b + 1].endswith("(default without the key)")  # b: also by its header
    assert any(line.endswith("prompt cache: default (no key)") for line in lines)  # c
    assert any(line.endswith("prompt cache: default") for line in lines)  # the default


def test_the_table_says_which_models_a_client_may_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.toml").write_text('[models]\nload = ["qwen*"]\n')
    (tmp_path / "b.toml").write_text("[models]\nload = []\n")
    (tmp_path / "c.toml").write_text("priority = 1\n")
    assert main(["check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "may load: qwen*" in out and "may load: none" in out
    assert out.count("may load:") == 2  # unset: not shown (every model it may use)
