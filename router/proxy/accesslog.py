"""The access log: one record per proxied request, logged and kept in a bounded ring.

Each finished request (answered, refused, failed or abandoned by its client) becomes an
``AccessRecord``: who asked (client), for what (model, endpoint, stream), where it went
(lane, backend, the routing decision and its reason), and how it ended (status, duration,
time to first token, output tokens, and for a failure the error code and message).

It is logged on the ``speclane.access`` logger: at INFO (shown at the default log level,
hidden by ``--log-level warning``) for answers below 500, at WARNING for 5xx, so that a 504
or any other 5xx always leaves a line naming the backend that was tried and why it failed.
The last ``RECENT`` records stay in memory for the status page's "recent decisions".
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from router.observability.escape import escape_controls
from router.proxy.outcome import Outcome

log = logging.getLogger("speclane.access")

RECENT = 200  # records kept for the status page; a few KB each at most
# A value is quoted when it has a space, a quote, "=", a backslash or a control character:
# then "key=value" pairs read back unambiguously and every value stays on its line.
_QUOTED = re.compile('[ "=\\\\\x00-\x1f\x7f-\x9f\u2028\u2029]')


@dataclass(frozen=True, slots=True)
class AccessRecord:
    at: float  # wall-clock time the request finished (seconds since the epoch)
    endpoint: str
    client: str
    model: str | None
    stream: bool
    lane: str | None  # the lane of the candidate that answered (or was tried)
    backend: str | None  # the backend that answered, else the last one tried
    decision: str | None  # the routing decision's reason (X-Speclane-Decision)
    status: int  # 499: the client went away
    duration_ms: float
    ttft_ms: float | None  # streams only
    tokens: int | None  # output tokens the backend reported
    attempts: int
    error: str | None  # "code: message" of a failure
    # The prompt-normalisation rules that fired ("a,b"): the prefix breakers it carried.
    normalised: str | None = None
    # Its lane read less from its prompt cache than the conversation's previous request
    # left there ("cache_short: ..."; router.routing.prefixwatch).
    prefix_break: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """The text form: ``key=value`` pairs; a value with a space, quote, ``=``, backslash
        or control character is quoted, and its control characters escaped (``\\n``)."""
        parts = []
        for key, value in self.to_json().items():
            if key == "at" or value is None:
                continue
            if isinstance(value, float):
                value = f"{value:.1f}"
            elif isinstance(value, bool):
                value = str(value).lower()
            text = str(value)
            if not text or _QUOTED.search(text):
                # Backslash and quote first: the control escapes add backslashes of their own.
                text = '"' + escape_controls(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'
            parts.append(f"{key}={text}")
        return " ".join(parts)


def record_of(
    outcome: Outcome,
    *,
    client: str,
    model: str | None,
    decision: str | None,
    now: float | None = None,
) -> AccessRecord:
    finished = outcome.finished_at or time.monotonic()
    backend = outcome.backend or outcome.tried
    candidate = outcome.candidate
    lane = candidate.lane if candidate is not None else (backend.lane if backend else None)
    status = 499 if outcome.client_gone else outcome.status or 0
    error = None
    if outcome.error is not None:
        error = f"{outcome.error.code or outcome.error.type}: {outcome.error.message}"
    ttft = outcome.ttft if outcome.stream else None
    return AccessRecord(
        at=time.time() if now is None else now,
        endpoint=outcome.endpoint,
        client=client,
        model=model,
        stream=outcome.stream,
        lane=lane,
        backend=backend.name if backend is not None else None,
        decision=decision,
        status=status,
        duration_ms=round((finished - outcome.arrival) * 1000, 3),
        ttft_ms=None if ttft is None else round(ttft * 1000, 3),
        tokens=outcome.reported_tokens(),
        attempts=outcome.attempts,
        error=error,
        normalised=",".join(outcome.normalised) or None,
        prefix_break=outcome.prefix_break,
    )


class AccessLog:
    def __init__(self, recent: int = RECENT) -> None:
        self.recent: deque[AccessRecord] = deque(maxlen=recent)

    def add(self, record: AccessRecord) -> None:
        self.recent.append(record)
        level = logging.WARNING if 500 <= record.status < 600 else logging.INFO
        if log.isEnabledFor(level):
            log.log(level, "%s", record.line(), extra={"fields": record.to_json()})
