"""The shipped examples stay true: the example configuration documents the real defaults,
and the shipped policies validate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from router.config.policies import load_policies
from router.config.settings import load_settings

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
        assert (
            f"{key} =" in text or f"[{key}" in text or f"[[{key}" in text or (f"# {key} =" in text)
        ), key


def test_shipped_policies_are_valid() -> None:
    policies = load_policies(ROOT / "policies", presets=load_settings().presets.keys())
    assert {p.client for p in policies} >= {"default", "openclaw", "opta-cli"}


def _count_instructions():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "count_instructions", ROOT / "examples" / "count_instructions.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_count_instructions_reads_the_last_callgrind_dump(tmp_path: Path) -> None:
    tool = _count_instructions()
    for n, total in ((1, 5), (2, 7), (10, 123456)):  # .10 sorts before .2 as text
        (tmp_path / f"callgrind.out.{n}").write_text(
            f"# callgrind format\nevents: Ir\n\nsummary: {total}\ntotals: {total}\n"
        )
    last = tool.latest_dump(tmp_path)
    assert last.name == "callgrind.out.10"
    assert tool.callgrind_total(last) == 123456


async def test_count_instructions_load_reads_streams_to_the_end_and_fails_loudly() -> None:
    from router.bench.common import procs

    tool = _count_instructions()
    async with procs.bench_upstream() as upstream:
        await tool.relay_streams(upstream.url, 5, 2, 3)  # raises on any unfinished stream
        with pytest.raises(Exception, match="stream failed"):
            await tool.relay_streams(upstream.url.replace("/v1", "/nowhere"), 1, 1, 3)


def test_openclaw_example_sends_the_header_that_selects_its_policy() -> None:
    """OpenClaw's user agent is the OpenAI JS SDK's: only the header names it."""
    import re

    example = (ROOT / "examples" / "openclaw.json5").read_text()
    header = re.search(r'headers:\s*\{\s*"X-Speclane-Client":\s*"([^"]+)"\s*\}', example)
    assert header is not None
    policies = load_policies(ROOT / "policies", presets=load_settings().presets.keys())
    assert policies.identify(None, header.group(1), "OpenAI/JS 5.23.2").client == "openclaw"
    assert policies.identify(None, None, "OpenAI/JS 5.23.2").client == "default"


def test_opta_example_names_the_header_its_policy_matches() -> None:
    text = (ROOT / "examples" / "opta-cli.md").read_text()
    assert "X-Speclane-Client: opta-cli" in text
    policies = load_policies(ROOT / "policies", presets=load_settings().presets.keys())
    assert policies.identify(None, "opta-cli", "OpenAI/JS 4.0").client == "opta-cli"


def _serve_flags_parse(args: list[str]) -> None:
    from router.cli.serve import parse_args

    assert args[0] == "serve", args
    parse_args(args[1:])  # exits (failing the test) on an unknown flag


def test_systemd_user_unit() -> None:
    import configparser
    import shlex

    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(ROOT / "examples" / "systemd" / "speclane.service")
    service = unit["Service"]
    command = shlex.split(service["ExecStart"])
    assert command[0].endswith("/speclane")
    _serve_flags_parse(command[1:])
    assert "--config" in command
    assert service["KillMode"] == "mixed"
    assert float(service["TimeoutStopSec"]) > load_settings().shutdown_grace
    assert unit["Install"]["WantedBy"] == "default.target"  # a user unit


def test_launchd_agent() -> None:
    import plistlib

    with (ROOT / "examples" / "launchd" / "dev.speclane.plist").open("rb") as f:
        agent = plistlib.load(f)
    assert agent["Label"] == "dev.speclane"
    command = agent["ProgramArguments"]
    assert command[0].endswith("/speclane")
    _serve_flags_parse(command[1:])
    assert agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["ExitTimeOut"] > load_settings().shutdown_grace


# Scripts with a main guard (importing one runs nothing; openai_sdk.py talks to a router).
SCRIPTS = sorted(
    p for p in (ROOT / "examples").rglob("*.py") if '__name__ == "__main__"' in p.read_text()
)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_scripts_import(script: Path) -> None:
    """Every example script's imports resolve (a module that moved leaves none behind)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"example_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(script.parent))  # scripts import their siblings (benchconfig)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(script.parent))
