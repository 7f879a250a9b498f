"""The cross-request draft index (``suffix``): partitions, recency, the byte bound."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from router.worker.drafting.suffix import SuffixConfig, SuffixDraft, SuffixIndex, entry_cost


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def text(tokens: list[int]) -> str:
    return "".join(chr(t) for t in tokens)


SMALL = SuffixConfig(ngrams=(2, 3, 4), max_draft=8, spec_factor=4)
ANSWERED = "Q: rename foo to bar\nA: def bar(x): return x + 1\n"


def test_a_repeated_prompt_drafts_the_earlier_answer() -> None:
    index = SuffixIndex(SMALL)
    index.insert("alice", ids(ANSWERED))
    draft = SuffixDraft(index, "alice")
    assert text(draft.propose(ids("Q: rename foo to bar\nA:"), 8)) == " def bar"
    assert draft.from_index == 1


def test_another_partition_gets_no_draft_from_it() -> None:
    index = SuffixIndex(SMALL)
    index.insert("alice", ids(ANSWERED))
    assert index.match("bob", ids("Q: rename foo to bar\nA:"), 8) == (0, [])
    assert index.match("", ids("Q: rename foo to bar\nA:"), 8) == (0, [])
    draft = SuffixDraft(index, "bob")
    assert draft.propose(ids("Q: rename foo to bar\nA:"), 8) == []
    assert draft.from_index == 0


def test_the_latest_occurrence_and_the_longest_match_win() -> None:
    index = SuffixIndex(SMALL)
    index.insert("p", ids("xyAB1"))
    index.insert("p", ids("zzAB2"))
    assert index.match("p", ids("qAB"), 4) == (2, ids("2"))  # the most recent entry
    assert index.match("p", ids("yAB"), 4) == (3, ids("1"))  # a longer n-gram first


def test_the_own_context_wins_a_tie_and_loses_to_a_longer_earlier_match() -> None:
    index = SuffixIndex(SMALL)
    index.insert("p", ids("abcdEF"))
    own_first = SuffixDraft(index, "p")
    assert text(own_first.propose(ids("cdXYcd"), 4)) == "XYcd"  # both match "cd"; own wins
    longer = SuffixDraft(index, "p")
    assert text(longer.propose(ids("bcXYbcd"), 4)) == "EF"  # "bcd" only earlier


def test_a_proposal_is_capped_by_k_and_max_draft() -> None:
    index = SuffixIndex(SuffixConfig(ngrams=(2,), max_draft=3, spec_factor=4))
    index.insert("p", ids("ab0123456789"))
    draft = SuffixDraft(index, "p")
    assert text(draft.propose(ids("xab"), 10)) == "012"
    assert text(draft.propose(ids("xab"), 2)) == "01"
    assert draft.propose(ids("xab"), 0) == []


def test_a_short_match_drafts_short_and_a_long_one_far() -> None:
    index = SuffixIndex(SuffixConfig(ngrams=(2, 3, 4, 12), max_draft=16))
    index.insert("p", ids("the quick fox jumps over the lazy dog"))
    draft = SuffixDraft(index, "p")
    assert text(draft.propose(ids("zz fox"), 16)) == " jum"  # " fox" matched: 4 tokens
    assert text(draft.propose(ids("zzazy"), 16)) == " do"  # "azy": 3 tokens
    assert text(draft.propose(ids("the quick fox"), 16)) == " jumps over "  # 12 tokens


def test_eviction_is_least_recently_used_and_forgets_the_entry() -> None:
    cost = entry_cost(6, 3)
    index = SuffixIndex(SuffixConfig(ngrams=(2, 3, 4), max_bytes=2 * cost))
    index.insert("p", ids("abcdef"))
    index.insert("p", ids("ghijkl"))
    assert index.match("p", ids("ab"), 2)[1] == ids("cd")  # used: now the most recent
    index.insert("q", ids("mnopqr"))  # evicts "ghijkl", the least recently used
    assert len(index) == 2 and index.evicted == 1
    assert index.match("p", ids("gh"), 2) == (0, [])
    assert index.match("p", ids("ab"), 2)[1] == ids("cd")
    assert index.match("q", ids("mn"), 2)[1] == ids("op")
    assert index.bytes <= 2 * cost


def test_a_flooding_partition_evicts_its_own_entries() -> None:
    cost = entry_cost(6, 3)
    index = SuffixIndex(SuffixConfig(ngrams=(2, 3, 4), max_bytes=6 * cost))
    index.insert("alice", ids("abcdef"))  # alice's small working set, the oldest entries
    index.insert("alice", ids("ghijkl"))
    for i in range(20):  # bob floods the lane
        index.insert("bob", [1000 + i * 6 + j for j in range(6)])
    assert index.match("alice", ids("ab"), 2)[1] == ids("cd")
    assert index.match("alice", ids("gh"), 2)[1] == ids("ij")
    assert index.partition_bytes("alice") == 2 * cost
    assert index.partition_bytes("bob") == 4 * cost
    assert index.evicted == 16 and index.bytes == 6 * cost
    assert index.match("bob", [1114, 1115], 2)[1] == [1116, 1117]  # bob's latest stay
    assert index.match("bob", [1000, 1001], 2) == (0, [])  # his oldest went


def test_a_flood_pushes_others_down_to_its_own_size_at_most() -> None:
    cost = entry_cost(6, 3)
    index = SuffixIndex(SuffixConfig(ngrams=(2, 3, 4), max_bytes=4 * cost))
    for i in range(4):
        index.insert("alice", [i * 6 + j for j in range(6)])
    for i in range(10):
        index.insert("bob", [1000 + i * 6 + j for j in range(6)])
    assert index.partition_bytes("alice") == index.partition_bytes("bob") == 2 * cost
    assert index.match("alice", [18, 19], 2)[1] == [20, 21]  # alice keeps her latest
    assert index.match("alice", [0, 1], 2) == (0, [])


def test_a_tie_evicts_the_least_recently_used_entry_overall() -> None:
    cost = entry_cost(6, 3)
    index = SuffixIndex(SuffixConfig(ngrams=(2, 3, 4), max_bytes=3 * cost))
    index.insert("alice", ids("abcdef"))
    index.insert("bob", ids("ghijkl"))
    index.insert("carol", ids("mnopqr"))
    index.match("alice", ids("ab"), 2)  # alice's entry used: bob's is now the oldest
    index.insert("dave", ids("stuvwx"))  # all tied at one entry
    assert index.match("bob", ids("gh"), 2) == (0, [])
    assert index.partitions() == 3 and index.partition_bytes("bob") == 0
    for partition, prefix in (("alice", "ab"), ("carol", "mn"), ("dave", "st")):
        assert index.match(partition, ids(prefix), 2)[0] == 2


def test_within_a_partition_the_least_recently_used_goes_first() -> None:
    cost = entry_cost(6, 3)
    index = SuffixIndex(SuffixConfig(ngrams=(2, 3, 4), max_bytes=3 * cost))
    index.insert("alice", ids("abcdef"))
    index.insert("bob", ids("ghijkl"))  # the oldest overall, but bob holds less
    index.insert("alice", ids("mnopqr"))
    index.match("alice", ids("ab"), 2)  # alice's first entry is now her most recent
    index.insert("alice", ids("stuvwx"))
    assert index.match("alice", ids("mn"), 2) == (0, [])  # her least recently used went
    assert index.match("alice", ids("ab"), 2)[0] == 2
    assert index.match("bob", ids("gh"), 2)[0] == 2


def test_the_report_counts_partitions() -> None:
    cost = entry_cost(6, 3)
    index = SuffixIndex(SuffixConfig(ngrams=(2, 3, 4), max_bytes=4 * cost))
    index.insert("alice", ids("abcdef"))
    index.insert("bob", ids("ghijkl"))
    index.insert("bob", ids("mnopqr"))
    assert index.report() == {
        "entries": 3,
        "bytes": 3 * cost,
        "max_bytes": 4 * cost,
        "evicted": 0,
        "partitions": 2,
        "largest_partition_bytes": 2 * cost,
    }


def test_a_too_large_entry_keeps_its_tail_and_nothing_is_kept_at_zero_bytes() -> None:
    index = SuffixIndex(SuffixConfig(ngrams=(2,), max_entry_tokens=4))
    index.insert("p", ids("abcdefgh"))
    assert index.match("p", ids("ab"), 2) == (0, [])  # before the tail
    assert index.match("p", ids("ef"), 2)[1] == ids("gh")
    empty = SuffixIndex(SuffixConfig(max_bytes=0))
    empty.insert("p", ids("abcdefgh"))
    assert len(empty) == 0 and empty.bytes == 0


def test_the_byte_bound_holds_under_many_inserts() -> None:
    bound = 1 << 20
    config = SuffixConfig(max_bytes=bound, max_entry_tokens=1024)
    rng = random.Random(7)
    tracemalloc.start()
    try:
        index = SuffixIndex(config)
        base, _ = tracemalloc.get_traced_memory()
        for i in range(60):
            tokens = [rng.randrange(1000, 150_000) for _ in range(rng.randrange(2, 1024))]
            index.insert(f"client{i % 7}", tokens)
            assert index.bytes <= bound
            parts = [index.partition_bytes(f"client{c}") for c in range(7)]
            assert sum(parts) == index.bytes and index.report()["entries"] == len(index)
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert index.evicted > 0
    # The accounting is conservative: what the index really holds stays under its bound.
    assert used - base <= bound
    assert index.partitions() <= 7


def test_evicting_everything_leaves_no_table_behind() -> None:
    cost = entry_cost(4, 1)
    index = SuffixIndex(SuffixConfig(ngrams=(2,), max_bytes=cost))
    for i in range(50):
        index.insert(f"c{i}", [i, i + 1, i + 2, i + 3])
    assert len(index) == 1 and index.partitions() == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"ngrams": ()},
        {"ngrams": (0, 2)},
        {"max_draft": 0},
        {"spec_factor": 0},
        {"max_bytes": -1},
        {"max_entry_tokens": 1},
    ],
)
def test_config_is_checked(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SuffixConfig(**bad)  # type: ignore[arg-type]
