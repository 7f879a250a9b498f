"""The ``speclane`` command itself: help for every flag, ``help COMMAND``, a closed pipe."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.cli.main import COMMANDS, main
from tests.conftest import fake_upstreams, router_settings, run_router

REPO = Path(__file__).resolve().parents[2]

# Subcommands whose main dispatches on a first word before building another parser.
NESTED = {
    "bench": [[], ["overhead"], ["agent"], ["lanes"], ["cold"]],
    "models": [[]],
    "policy": [[]],
}


class _Parsed(Exception):
    pass


def parsers_of(command: str, monkeypatch: pytest.MonkeyPatch) -> list[argparse.ArgumentParser]:
    """Every parser a subcommand builds, caught at parse time (without running it)."""
    found: list[argparse.ArgumentParser] = []

    def catch(self: argparse.ArgumentParser, *a: object, **kw: object) -> None:
        found.append(self)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    module, func = COMMANDS[command][0].split(":")
    entry = getattr(importlib.import_module(module), func)
    for prefix in NESTED.get(command, [[]]):
        try:
            entry(prefix)
        except _Parsed:
            pass
    monkeypatch.undo()
    assert found, command
    return found


def actions(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from actions(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_flag_has_help_without_rst_backticks(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for parser in parsers_of(command, monkeypatch):
        texts = [parser.description or "", parser.epilog or ""]
        for path, action in actions(parser, parser.prog):
            name = "/".join(action.option_strings) or action.dest
            assert (action.help or "").strip(), f"{path} {name} has no help text"
            texts.append(action.help or "")
        for text in texts:
            assert "`" not in text, f"{parser.prog}: backticks in --help: {text!r}"


def test_help_command_shows_the_commands_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["help", "serve"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: speclane serve")
    assert "--log-level" in out or "--config" in out
    assert main(["help"]) == 0
    assert "commands:" in capsys.readouterr().out


def _closed_pipe_run(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run speclane with its stdout a pipe whose reader has already gone (like `| head`
    after its lines): every write fails with EPIPE."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "router", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=REPO,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)


def test_help_into_a_closed_pipe_ends_quietly() -> None:
    done = _closed_pipe_run("help")
    assert done.returncode == 0
    assert b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr, done.stderr


async def test_status_into_a_closed_pipe_ends_quietly() -> None:
    import asyncio

    async with fake_upstreams("fake") as (fake,), run_router(router_settings(fake)) as r:
        done = await asyncio.to_thread(_closed_pipe_run, "status", "--url", r.url)
    assert done.returncode == 0
    assert b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr, done.stderr
