"""Log-probabilities of the emitted tokens, for a request that asks (``logprobs``).

Each entry is the target model's own distribution at the position the token was emitted
from: the logits of the pass that sampled it (on a verify pass, the verified position's,
never a draft's), after the request's logits processors and grammar mask (what it was
sampled from), before temperature, as OpenAI and mlx-lm report them. A request that does not
ask pays nothing: nothing here runs, and a greedy pass still samples from its raw logits
(``router.worker.decoding.sampling``).

``Aligner`` keeps the entries in step with the text actually sent: stop strings hold text
back (``router.worker.decoding.stops``), so an entry goes out with the chunk that completes its
text, and what a stop string cut is not reported; the entries' texts join to the answer's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

# JSON has no -inf: a token the grammar or a bias ruled out is reported at OpenAI's floor.
FLOOR = -9999.0

Picked = tuple[float, list[tuple[int, float]]]  # (the token's logprob, top (id, logprob))


@dataclass(frozen=True)
class TokenLogprob:
    token: str  # the text this token put in the answer (its share of the content)
    logprob: float
    top: tuple[tuple[str, float], ...] = ()  # the most likely tokens there, most likely first


def pick(scores: Any, tokens: list[int], k: int) -> list[Picked]:
    """Row ``i``'s log-probability of ``tokens[i]`` and its ``k`` most likely tokens, from
    ``scores`` (rows of logits, or of log-probabilities: normalized again, a no-op)."""
    import mlx.core as mx

    rows = scores.astype(mx.float32)
    lp = rows - mx.logsumexp(rows, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(lp, mx.array(tokens, mx.uint32)[:, None], axis=-1)[:, 0]
    chosen_values = cast("list[float]", chosen.tolist())
    if not k:
        return [(_finite(c), []) for c in chosen_values]
    k = min(k, lp.shape[-1])
    ids = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k]
    top_ids = cast("list[list[int]]", ids.tolist())
    top_values = cast("list[list[float]]", mx.take_along_axis(lp, ids, axis=-1).tolist())
    out: list[Picked] = []
    for c, row_ids, row_values in zip(chosen_values, top_ids, top_values, strict=True):
        top = sorted(zip(row_ids, row_values, strict=True), key=lambda t: -t[1])
        out.append((_finite(c), [(i, _finite(v)) for i, v in top]))
    return out


def _finite(value: float) -> float:
    return max(float(value), FLOOR)


class Aligner:
    """One answer's entries, released as its text is sent. ``decode``: a token id's text
    (the alternatives')."""

    def __init__(self, decode: Callable[[int], str]) -> None:
        self._decode = decode
        self._entries: deque[list[Any]] = deque()  # [start, text, logprob, top], in order
        self._got = 0  # characters the tokens have given so far
        self._sent = 0  # characters sent so far

    def token(self, text: str, picked: Picked) -> None:
        """A token emitted with its detokenized ``text`` (possibly empty: a character split
        over tokens comes out with the one that completes it)."""
        logprob, top = picked
        named = tuple((self._decode(i), lp) for i, lp in top)
        self._entries.append([self._got, text, logprob, named])
        self._got += len(text)

    def more(self, text: str) -> None:
        """Text no token of its own brought (the detokenizer's flush at the end): the last
        token's."""
        if self._entries:
            self._entries[-1][1] += text
        self._got += len(text)

    def sent(self, chars: int) -> tuple[TokenLogprob, ...]:
        """``chars`` more characters went out: the entries whose text is now all sent (the
        last one waits while its text is empty: the flush may still add to it)."""
        self._sent += chars
        out = []
        while self._entries:
            start, text, _, _ = self._entries[0]
            if start + len(text) > self._sent or (not text and len(self._entries) == 1):
                break
            out.append(_made(self._entries.popleft()))
        return tuple(out)

    def end(self, stopped: bool) -> tuple[TokenLogprob, ...]:
        """The answer ended: the entries left, a token the stop string cut in two reported
        with the part of its text that was sent, the stop string's own tokens not at all."""
        out = []
        for start, text, logprob, top in self._entries:
            if stopped and start >= self._sent:
                break
            out.append(_made([start, text[: max(0, self._sent - start)], logprob, top]))
        self._entries.clear()
        return tuple(out)


def _made(entry: list[Any]) -> TokenLogprob:
    _, text, logprob, top = entry
    return TokenLogprob(text, logprob, top)
