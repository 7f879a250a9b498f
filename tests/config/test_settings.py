from __future__ import annotations

from pathlib import Path

import pytest

from router.config.settings import ConfigError, load_settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "speclane.toml"
    path.write_text(text)
    return path


def test_defaults_bind_loopback() -> None:
    s = load_settings()
    assert s.host == "127.0.0.1"
    assert s.lanes.enabled
    assert set(s.presets) >= {"interactive", "throughput"}


def test_file_is_parsed_into_frozen_values(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
port = 9000
[[backends]]
name = "lmstudio"
kind = "lmstudio"
base_url = "http://127.0.0.1:1234/v1/"
api_key = "secret"
models = ["qwen"]
""",
    )
    s = load_settings(path)
    b = s.backends[0]
    assert (s.port, b.kind, b.base_url, b.root_url) == (
        9000,
        "lmstudio",
        "http://127.0.0.1:1234/v1",
        "http://127.0.0.1:1234",
    )
    assert "secret" not in repr(b)
    with pytest.raises(Exception, match="frozen"):
        s.port = 1  # type: ignore[misc]


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "port = 9000\n[lanes]\nenabled = true\nnum_draft_tokens = 4\n")
    monkeypatch.setenv("SPECLANE_PORT", "9100")
    monkeypatch.setenv("SPECLANE_LANES__ENABLED", "false")
    s = load_settings(path)
    assert s.port == 9100
    assert not s.lanes.enabled
    assert s.lanes.num_draft_tokens == 4  # the rest of the table survives the override


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port = 'x'", "speclane.toml: port: Input should be a valid integer"),
        (
            "[[backends]]\nname='a'\nkind='nope'\nbase_url='http://x/v1'",
            "speclane.toml: backends.0.kind: Input should be",
        ),
        ("[[backends]]\nname='a'\nbase_url='ftp://x'", "backends.0.base_url: must start"),
        (
            "[[backends]]\nname='speculative'\nbase_url='http://x/v1'",
            "reserved for speclane's own lane",
        ),
        (
            "[[backends]]\nname='a'\nbase_url='http://x/v1'\n[[backends]]\nname='a'\nbase_url='http://y/v1'",
            "backend name 'a' is used twice",
        ),
        ("bogus = 1", "speclane.toml: bogus: Extra inputs are not permitted"),
        ("port = = 1", "speclane.toml: invalid TOML"),
        ("[lanes]\nnum_draft_tokens = 0", "lanes.num_draft_tokens: Input should be greater"),
    ],
)
def test_invalid_file_names_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings(write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_settings(tmp_path / "absent.toml")


def test_command_line_flags_beat_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "port = 9000\n")
    monkeypatch.setenv("SPECLANE_PORT", "9100")
    assert load_settings(path, port=9200).port == 9200


def test_unreadable_file_and_bad_environment_are_clear_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path)  # a directory
    monkeypatch.setenv("SPECLANE_LANES", "{not json")
    with pytest.raises(ConfigError, match="environment"):
        load_settings()
