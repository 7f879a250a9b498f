"""Each lane's measured pace, and where a turn finishes first (pure).

Cache affinity alone keeps a conversation on the lane that holds its prefix. With several
agents at once that pins two of three agents to the batching lane while the speculative
lane, done with its own agent, idles: the makespan follows the busiest lane (issue #45,
``examples/results/session-agents.md``). So when a conversation's prefix is held by one lane
and the load rules chose the other, the router compares what the turn is expected to cost
on each, from what the lanes have shown:

- **decode**: seconds per output token on a lane, by the number of requests it decoded at
  once (its rows, averaged over each request's time there): a batch's rows share its
  passes, and the speculative lane's one row drafts;
- **first token**: seconds to the first token of a turn the lane held the prefix of
  (``held``), of one it did not hold while the other lane did (``moved``: with the disk
  tier, both lanes' workers share one directory, so a moved turn often loads its prefix
  from disk), and of a conversation's first turn (``cold``); ``moved`` and ``cold`` per
  prompt character, as their prefill grows with the prompt. Until a move was measured,
  a held turn's figure prices it (optimistic: the first move finds out);
- **output tokens**: the answers' recent length, at most the request's ``max_tokens``.

A turn goes to the other lane when its expected finish there is earlier by more than
``routing.pace_margin`` (a fraction of the holder's), so a near tie keeps the cache.
Figures are exponentially weighted moving averages (``ALPHA``): recent behaviour counts
most, as the load changes. A lane without figures yet is placed by affinity alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from router.routing.load import waiting

Start = Literal["held", "moved", "cold"]

RULE = "faster-lane"  # the decision's rule when a turn leaves the lane holding its prefix

ALPHA = 0.3  # weight of a new observation in every moving average
MAX_ROWS = 8  # rows counted apart up to this many; more share the last figure
MIN_TOKENS = 8  # an answer this short says little about a lane's decode pace
DEFAULT_OUTPUT = 256  # output tokens expected before any answer was seen


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else old + ALPHA * (new - old)


def rows_key(rows: float) -> int:
    """The bucket of an average number of rows (1 .. MAX_ROWS)."""
    return max(1, min(MAX_ROWS, round(rows)))


@dataclass(frozen=True, slots=True)
class LanePace:
    """One lane's figures (None: not measured yet)."""

    per_token: Mapping[int, float] = field(default_factory=dict)  # rows -> s per token
    held_s: float | None = None
    moved_s_per_char: float | None = None
    cold_s_per_char: float | None = None

    def decode(self, rows: int) -> float | None:
        """Seconds per output token at ``rows`` rows: measured there, else the nearest
        measured bucket scaled as a batch's row shares its passes (x rows / measured rows:
        an upper bound, as a wider pass costs less than that many narrow ones)."""
        rows = rows_key(rows)
        if (exact := self.per_token.get(rows)) is not None:
            return exact
        if not self.per_token:
            return None
        nearest = min(self.per_token, key=lambda r: (abs(r - rows), r))
        return self.per_token[nearest] * rows / nearest

    def first_token(self, start: Start, prompt_chars: int) -> float | None:
        """Seconds to the first token of a turn that starts as ``start`` says. A move not
        yet measured is priced as a held turn: the lanes' workers share the disk tier, so
        a moved turn may load its prefix rather than prefill it; the first move measures
        what it really cost (a full prefill without the disk tier) and that figure prices
        the next."""
        if start == "held" or (start == "moved" and self.moved_s_per_char is None):
            return self.held_s
        per_char = self.moved_s_per_char if start == "moved" else self.cold_s_per_char
        return None if per_char is None else per_char * prompt_chars


@dataclass(frozen=True, slots=True)
class Paces:
    """Every lane's pace and the answers' typical length: a value routing reads."""

    lanes: Mapping[str, LanePace] = field(default_factory=dict)
    output_tokens: float | None = None

    def expected_output(self, max_tokens: int | None) -> float:
        typical = DEFAULT_OUTPUT if self.output_tokens is None else self.output_tokens
        return typical if max_tokens is None else min(float(max_tokens), typical)


@dataclass(frozen=True, slots=True)
class Turn:
    """What placing one turn needs to know of it."""

    prompt_chars: int
    output_tokens: float


def expected_seconds(
    pace: LanePace, start: Start, rows: int, wait: int, turn: Turn
) -> float | None:
    """A turn's expected time on a lane that would decode it among ``rows`` rows, after
    ``wait`` requests ahead of it there (each, on average, half way through a turn of the
    same length); None when a figure is missing."""
    first = pace.first_token(start, turn.prompt_chars)
    decode = pace.decode(rows)
    if first is None or decode is None:
        return None
    return first + turn.output_tokens * decode * (1 + wait / 2)


class PaceBook:
    """The figures as they are measured (the router's state; ``snapshot`` for routing)."""

    def __init__(self) -> None:
        self._per_token: dict[tuple[str, int], float] = {}
        self._start: dict[tuple[str, Start], float] = {}
        self._output: float | None = None
        self._snapshot: Paces | None = Paces()

    def decoded(self, lane: str, rows: float, tokens: int, seconds: float) -> None:
        """A request on ``lane`` decoded ``tokens`` tokens after its first in ``seconds``,
        among ``rows`` rows on average."""
        if tokens < MIN_TOKENS or seconds <= 0 or rows <= 0:
            return
        key = (lane, rows_key(rows))
        self._per_token[key] = _ewma(self._per_token.get(key), seconds / tokens)
        self._output = _ewma(self._output, float(tokens))
        self._snapshot = None

    def started(self, lane: str, start: Start, seconds: float, prompt_chars: int) -> None:
        """A request's first token came ``seconds`` after it arrived."""
        if seconds < 0:
            return
        if start == "held":
            value = seconds
        elif prompt_chars > 0:
            value = seconds / prompt_chars
        else:
            return
        key = (lane, start)
        self._start[key] = _ewma(self._start.get(key), value)
        self._snapshot = None

    def snapshot(self) -> Paces:
        """The figures now, as a value (rebuilt only after a new observation)."""
        if self._snapshot is None:
            names = {lane for lane, _ in self._per_token} | {lane for lane, _ in self._start}
            lanes = {
                name: LanePace(
                    per_token={r: v for (n, r), v in self._per_token.items() if n == name},
                    held_s=self._start.get((name, "held")),
                    moved_s_per_char=self._start.get((name, "moved")),
                    cold_s_per_char=self._start.get((name, "cold")),
                )
                for name in names
            }
            self._snapshot = Paces(lanes, self._output)
        return self._snapshot


@dataclass(frozen=True, slots=True)
class LaneLoad:
    """A lane as placement sees it: its name, requests on it and how many it decodes at once."""

    lane: str
    load: int
    capacity: int

    @property
    def rows(self) -> int:
        return max(1, min(self.load + 1, self.capacity))

    @property
    def wait(self) -> int:
        return waiting(self.load, self.capacity)


@dataclass(frozen=True, slots=True)
class Placed:
    """Both lanes' expected seconds for a turn, and whether it goes to the other lane."""

    holder_s: float
    other_s: float
    moves: bool

    def label(self) -> str:
        return f"held={self.holder_s:.1f}s,other={self.other_s:.1f}s"


def compare(
    holder: LaneLoad, other: LaneLoad, paces: Paces, turn: Turn, margin: float
) -> Placed | None:
    """The turn on the lane holding its prefix against the other lane (which would load it
    from the disk tier or prefill it): None while a figure is missing."""
    held_pace, other_pace = paces.lanes.get(holder.lane), paces.lanes.get(other.lane)
    if held_pace is None or other_pace is None:
        return None
    held = expected_seconds(held_pace, "held", holder.rows, holder.wait, turn)
    moved = expected_seconds(other_pace, "moved", other.rows, other.wait, turn)
    if held is None or moved is None:
        return None
    return Placed(held, moved, moved < held * (1 - margin))
