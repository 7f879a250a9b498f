"""Prefix breaks the normalisation rules do not know: a lane that read fewer tokens from its
prompt cache than the conversation's previous request had put there (pure).

A request's fingerprints (``router.routing.affinity.fingerprints``) are hashes of its
cumulative message prefixes. ``PrefixWatch`` remembers, for a bounded number of requests,
the fingerprint of each one's whole message list with the prompt tokens it had and the
prompt cache that served it (a lane, or the one cache both lanes share in the shared
layout). A later request of the same partition whose messages start with such a list
(an agent's next turn, the next step of its tool loop) should find at least that prompt in
the same cache; when the lane reports fewer cached tokens (by more than ``SLACK``: a
template may render the end of a turn differently from the generation prompt that began
it), its prompt diverged from what the client sent before, or the cache lost it (an
eviction, a worker restart). Either way the client paid a prefill it should not have: it is
counted as a prefix break of reason ``cache_short``, with the message count that should
have been cached, so a program that rewrites its history is found.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

REASON = "cache_short"
SLACK = 16  # tokens a turn's end may render differently from its generation prompt
DEFAULT_ENTRIES = 4096


@dataclass(frozen=True, slots=True)
class Shortfall:
    """A request that found less in its cache than its conversation's previous request left."""

    messages: int  # its first this many messages were the previous request's whole list
    expected: int  # the prompt tokens of that previous request
    cached: int  # what the lane reported reading from its cache

    def describe(self) -> str:
        return (
            f"{REASON}: {self.cached} of {self.expected} tokens cached (messages[:"
            f"{self.messages}] were the previous request's prompt)"
        )


class PrefixWatch:
    """whole-list fingerprint -> (cache, prompt tokens, message count), a bounded LRU."""

    def __init__(self, max_entries: int = DEFAULT_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self._seen: OrderedDict[bytes, tuple[str, int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def served(
        self,
        prints: Sequence[bytes],
        messages: int,
        cache: str,
        prompt_tokens: int | None,
        cached: int | None,
    ) -> Shortfall | None:
        """A chat request with these fingerprints (shortest first, the last one its whole
        list of ``messages`` messages) was answered from ``cache``, its prompt
        ``prompt_tokens`` long with ``cached`` read from the cache: its shortfall against the
        longest earlier request it extends, if any; then it is remembered for the next."""
        if not prints:
            return None
        found = None
        for fp in reversed(prints):
            earlier = self._seen.get(fp)
            if earlier is not None and earlier[0] == cache:
                found = earlier
                break
        shortfall = None
        if found is not None and cached is not None:
            _, expected, extended = found
            if cached + SLACK < expected:
                shortfall = Shortfall(extended, expected, cached)
        if prompt_tokens is not None and prompt_tokens > 0:
            self._seen[prints[-1]] = (cache, prompt_tokens, messages)
            self._seen.move_to_end(prints[-1])
            while len(self._seen) > self.max_entries:
                self._seen.popitem(last=False)
        return shortfall
