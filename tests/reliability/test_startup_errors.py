"""Configuration and policy files with every kind of error: a clear message, and no start.

Each case runs ``speclane serve`` (``router.cli.serve.main``, in-process for speed; two cases
also as a real subprocess for the exit code) and checks: it refuses to start, exits with 2
(configuration) or 1 (policies), never prints a traceback, and its message names the file,
the key and the problem. tests/config/test_settings.py and tests/config/test_policies.py
check the loaders; this is what a user sees from the command.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from router.cli.serve import main
from tests.reliability.harness import TALLY, run_serve

OK_BACKEND = '[[backends]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\n'


@dataclass(frozen=True)
class Case:
    name: str
    config: str | bytes | None  # None: no such file
    expect: tuple[str, ...]  # substrings of the message (the file path is checked too)
    policies: dict[str, str | bytes] | None = None  # file -> text
    env: dict[str, str] | None = None
    args: tuple[str, ...] = ()


CONFIG_CASES = [
    Case("missing_file", None, ("file not found",)),
    Case("invalid_toml", "port = \n", ("invalid TOML",)),
    Case("unknown_key", "prot = 8080\n", ("prot", "Extra inputs are not permitted")),
    # (not the port: the command line's --port 0 would override it)
    Case("wrong_type", 'health_interval = "often"\n', ("health_interval", "valid number")),
    Case("out_of_range", "shutdown_grace = -5\n", ("shutdown_grace", "greater than or equal")),
    Case("tiny_body_limit", "max_body_bytes = 10\n", ("max_body_bytes",)),
    Case("bad_enum", 'expose_metrics = "sometimes"\n', ("expose_metrics", "public")),
    Case("bad_log_level", 'log_level = "loud"\n', ("log_level",)),
    Case(
        "backend_without_url",
        '[[backends]]\nname = "a"\n',
        ("backends.0.base_url", "Field required"),
    ),
    Case(
        "backend_bad_scheme",
        '[[backends]]\nname = "a"\nbase_url = "ftp://x/v1"\n',
        ("backends.0.base_url", "http://"),
    ),
    Case(
        "backend_reserved_name",
        OK_BACKEND.replace('"a"', '"speculative"'),
        ("backends.0.name", "reserved"),
    ),
    Case("backend_bad_name", OK_BACKEND.replace('"a"', '"bad name!"'), ("backends.0.name",)),
    Case("backend_twice", OK_BACKEND * 2, ("'a' is used twice",)),
    Case("backend_typo", OK_BACKEND + "read_timout = 3\n", ("backends.0.read_timout",)),
    Case(
        "backend_negative_timeout",
        OK_BACKEND + "read_timeout = -1\n",
        ("backends.0.read_timeout", "greater than 0"),
    ),
    Case("backends_not_a_list", 'backends = "a"\n', ("backends",)),
    Case("lanes_draft_tokens", "[lanes]\nnum_draft_tokens = 0\n", ("lanes.num_draft_tokens",)),
    Case("retry_attempts", "[retry]\nattempts = 0\n", ("retry.attempts",)),
    Case("env_wrong_type", "", ("health_interval",), env={"SPECLANE_HEALTH_INTERVAL": "abc"}),
]

CONFIG_CRASHES = [  # tracebacks today: see the report / router/config.py load_settings
    Case("config_is_a_directory", "DIR", ("cannot read",)),
    Case("config_not_utf8", b"port = 8080\n# \xff\xfe\n", ("cannot read",)),
    Case("env_invalid_json", "", ("lanes",), env={"SPECLANE_LANES": "{not json"}),
]

P = "default.toml"
POLICY_CASES = [
    Case("policy_invalid_toml", "", ("invalid TOML",), {"x.toml": "client = ["}),
    Case("policy_unknown_key", "", ("prioritee", "Extra inputs"), {"x.toml": "prioritee = 1\n"}),
    Case("policy_wrong_type", "", ("priority",), {"x.toml": 'priority = "high"\n'}),
    Case("policy_out_of_range", "", ("priority",), {"x.toml": "priority = 5000\n"}),
    Case("policy_bad_client_name", "", ("client",), {"x.toml": 'client = "bad name"\n'}),
    Case(
        "policy_duplicate_client",
        "",
        ("already defined",),
        {"x.toml": 'client = "same"\n', "y.toml": 'client = "same"\n'},
    ),
    Case(
        "policy_duplicate_key",
        "",
        ("already used by client",),
        {
            "x.toml": '[match]\napi_keys = ["sk-one-0123456789"]\n',
            "y.toml": '[match]\napi_keys = ["sk-one-0123456789"]\n',
        },
    ),
    Case(
        "policy_duplicate_header",
        "",
        ("already used",),
        {
            "x.toml": '[match]\nclient_header = ["h"]\n',
            "y.toml": '[match]\nclient_header = ["h"]\n',
        },
    ),
    Case(
        "policy_bad_regex",
        "",
        ("match.user_agent", "invalid regular expression"),
        {"x.toml": '[match]\nuser_agent = ["(unclosed"]\n'},
    ),
    Case(
        "policy_unknown_preset",
        "",
        ("default_preset", "unknown preset 'warp'"),
        {"x.toml": 'default_preset = "warp"\n'},
    ),
    Case(
        "policy_preset_not_listed",
        "",
        ("default_preset",),
        {"x.toml": 'presets = ["interactive"]\ndefault_preset = "throughput"\n'},
    ),
    Case(
        "policy_default_with_match",
        "",
        ("match.client_header", "default policy"),
        {P: '[match]\nclient_header = ["x"]\n'},
    ),
    Case("policy_zero_cap", "", ("caps.max_tokens",), {"x.toml": "[caps]\nmax_tokens = 0\n"}),
    Case(
        "policy_negative_queue_timeout", "", ("queue_timeout",), {"x.toml": "queue_timeout = -1\n"}
    ),
    Case(
        "policy_bad_env_name",
        "",
        ("match.api_key_env", "not an environment variable"),
        {"x.toml": '[match]\napi_key_env = ["1BAD"]\n'},
    ),
    Case(
        "policy_empty_key",
        "",
        ("match.api_keys", "empty API key"),
        {"x.toml": '[match]\napi_keys = [""]\n'},
    ),
    Case("policy_not_utf8", "", ("cannot read",), {"x.toml": b"priority = 1\n# \xff\n"}),
    Case("policies_dir_missing", "", ("not a directory",), None, args=("--policies", "MISSING")),
    Case("policies_dir_is_a_file", "", ("not a directory",), None, args=("--policies", "FILE")),
]


def prepare(case: Case, tmp: Path) -> tuple[list[str], Path, Path]:
    """The serve arguments for ``case``; returns (argv, config path, policies dir)."""
    config = tmp / "speclane.toml"
    policies = tmp / "policies"
    policies.mkdir()
    for name, text in (case.policies or {}).items():
        target = policies / name
        target.write_bytes(text if isinstance(text, bytes) else text.encode())
    if case.config == "DIR":
        config = tmp / "config-dir"
        config.mkdir()
    elif isinstance(case.config, bytes):
        config.write_bytes(case.config)
    elif case.config is not None:
        config.write_text(case.config)
    argv = ["--no-lanes", "--port", "0", "--config", str(config)]
    args = list(case.args)
    if "MISSING" in args:
        policies = tmp / "no-such-dir"
        args[args.index("MISSING")] = str(policies)
    elif "FILE" in args:
        policies = tmp / "a-file"
        policies.write_text("")
        args[args.index("FILE")] = str(policies)
    else:
        args += ["--policies", str(policies)]
    return argv + args, config, policies


def check_refusal(case: Case, code: int, out: str, err: str, config: Path, policies: Path) -> None:
    assert "listening" not in out, "the router started"
    assert "Traceback" not in err, err
    is_policy = case.name.startswith("polic")
    assert code == (1 if is_policy else 2), (code, err)
    if not case.env:  # a bad environment variable has no file to name
        named = policies if is_policy else config
        assert str(named) in err, err
    for text in case.expect:
        assert text in err, f"{text!r} not in:\n{err}"


class Started(Exception):
    """The router got as far as binding its port: the case was not refused."""


def run_in_process(
    case: Case, tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refuse_to_listen(self: web.TCPSite) -> None:
        raise Started(case.name)

    monkeypatch.setattr(web.TCPSite, "start", refuse_to_listen)  # in-process: never serve
    for name in [k for k in os.environ if k.startswith("SPECLANE_")]:
        monkeypatch.delenv(name)
    for name, value in (case.env or {}).items():
        monkeypatch.setenv(name, value)
    argv, config, policies = prepare(case, tmp)
    try:
        code = main(argv)
    except BaseException as e:  # a crash is a failure with the reason shown
        raise AssertionError(f"serve crashed: {e!r}") from e
    captured = capsys.readouterr()
    check_refusal(case, code, captured.out, captured.err, config, policies)
    TALLY.fault("bad_policy" if case.name.startswith("polic") else "bad_config")


@pytest.mark.parametrize("case", CONFIG_CASES + POLICY_CASES, ids=lambda c: c.name)
def test_bad_configuration_is_refused_with_a_clear_message(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_in_process(case, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("case", CONFIG_CRASHES, ids=lambda c: c.name)
def test_unreadable_configuration_is_refused_with_a_clear_message(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_in_process(case, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("case", [CONFIG_CASES[2], POLICY_CASES[5]], ids=lambda c: c.name)
async def test_the_real_command_exits_without_listening(case: Case, tmp_path: Path) -> None:
    argv, config, policies = prepare(case, tmp_path)
    code, out, err = await run_serve(*argv)
    check_refusal(case, code, out, err, config, policies)
    TALLY.fault("bad_policy" if case.name.startswith("polic") else "bad_config")
