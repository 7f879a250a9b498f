"""The real client programs the client tests run, pinned, installed once and reused.

Each program is installed into its own folder of a cache directory (``$SPECLANE_TEST_CLIENTS``,
else ``~/.cache/speclane-test-clients``), named by its version, so a new pin installs beside the
old one and a fresh clone on the same machine reuses what an earlier run installed. npm packages
go in with ``npm install --prefix``; aider goes into a virtual environment of its own, because
its exact pins clash with speclane's.

Installs are bounded in time and serialised by a file lock (several test processes may ask for
the same program at once). A test skips only when the package registry cannot be reached: a
registry that answers "no such version" or an install that fails while the registry answers is
a failure, because the pin or the program is then broken, not the network.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

Registry = Literal["npm", "pypi"]

INSTALL_TIMEOUT = 420.0  # one program, seconds; aider's ~60 wheels are the slowest
PROBE_TIMEOUT = 45.0
# npm's error codes for "the registry did not answer" (vs E404, E403: it answered no).
UNREACHABLE_CODES = frozenset(
    {
        "ENOTFOUND",
        "EAI_AGAIN",
        "ECONNREFUSED",
        "ECONNRESET",
        "ETIMEDOUT",
        "ESOCKETTIMEDOUT",
        "ENETUNREACH",
        "EHOSTUNREACH",
        "ERR_SOCKET_TIMEOUT",
        "EPROTO",
        "ECONNABORTED",
        "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
        "SELF_SIGNED_CERT_IN_CHAIN",
        "CERT_HAS_EXPIRED",
    }
)


@dataclass(frozen=True)
class Program:
    command: str
    registry: Registry
    package: str
    version: str
    # the oldest and the newest-but-one Python minor the program installs on (aider pins <3.13)
    python: tuple[tuple[int, int], tuple[int, int]] = ((3, 10), (3, 12))

    @property
    def spec(self) -> str:
        return (
            f"{self.package}@{self.version}"
            if self.registry == "npm"
            else f"{self.package}=={self.version}"
        )


PROGRAMS: dict[str, Program] = {
    p.command: p
    for p in (
        Program("claude", "npm", "@anthropic-ai/claude-code", "2.1.332"),
        Program("codex", "npm", "@openai/codex", "0.169.0"),
        Program("qwen", "npm", "@qwen-code/qwen-code", "0.24.4"),
        Program("aider", "pypi", "aider-chat", "0.86.2"),
    )
}


class RegistryUnreachable(Exception):
    """The package registry did not answer: the only reason a client test may skip."""


class InstallFailed(Exception):
    """The registry answered but the pinned program could not be installed."""


def cache_root() -> Path:
    configured = os.environ.get("SPECLANE_TEST_CLIENTS")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "speclane-test-clients"


def home(program: Program, root: Path | None = None) -> Path:
    name = program.package.replace("@", "").replace("/", "-")
    return (root or cache_root()) / f"{name}-{program.version}"


def executable(program: Program, root: Path | None = None) -> Path:
    where = home(program, root)
    if program.registry == "npm":
        return where / "node_modules" / ".bin" / program.command
    return where / "venv" / "bin" / program.command


def installed(program: Program, root: Path | None = None) -> Path | None:
    exe = executable(program, root)
    done = home(program, root) / ".complete"
    return exe if done.exists() and exe.exists() else None


def require(command: str) -> Path:
    """The program's executable, installed if needed; skips the test if the registry is away."""
    program = PROGRAMS[command]
    try:
        return install(program)
    except RegistryUnreachable as exc:
        pytest.skip(
            f"{program.spec} is not installed and the {program.registry} registry "
            f"cannot be reached: {exc}"
        )


def install(
    program: Program,
    *,
    root: Path | None = None,
    registry_url: str | None = None,
    timeout: float = INSTALL_TIMEOUT,
) -> Path:
    """Install ``program`` unless a complete install is there; return its executable.

    ``registry_url`` points npm or pip elsewhere (the tests use a closed loopback port).
    """
    found = installed(program, root)
    if found:
        return found
    where = home(program, root)
    where.parent.mkdir(parents=True, exist_ok=True)
    with _locked(where.with_name(where.name + ".lock")):
        found = installed(program, root)  # another process may have finished meanwhile
        if found:
            return found
        probe(program, registry_url)
        shutil.rmtree(where, ignore_errors=True)  # a half install from an interrupted run
        where.mkdir()
        try:
            log = _install_into(program, where, registry_url, timeout)
        except subprocess.TimeoutExpired as exc:
            probe(program, registry_url)  # raises if the network went away meanwhile
            raise InstallFailed(f"installing {program.spec} took over {timeout:.0f} s") from exc
        exe = executable(program, root)
        if log.returncode != 0 or not exe.exists():
            probe(program, registry_url)
            raise InstallFailed(
                f"installing {program.spec} failed (exit {log.returncode}):\n{_tail(log)}"
            )
        (where / ".complete").write_text(program.spec + "\n")
        return exe


def probe(program: Program, registry_url: str | None = None) -> None:
    """Ask the registry for the pinned version: return if it has it, raise otherwise.

    RegistryUnreachable when it does not answer in time; InstallFailed when it answers no.
    """
    if program.registry == "npm":
        _probe_npm(program, registry_url)
    else:
        _probe_pypi(program, registry_url)


def _probe_npm(program: Program, registry_url: str | None) -> None:
    if shutil.which("npm") is None:
        raise RegistryUnreachable("npm is not installed (it comes with Node.js)")
    cmd = [
        "npm",
        "view",
        program.spec,
        "version",
        "--json",
        "--fetch-retries=0",
        "--fetch-timeout=20000",
    ]
    if registry_url:
        cmd.append(f"--registry={registry_url}")
    done = _run(cmd, PROBE_TIMEOUT, f"`npm view {program.spec}` got no answer")
    try:
        answer = json.loads(done.stdout or "null")
    except ValueError:
        answer = None
    if done.returncode == 0 and answer == program.version:
        return
    error = answer.get("error", {}) if isinstance(answer, dict) else {}
    code = str(error.get("code", ""))
    summary = error.get("summary") or _tail(done)
    if code in UNREACHABLE_CODES or code.startswith("EAI_"):
        raise RegistryUnreachable(f"{code}: {summary}")
    raise InstallFailed(f"the npm registry has no {program.spec}: {code} {summary}")


def _probe_pypi(program: Program, registry_url: str | None) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "index",
        "versions",
        program.package,
        "--timeout",
        "20",
        "--retries",
        "1",
        "--disable-pip-version-check",
    ]
    if registry_url:
        cmd += ["--index-url", registry_url]
    done = _run(cmd, PROBE_TIMEOUT, f"`pip index versions {program.package}` got no answer")
    if done.returncode != 0:
        # pip prints the same "No matching distribution" whether the index is away or lacks
        # the name; the name is a real, long-published package, so this is the network.
        raise RegistryUnreachable(f"`pip index versions {program.package}`: {_tail(done, 1)}")
    listed = next(
        (line for line in done.stdout.splitlines() if line.startswith("Available versions:")), ""
    )
    versions = {v.strip() for v in listed.partition(":")[2].split(",")}
    if program.version not in versions:
        raise InstallFailed(f"the package index has no {program.spec}")


def _install_into(
    program: Program, where: Path, registry_url: str | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    if program.registry == "npm":
        # --omit=dev and no audit/fund/lockfile: the lightest install; optional dependencies
        # stay, because Claude Code and Codex ship their native binary as one.
        cmd = [
            "npm",
            "install",
            "--prefix",
            str(where),
            "--no-audit",
            "--no-fund",
            "--omit=dev",
            "--no-save",
            "--no-package-lock",
            "--loglevel=error",
            "--fetch-retries=1",
            "--fetch-timeout=60000",
            program.spec,
        ]
        if registry_url:
            cmd.append(f"--registry={registry_url}")
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    python = _python_for(program)
    venv = where / "venv"
    made = subprocess.run(
        [python, "-m", "venv", str(venv)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if made.returncode != 0:
        return made
    cmd = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--timeout",
        "30",
        "--retries",
        "2",
        program.spec,
    ]
    if registry_url:
        cmd += ["--index-url", registry_url]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
    )


def _python_for(program: Program) -> str:
    low, high = program.python
    if low <= sys.version_info[:2] <= high:
        return sys.executable
    for minor in range(high[1], low[1] - 1, -1):
        found = shutil.which(f"python3.{minor}")
        if found:
            return found
    raise InstallFailed(
        f"{program.spec} needs Python {low[0]}.{low[1]} to {high[0]}.{high[1]}; none is on PATH"
    )


def _run(cmd: list[str], timeout: float, late: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RegistryUnreachable(f"{late} within {timeout:.0f} s") from exc


def _tail(done: subprocess.CompletedProcess[str], lines: int = 15) -> str:
    text = (done.stderr or "") + (done.stdout or "")
    kept = [line for line in text.splitlines() if "is ignored" not in line and line.strip()]
    return "\n".join(kept[-lines:])


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        # blocks while another process installs; its install is bounded by INSTALL_TIMEOUT
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
