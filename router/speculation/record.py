"""The normalized speculative-decoding record, and what a parser returns instead of one.

Every backend reports draft statistics differently (router/speculation/parsers.py, cumulative.py);
they all end up here as a ``SpecRecord`` that says which figures the server reported and
which were derived, or as ``NotReported`` (nothing to read, with why) or ``Malformed``
(something was there but could not be trusted, with a closed-vocabulary reason).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Scope = Literal["request", "cumulative"]
SpecKind = Literal["draft", "mtp", "predicted_output"]

# not_supported: the backend never reports draft statistics (mlx_lm.server, Ollama).
# no_draft: the response shows that no draft ran (LM Studio ``stats: {}``, zero counts).
# absent: the place the statistics would be is missing (option off upstream, or a chunk
#         that does not carry them); it cannot tell "off" from "no draft".
# declined: speclane's lane ran its per-step choice and no draft paid at any step (the
# drafter is running; it rightly drafted nothing).
NotReportedReason = Literal["not_supported", "no_draft", "absent", "declined"]
NOT_REPORTED_REASONS: tuple[NotReportedReason, ...] = (
    "not_supported",
    "no_draft",
    "absent",
    "declined",
)

# not_object: a section that must be a JSON object is something else.
# bad_type: a count is not an integer (or a non-finite number).
# negative: a count is below zero.
# inconsistent: counts contradict each other (accepted > drafted, a + r + i != total, ...).
# incomplete: one count of a pair is there, the other missing.
# parser_error: a parser bug (never expected; tests assert it does not happen).
MalformedReason = Literal[
    "not_object", "bad_type", "negative", "inconsistent", "incomplete", "parser_error"
]
MALFORMED_REASONS: tuple[MalformedReason, ...] = (
    "not_object",
    "bad_type",
    "negative",
    "inconsistent",
    "incomplete",
    "parser_error",
)

RECORD_FIELDS = (
    "drafted",
    "accepted",
    "rejected",
    "ignored",
    "steps",
    "acceptance_rate",
    "mean_accept_len",
    "per_position",
)


@dataclass(frozen=True, slots=True)
class SpecRecord:
    """Draft statistics of one response (scope request) or one scrape interval (cumulative).

    ``drafted = accepted + rejected + ignored`` always holds. ``steps`` (verification rounds)
    and the rates are None when neither reported nor derivable. ``per_position[i]`` is the
    number of accepted draft tokens at draft position i. ``reported`` names the fields the
    server sent; every other field with a value was derived.
    """

    source: str
    scope: Scope
    kind: SpecKind
    drafted: int
    accepted: int
    rejected: int
    ignored: int
    steps: int | None
    acceptance_rate: float | None
    mean_accept_len: float | None
    per_position: tuple[int, ...] = ()
    reported: frozenset[str] = frozenset()
    # speclane's lanes: draft_model, prompt_lookup, suffix, prediction, auto
    draft_source: str | None = None
    # speclane's lanes under ``auto``: (source, drafted, accepted) per source that drafted
    by_source: tuple[tuple[str, int, int], ...] = ()

    @property
    def derived(self) -> frozenset[str]:
        present = {f for f in RECORD_FIELDS if getattr(self, f) not in (None, ())}
        return frozenset(present - self.reported)


@dataclass(frozen=True, slots=True)
class NotReported:
    source: str
    reason: NotReportedReason


@dataclass(frozen=True, slots=True)
class Malformed:
    source: str
    reason: MalformedReason
    field: str | None = None  # the wire name of the offending field, for the debug log


SpecResult = SpecRecord | NotReported | Malformed


def unavailable_reason(result: SpecResult) -> str | None:
    """The ``reason`` label for ``speclane_spec_telemetry_unavailable_total``: None for a
    record, the NotReported reason, or ``malformed_<reason>`` (a closed set either way)."""
    if isinstance(result, NotReported):
        return result.reason
    if isinstance(result, Malformed):
        return f"malformed_{result.reason}"
    return None


@dataclass(frozen=True, slots=True)
class Observation:
    """How one response looked from the router: what a backend's own figures cannot say.

    ``solo`` is False when other requests shared the lane or backend while this one
    decoded; such a speed says more about the load than about speculation and is not used
    for the speed comparison.
    """

    output_tokens: int
    decode_seconds: float  # from the first output token to the last
    ttft_seconds: float | None = None
    solo: bool = True

    def decode_tps(self, min_tokens: int = 1) -> float | None:
        """Tokens per second after the first token, or None when too short to mean much."""
        after_first = self.output_tokens - 1
        if after_first < max(1, min_tokens):
            return None
        if not (math.isfinite(self.decode_seconds) and self.decode_seconds > 0):
            return None
        return after_first / self.decode_seconds


def build_record(
    source: str,
    scope: Scope,
    kind: SpecKind,
    *,
    drafted: int | None = None,
    accepted: int | None = None,
    rejected: int | None = None,
    ignored: int | None = None,
    steps: int | None = None,
    acceptance_rate: float | None = None,
    mean_accept_len: float | None = None,
    per_position: tuple[int, ...] = (),
    computed: Iterable[str] = (),
) -> SpecRecord | Malformed:
    """A record from whatever the server gave, deriving the rest.

    Arguments are already type-checked (non-negative ints, finite floats) or None when not
    sent. ``computed`` names arguments the parser worked out itself (so they are marked
    derived). rejected = drafted - accepted - ignored; acceptance = accepted / drafted;
    mean accepted length = 1 + accepted / steps. Reported rates outside their range are
    replaced by derived ones rather than failing the record.
    """
    given = {
        name
        for name, value in (
            ("drafted", drafted),
            ("accepted", accepted),
            ("rejected", rejected),
            ("ignored", ignored),
            ("steps", steps),
            ("acceptance_rate", acceptance_rate),
            ("mean_accept_len", mean_accept_len),
        )
        if value is not None
    }
    if per_position:
        given.add("per_position")
    reported = frozenset(given - set(computed))

    counts = _complete_counts(drafted, accepted, rejected, ignored)
    if isinstance(counts, str):
        return Malformed(source, "incomplete" if counts == "incomplete" else "inconsistent")
    d, a, r, i = counts
    if steps is not None and steps == 0 and d > 0:
        return Malformed(source, "inconsistent", "steps")

    rate_reported = acceptance_rate is not None and 0.0 <= acceptance_rate <= 1.0
    rate = acceptance_rate if rate_reported else (a / d if d else None)
    len_reported = mean_accept_len is not None and mean_accept_len >= 0.0
    mean_len = mean_accept_len if len_reported else (1.0 + a / steps if steps else None)
    if not rate_reported:
        reported -= {"acceptance_rate"}
    if not len_reported:
        reported -= {"mean_accept_len"}
    return SpecRecord(
        source=source,
        scope=scope,
        kind=kind,
        drafted=d,
        accepted=a,
        rejected=r,
        ignored=i,
        steps=steps,
        acceptance_rate=rate,
        mean_accept_len=mean_len,
        per_position=tuple(per_position),
        reported=reported,
    )


def _complete_counts(
    drafted: int | None, accepted: int | None, rejected: int | None, ignored: int | None
) -> tuple[int, int, int, int] | str:
    """(drafted, accepted, rejected, ignored) with the missing ones derived, or an error."""
    if drafted is None:
        if accepted is None or rejected is None:
            return "incomplete"
        drafted = accepted + rejected + (ignored or 0)
    if accepted is None:
        if rejected is None:
            return "incomplete"
        accepted = drafted - rejected - (ignored or 0)
    if ignored is None:
        ignored = 0
    if rejected is None:
        rejected = drafted - accepted - ignored
    if min(accepted, rejected, ignored) < 0 or accepted + rejected + ignored != drafted:
        return "inconsistent"
    return drafted, accepted, rejected, ignored
