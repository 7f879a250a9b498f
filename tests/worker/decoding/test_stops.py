from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from router.worker.decoding.stops import StopScanner


def run(pieces: list[str], stops: tuple[str, ...]) -> tuple[str, bool]:
    scanner = StopScanner(stops)
    out = "".join(scanner.feed(p) for p in pieces)
    return out + scanner.flush(), scanner.stopped


def test_no_stops_passes_text_through_unchanged() -> None:
    scanner = StopScanner(())
    assert scanner.feed("abc") == "abc"
    assert not scanner.stopped


def test_a_stop_split_across_pieces_truncates_before_it() -> None:
    scanner = StopScanner(("END",))
    assert scanner.feed("hello E") == "hello "  # "E" might start the stop string
    assert scanner.feed("N") == ""
    assert scanner.feed("D and more") == ""
    assert scanner.stopped
    assert scanner.flush() == ""


def test_held_text_is_released_when_it_is_not_a_stop() -> None:
    scanner = StopScanner(("END",))
    assert scanner.feed("hello EN") == "hello "
    assert scanner.feed("X") == "ENX"
    assert not scanner.stopped


def test_held_text_is_flushed_at_the_end() -> None:
    assert run(["ab", "E"], ("END",)) == ("abE", False)


def test_the_earliest_of_several_stops_wins() -> None:
    assert run(["one two three"], ("three", "two")) == ("one ", True)


def test_nothing_is_emitted_after_a_stop() -> None:
    scanner = StopScanner(("x",))
    scanner.feed("axb")
    assert scanner.feed("more") == ""


@given(
    text=st.text(alphabet="abcx", max_size=40),
    stop=st.text(alphabet="abcx", min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 40), max_size=8),
)
def test_streaming_equals_truncating_the_whole_text(text: str, stop: str, cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    out, stopped = run(pieces, (stop,))
    index = text.find(stop)
    assert stopped == (index >= 0)
    assert out == (text[:index] if index >= 0 else text)


def test_the_stop_string_that_matched_is_remembered() -> None:
    scanner = StopScanner(("zzz", "END", "N"))
    assert scanner.matched is None
    assert scanner.feed("hello E") == "hello "
    assert scanner.feed("ND") == ""  # "END" starts before "N": it is the one that matched
    assert scanner.matched == "END"
