"""``speclane policy reload``: ask a running router to reload its policies now.

The request carries the admin key (``--admin-key``, else ``$SPECLANE_ADMIN_KEY``), else the
router's local admin token (``router.proxy.localtoken``: a file only the router's user can
read), so that a change the router held because it widens access is applied. Exit status:
0 applied, 1 refused or failed (one line on stderr saying why).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from router.cli.status import ADMIN_KEY_ENV, _error_message, _opener
from router.proxy.localtoken import read_token, token_path


def run_reload(url: str, admin_key: str | None, timeout: float) -> int:
    endpoint = url.rstrip("/").removesuffix("/v1") + "/admin/reload"
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https"):
        print(
            f"speclane policy reload: --url must start with http:// or https:// (got {url})",
            file=sys.stderr,
        )
        return 1
    key = admin_key or os.environ.get(ADMIN_KEY_ENV) or None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if key is None and _is_local(parts.hostname or ""):
        key = read_token(port)
    # No body: with one, urllib would label it a form, which the router refuses (CSRF rule).
    request = urllib.request.Request(
        endpoint, method="POST", headers={"Accept": "application/json"}
    )
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with _opener(endpoint).open(request, timeout=timeout) as resp:
            body = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        print(f"speclane policy reload: {_refusal(e, key, port)}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        print(
            f"speclane policy reload: cannot reach the router at {url}: {reason}", file=sys.stderr
        )
        return 1
    clients = ", ".join(str(c) for c in body.get("clients") or [])
    print(f"policies reloaded: {clients}")
    return 0


def _is_local(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _refusal(e: urllib.error.HTTPError, key: str | None, port: int) -> str:
    message = _error_message(e)
    if e.code == 401:
        return (
            f"the router requires an admin key ({message}): pass --admin-key or set {ADMIN_KEY_ENV}"
        )
    if e.code == 403 and key is None:
        return (
            f"{message} (no admin key given and no local admin token at "
            f"{token_path(port)}: pass --admin-key or set {ADMIN_KEY_ENV})"
        )
    if e.code == 422:
        return f"the new policies are invalid; the router keeps the previous ones:\n{message}"
    return f"HTTP {e.code}: {message}"
