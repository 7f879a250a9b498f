"""Cache-aware routing between the two lanes (pure): send a conversation back to the lane
whose prompt cache holds its prefix, unless load says otherwise.

An agent resends its long system prompt, its tools and the whole conversation every turn.
Each lane keeps a prompt cache (the KV state of earlier requests, reused for the longest
common token prefix), so the lane that served the previous turn starts the next one from
its cache, while the other lane would prefill everything again: minutes for a long prompt
on a small machine.

What a lane holds is approximated without asking it: a request's *fingerprints* are hashes
of its cumulative message prefixes (the tools and the first message, then the first two
messages, ...), and ``AffinityMap`` remembers, for a bounded number of fingerprints, the lane
that last served a request containing that prefix. The holder of a new request is the lane
of its longest known fingerprint. Fingerprints are seeded with the request's prompt-cache
partition, as the lanes' caches are partitioned: a request only ever finds its own
partition's prefixes, so the rule ``cache-affinity`` in a decision header never says that
another client sent the same conversation.

Load overrides affinity the way SGLang's cache-aware router does it: affinity is ignored
only when the load is imbalanced against the holder by more than an absolute AND a relative
threshold (``holder_wait - other_wait > abs_threshold`` and ``holder_wait > rel_threshold *
other_wait``), where a lane's *wait* is the number of requests that must finish before a new
one starts there (a lane below its capacity starts it at once). A small imbalance is worth
paying for a cache hit; a large one is not.

In the shared layout both lanes live in one worker process with one prompt cache
(``one_cache``): a prefix is found whichever lane serves the next turn, so affinity is off
and routing goes by load and speculation value alone; the decision's reason says
``cache=shared``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from router.config.routing import RoutingRules
from router.routing.load import lane_load, waiting
from router.routing.types import BackendView, Candidate

RULE = "cache-affinity"
MAX_FINGERPRINTED_MESSAGES = 256  # a longer conversation: its first 256 messages count
PROMPT_BLOCK_CHARS = 2048  # text completions: a fingerprint per block of the prompt
DEFAULT_ENTRIES = 8192


@dataclass(frozen=True, slots=True)
class AffinityThresholds:
    """When load overrides affinity (both must be exceeded); configured in ``[routing]``."""

    abs_threshold: int = 1
    rel_threshold: float = 1.5


def thresholds_of(rules: RoutingRules) -> AffinityThresholds:
    return AffinityThresholds(rules.affinity_abs_threshold, rules.affinity_rel_threshold)


def fingerprints(endpoint: str, data: Mapping[str, Any], partition: str = "") -> tuple[bytes, ...]:
    """Chained hashes of the request's cumulative prefixes, shortest first (may be empty),
    within ``partition`` (the same prefix in two partitions has unrelated fingerprints).

    Chat: one per message prefix, seeded with the tools (the chat template renders them
    before the messages). Text completions: one per ``PROMPT_BLOCK_CHARS`` of a string
    prompt. Anything else: none (no affinity). A ``prompt_cache_key`` adds one print, the
    shortest.
    """
    seed = hashlib.blake2b(digest_size=16)
    seed.update(orjson.dumps([partition, endpoint]))  # unambiguous: no two pairs encode alike
    if endpoint == "chat":
        messages = data.get("messages")
        if not isinstance(messages, list):
            return ()
        seed.update(_canonical(data.get("tools")))
        parts = [_canonical(m) for m in messages[:MAX_FINGERPRINTED_MESSAGES]]
    elif endpoint == "completions" and isinstance(data.get("prompt"), str):
        prompt: str = data["prompt"]
        parts = [
            prompt[i : i + PROMPT_BLOCK_CHARS].encode("utf-8", "surrogatepass")
            for i in range(0, len(prompt), PROMPT_BLOCK_CHARS)
        ]
        parts = parts[:MAX_FINGERPRINTED_MESSAGES]
    else:
        return ()
    out: list[bytes] = []
    key = data.get("prompt_cache_key")
    if isinstance(key, str) and key:
        # The client's cache hint (OpenAI's prompt_cache_key) as the shortest print: the
        # lane that last served the key holds at least its conversation's start, which
        # counts only when no longer prefix is known.
        hinted = seed.copy()
        hinted.update(b"\0prompt_cache_key\0" + key.encode("utf-8", "surrogatepass"))
        out.append(hinted.digest())
    chain = seed.digest()
    for part in parts:
        h = hashlib.blake2b(chain, digest_size=16)
        h.update(part)
        chain = h.digest()
        out.append(chain)
    return tuple(out)


def _canonical(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return repr(value).encode("utf-8", "surrogatepass")


class AffinityMap:
    """fingerprint -> the lane that last served a request with that prefix (bounded LRU)."""

    def __init__(self, max_entries: int = DEFAULT_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self._lanes: OrderedDict[bytes, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lanes)

    def holder(self, prints: Sequence[bytes]) -> str | None:
        """The lane of the longest known prefix, or None."""
        for fp in reversed(prints):
            lane = self._lanes.get(fp)
            if lane is not None:
                self._lanes.move_to_end(fp)
                return lane
        return None

    def record(self, prints: Sequence[bytes], lane: str) -> None:
        """``lane`` served a request with these prefixes: it holds them now (and the other
        lane's copy of them ages out of its cache, so the newest lane wins)."""
        for fp in prints:
            self._lanes[fp] = lane
            self._lanes.move_to_end(fp)
        while len(self._lanes) > self.max_entries:
            self._lanes.popitem(last=False)


def one_cache(lanes: Sequence[BackendView]) -> bool:
    """The lanes serving the model share one prompt cache (the shared layout: one worker
    process): whichever serves the next turn finds the prefix, so nothing is held."""
    views = [v for v in lanes if v.lane is not None]
    first = views[0].cache_domain if views else None
    return len(views) > 1 and first is not None and all(v.cache_domain == first for v in views)


def wait(view: BackendView) -> int:
    """Requests that must finish before a new one starts on this lane."""
    return waiting(lane_load(view), view.capacity or 1)


def imbalanced(holder_wait: int, other_wait: int, t: AffinityThresholds) -> bool:
    return holder_wait - other_wait > t.abs_threshold and holder_wait > t.rel_threshold * other_wait


def steer(
    candidates: tuple[Candidate, ...],
    rule: str,
    holder: str | None,
    lanes: Sequence[BackendView],
    thresholds: AffinityThresholds,
) -> tuple[tuple[Candidate, ...], str]:
    """Put the lane holding the prefix first (rule ``cache-affinity``) unless load says
    otherwise; ``candidates`` and ``rule`` unchanged when there is nothing to do.

    ``lanes``: the views of the lanes serving the model. Only a lane already among the
    candidates (usable, allowed for the request) can be chosen.
    """
    if holder is None or not candidates or candidates[0].lane == holder:
        return candidates, rule
    chosen = next((c for c in candidates if c.lane == holder), None)
    views: dict[str, BackendView] = {v.lane: v for v in lanes if v.lane is not None}
    first_view, holder_view = views.get(candidates[0].lane), views.get(holder)
    if chosen is None or first_view is None or holder_view is None:
        return candidates, rule  # the holder is down, or the first choice is external
    if imbalanced(wait(holder_view), wait(first_view), thresholds):
        return candidates, rule
    return (chosen, *(c for c in candidates if c is not chosen)), RULE
