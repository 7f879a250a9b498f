"""``speclane status``: the lanes, backends and speculation state of a running router, as a table.

Reads ``GET {url}/admin/lanes`` (see ``router.admin``). Exit code 0 when the router answered,
1 when it could not be reached or refused the admin key, each with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any, TextIO
from urllib.parse import urlsplit

ADMIN_KEY_ENV = "SPECLANE_ADMIN_KEY"
DEFAULT_URL = "http://127.0.0.1:8080"

COLUMNS = (
    "NAME",
    "KIND",
    "LANE",
    "STATE",
    "INFL",
    "MODEL",
    "DRAFT",
    "MODE",
    "REQ",
    "ACTIVE",
    "OBSERVED",
    "REASON",
)


class StatusError(Exception):
    """The one line printed when the router cannot tell us its status."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="speclane status", description="Print lanes, backends and speculation state."
    )
    p.add_argument("--url", default=DEFAULT_URL, help=f"router root URL (default {DEFAULT_URL})")
    p.add_argument(
        "--admin-key",
        default=None,
        help=f"admin key (default: ${ADMIN_KEY_ENV}); needed when admin_key is set",
    )
    p.add_argument("--json", action="store_true", help="print the raw JSON instead of a table")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    key = args.admin_key or os.environ.get(ADMIN_KEY_ENV) or None
    try:
        data = fetch_lanes(args.url, key, args.timeout)
    except StatusError as e:
        print(f"speclane status: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print_table(data.get("backends") or [], sys.stdout)
        print_layout(data.get("layout"), data.get("workers") or [], sys.stdout)
        if isinstance(data.get("models"), list):
            print_models(data["models"], sys.stdout)
    return 0


def fetch_lanes(url: str, admin_key: str | None, timeout: float) -> dict[str, Any]:
    endpoint = url.rstrip("/").removesuffix("/v1") + "/admin/lanes"
    if urlsplit(endpoint).scheme not in ("http", "https"):
        raise StatusError(f"--url must start with http:// or https:// (got {url})")
    request = urllib.request.Request(endpoint, headers={"Accept": "application/json"})
    if admin_key:
        request.add_header("Authorization", f"Bearer {admin_key}")
    try:
        with _opener(endpoint).open(request, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as e:
        raise StatusError(_http_error(e, endpoint, admin_key)) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise StatusError(f"cannot reach the router at {url}: {reason}") from None
    try:
        data = json.loads(body)
    except ValueError:
        raise StatusError(f"{endpoint} did not answer JSON: is this a speclane router?") from None
    if not isinstance(data, dict) or not isinstance(data.get("backends"), list):
        raise StatusError(f"{endpoint} answered without a 'backends' list")
    return data


def _opener(endpoint: str) -> urllib.request.OpenerDirector:
    # A proxy from the environment must not intercept a router on this machine.
    host = urlsplit(endpoint).hostname or ""
    if host in ("localhost", "::1") or host.startswith("127."):
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


def _http_error(e: urllib.error.HTTPError, endpoint: str, admin_key: str | None) -> str:
    message = _error_message(e)
    if e.code == 401:
        return (
            f"the router requires an admin key ({message}): pass --admin-key or set {ADMIN_KEY_ENV}"
        )
    if e.code == 403:
        if admin_key:
            return f"the router refused the admin key ({message})"
        return f"the router refused access ({message})"
    if e.code == 404:
        return f"{endpoint} not found (404): is this a speclane router?"
    return f"{endpoint} answered HTTP {e.code}: {message}"


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read() or b"{}")
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError, OSError):
        return e.reason if isinstance(e.reason, str) else f"HTTP {e.code}"


# --- the table -------------------------------------------------------------------------------


def rows(backends: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for b in backends:
        spec = b.get("speculation") or {}
        out.append(
            (
                _text(b.get("name")),
                _text(b.get("kind")),
                _text(b.get("lane")),
                _text(b.get("state")),
                _text(b.get("inflight")),
                _model(b),
                _short(b.get("draft")),
                _text(spec.get("mode")),
                _flag(spec.get("requested")),
                _flag(spec.get("active")),
                _flag(spec.get("observed")),
                _text(spec.get("reason")),
            )
        )
    return out


def print_table(backends: Sequence[dict[str, Any]], out: TextIO) -> None:
    if not backends:
        print("no lanes or backends", file=out)
        return
    table = [COLUMNS, *rows(backends)]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS) - 1)]
    for r in table:  # the reason, last, is not padded: it may be long
        print(
            "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip(),
            file=out,
        )
    errors = [(b.get("name"), b.get("last_error")) for b in backends if b.get("last_error")]
    if errors:
        print("\nlast errors:", file=out)
        for name, error in errors:
            print(f"  {name}: {error}", file=out)


def print_layout(layout: Any, workers: Sequence[dict[str, Any]], out: TextIO) -> None:
    """The lanes' layout, the estimate behind it, and each worker process's memory."""
    if isinstance(layout, dict):
        print(
            f"\nlanes layout: {layout.get('layout')} (requested {layout.get('requested')}: "
            f"{layout.get('reason')}); estimate {_gib(layout.get('estimate_bytes'))} of "
            f"{_gib(layout.get('limit_bytes'))} allowed (separate "
            f"{_gib(layout.get('separate_bytes'))}, shared {_gib(layout.get('shared_bytes'))}; "
            f"memory {_gib(layout.get('total_bytes'))})",
            file=out,
        )
    for w in workers:
        lanes = "+".join(str(lane) for lane in w.get("lanes") or [])
        print(
            f"  worker {lanes}: {_text(w.get('state'))}, pid {_text(w.get('pid'))}, "
            f"rss {_gib(w.get('rss_bytes'))}, pss {_gib(w.get('pss_bytes'))}",
            file=out,
        )
        group = w.get("group")
        if isinstance(group, dict):  # a lane over a group of ranks: memory per host
            hosts = group.get("host_memory_bytes") or {}
            memory = ", ".join(f"{h} {_gib(v)}" for h, v in hosts.items()) or "not reported yet"
            print(
                f"    group: {_text(group.get('ranks'))} ranks ({_text(group.get('backend'))}, "
                f"{_text(group.get('parallel'))}); memory per host: {memory}",
                file=out,
            )


def print_models(models: Sequence[dict[str, Any]], out: TextIO) -> None:
    """One line per servable model (a router that serves models on demand lists them)."""
    print("\nmodels:" if models else "\nmodels: none servable", file=out)
    lines = [model_line(m) for m in models]
    width = max((len(name) for name, _ in lines), default=0)
    for name, rest in lines:
        print(f"  {name.ljust(width)}  {rest}", file=out)


def model_line(m: dict[str, Any]) -> tuple[str, str]:
    """(the model's name, the rest of its line)."""
    state = _text(m.get("state"))
    parts = [state, f"size {_size(m.get('size_bytes'))}"]
    parts.append(f"estimate {_size(m.get('estimate_bytes'))}")
    if state in ("loaded", "loading"):
        lanes = "+".join(str(lane) for lane in m.get("lanes") or []) or "-"
        parts.append(f"{_text(m.get('layout'))} lanes {lanes}")
        parts.append(f"in flight {_text(m.get('in_flight'))}")
    if state == "loaded":
        parts.append(f"idle {_seconds(m.get('idle_seconds'))}")
    ttl = m.get("ttl")
    parts.append(
        "pinned" if m.get("pinned") else "ttl never" if ttl == 0 else f"ttl {_seconds(ttl)}"
    )
    if aliases := m.get("aliases"):
        parts.append("aliases " + ", ".join(str(a) for a in aliases))
    if m.get("last_error"):
        parts.append(f"last error: {m['last_error']}")
    return _text(m.get("name")), ", ".join(parts)


def _size(value: Any) -> str:
    if not isinstance(value, int) or isinstance(value, bool):
        return "-"
    return _gib(value) if value >= 1 << 30 else f"{value / (1 << 20):.0f} MiB"


def _seconds(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    return f"{value / 60:.1f} min" if value >= 120 else f"{value:.0f} s"


def _gib(value: Any) -> str:
    if not isinstance(value, int) or isinstance(value, bool):
        return "-"
    return f"{value / (1 << 30):.2f} GiB"


def _model(b: dict[str, Any]) -> str:
    if b.get("model"):
        return _short(b["model"])
    models = [str(m) for m in b.get("models") or []]
    if not models:
        return "-"
    return models[0] if len(models) == 1 else f"{models[0]} (+{len(models) - 1})"


def _text(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _short(value: Any) -> str:
    """A model or draft: a local path by its directory name (the paths are long and the name
    says which model it is), a repo id as is."""
    text = _text(value)
    return text.rstrip("/").rsplit("/", 1)[-1] if text.startswith(("/", "~")) else text


def _flag(value: Any) -> str:
    return "-" if value is None else ("yes" if value else "no")
