"""The local admin token: proof that a caller runs on this machine as the router's user.

``speclane serve`` makes a fresh random token at start, writes it to a file only its user
can read (``$XDG_RUNTIME_DIR/speclane/admin-<port>.token``, else
``~/.local/state/speclane/admin-<port>.token``; the directory 0700, the file 0600) and
removes it at exit. ``speclane policy reload`` reads it and sends it as
``Authorization: Bearer <token>``. It carries the admin key's authority: whoever can read
the file can already signal the router or edit its policies. A web page can neither read
the file nor add an ``Authorization`` header to a cross-site request (that needs a CORS
preflight, which speclane never grants), so a browser cannot use it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Mapping
from pathlib import Path


def token_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_absolute():
        return Path(runtime) / "speclane"
    state = env.get("XDG_STATE_HOME")
    base = Path(state) if state and Path(state).is_absolute() else Path.home() / ".local/state"
    return base / "speclane"


def token_path(port: int, environ: Mapping[str, str] | None = None) -> Path:
    return token_dir(environ) / f"admin-{port}.token"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def write_token(port: int, token: str) -> Path:
    """Write ``token`` for the router on ``port``, readable by this user only."""
    path = token_path(port)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(token + "\n")
    os.replace(tmp, path)  # a reader never sees half a token
    return path


def read_token(port: int) -> str | None:
    try:
        return token_path(port).read_text(encoding="ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def remove_token(path: Path, token: str) -> None:
    """Remove the file unless another router has since written its own token there."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if path.read_text(encoding="ascii").strip() == token:
            path.unlink()
