"""The ``speclane`` command: each subcommand lives in its own module and parses its own flags."""

from __future__ import annotations

import importlib
import os
import sys

# subcommand -> (module:function taking argv, one-line help). Imported lazily so that
# `speclane policy check` does not pay for importing MLX.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("router.cli.serve:main", "run the router (and its two MLX lanes by default)"),
    "worker": ("router.cli.worker:main", "run one MLX lane worker (spawned by serve)"),
    "models": ("router.cli.models:main", "models prepare: fetch, convert the default model"),
    "policy": (
        "router.cli.policy:main",
        "policy check [DIR]: validate, print the table; policy reload: reload now",
    ),
    "bench": ("router.cli.bench:main", "the readiness scorecard; bench overhead | agent | lanes"),
    "status": ("router.cli.status:main", "print lanes, backends and speculation state"),
}


def usage() -> str:
    lines = ["usage: speclane COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "speclane COMMAND --help (or speclane help COMMAND) for a command's flags."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        code = dispatch(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # here, so that a closed pipe is reported here, not at exit
        return code
    except BrokenPipeError:
        # `speclane status | head -2`: the reader stopped reading, which is not an error.
        # Point stdout at /dev/null so that the interpreter's final flush stays quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def dispatch(args: list[str]) -> int:
    if args[:1] == ["help"] and len(args) > 1:
        args = [args[1], "--help", *args[2:]]  # `speclane help serve` = `speclane serve --help`
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] in ("-V", "--version"):
        from router import __version__

        print(f"speclane {__version__}")
        return 0
    entry = COMMANDS.get(args[0])
    if entry is None:
        print(f"speclane: unknown command '{args[0]}'\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, func_name = entry[0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    try:
        return int(func(args[1:]) or 0)
    except SystemExit as e:  # argparse's --help and usage errors
        if isinstance(e.code, int) or e.code is None:
            return int(e.code or 0)
        raise
