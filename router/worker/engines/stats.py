"""Speculative-decoding statistics, counted from what mlx-lm's public API exposes.

``mlx_lm.stream_generate`` reports only a per-token ``from_draft`` flag. The rounds behind it
follow ``speculative_generate_step``: a round starting after ``t`` emitted tokens drafts
``min(max_tokens - t, K)`` tokens, verifies them in one target pass, emits the accepted prefix
(``from_draft=True``) and then one target token (``from_draft=False``) -- unless ``max_tokens``
is reached inside the accepted prefix, which ends the round and the generation. The generator
is lazy and computes a whole round before yielding its first token, so every round whose first
token was observed has drafted its full size, even if the consumer stops early (EOS, a stop
string, a cancel): those verified-but-unused drafts count as rejected (R = D - A).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SpecStats:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    num_draft_tokens: int = 0

    @property
    def rejected(self) -> int:
        return self.drafted - self.accepted


class SpecCounter:
    """Reconstructs rounds from the ``from_draft`` flags of one generation."""

    def __init__(self, num_draft_tokens: int, max_tokens: int) -> None:
        if num_draft_tokens < 0 or max_tokens < 1:
            raise ValueError("num_draft_tokens must be >= 0 and max_tokens >= 1")
        self.num_draft_tokens = num_draft_tokens
        self.max_tokens = max_tokens
        self.tokens = 0
        self._drafted = 0
        self._accepted = 0
        self._steps = 0
        self._in_round = False

    def observe(self, from_draft: bool) -> None:
        """Count one generated token (every token stream_generate yields, EOS included)."""
        if self.num_draft_tokens and not self._in_round:
            self._steps += 1
            self._drafted += min(self.max_tokens - self.tokens, self.num_draft_tokens)
            self._in_round = True
        self.tokens += 1
        if from_draft:
            if not self._in_round:
                raise ValueError("a draft token arrived without speculation")
            self._accepted += 1
        else:
            self._in_round = False  # the target's own token closes the round
        if self.tokens >= self.max_tokens:
            self._in_round = False

    def snapshot(self) -> SpecStats:
        if not self.num_draft_tokens:
            return SpecStats()
        return SpecStats(self._drafted, self._accepted, self._steps, self.num_draft_tokens)


def usage(
    prompt_tokens: int, completion_tokens: int, spec: SpecStats, cached_tokens: int = 0
) -> dict[str, object]:
    """The ``usage`` object of the worker contract.

    ``prompt_tokens_details.cached_tokens``: prompt tokens taken from the lane's prompt cache
    instead of being prefilled (OpenAI's field; included in ``prompt_tokens``). The draft
    counts are ``speclane_spec``'s: OpenAI's ``completion_tokens_details`` prediction counts
    belong to a request's ``prediction`` only, and the engines add them for such a request.
    """
    body: dict[str, object] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    body["speclane_spec"] = {
        "drafted": spec.drafted,
        "accepted": spec.accepted,
        "rejected": spec.rejected,
        "steps": spec.steps,
        "num_draft_tokens": spec.num_draft_tokens,
    }
    return body


_SUMMED = ("drafted", "accepted", "rejected", "steps", "forced", "plain_steps")


def merge_usage(usages: list[dict[str, object]]) -> dict[str, object]:
    """``n`` choices' usage as one answer's: the prompt once (the first choice's, which
    prefilled it), the completion tokens and every draft count summed."""
    first = usages[0]
    if len(usages) == 1:
        return first
    completion = sum(_int(u.get("completion_tokens")) for u in usages)
    body: dict[str, object] = {
        **first,
        "completion_tokens": completion,
        "total_tokens": _int(first.get("prompt_tokens")) + completion,
    }
    details = [u["completion_tokens_details"] for u in usages if "completion_tokens_details" in u]
    if details:
        body["completion_tokens_details"] = _summed(details)
    specs: list[dict[str, Any]] = [
        spec for u in usages if isinstance(spec := u.get("speclane_spec"), dict)
    ]
    if specs:
        spec = {**specs[0], **_summed(specs, _SUMMED)}
        sources: list[dict[str, Any]] = [
            s["sources"] for s in specs if isinstance(s.get("sources"), dict)
        ]
        if sources:
            names = dict.fromkeys(name for s in sources for name in s)
            spec["sources"] = {name: _summed([s.get(name) for s in sources]) for name in names}
        body["speclane_spec"] = spec
    return body


def _summed(dicts: list[Any], keys: tuple[str, ...] | None = None) -> dict[str, object]:
    """The integer fields of ``dicts`` summed (``keys``: only those; None: every one)."""
    found = [d for d in dicts if isinstance(d, dict)]
    names = keys if keys is not None else tuple(dict.fromkeys(k for d in found for k in d))
    out: dict[str, object] = {}
    for key in names:
        values = [d[key] for d in found if key in d]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            out[key] = sum(values)
    return out


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
