"""router.lanes.layout: the estimate, auto's choice and the guard's line, as pure arithmetic."""

from __future__ import annotations

import pytest

from router.lanes.layout import (
    AUTO_SHARE,
    GIB,
    PROCESS_BYTES,
    RESERVE_BYTES,
    Memory,
    Sizes,
    choose,
    estimate,
    refusal,
)

BOTH = frozenset({"speculative", "batching"})
MIB = 1 << 20
# The embedded default model as prepared here: 538 MB weights, a draft of the same size,
# the default 1 GiB prompt cache; a 24 GiB machine.
DEFAULT = Sizes(weights=538 * 10**6, draft=538 * 10**6, cache=GIB)
MACHINE = Memory(total=24 * GIB, available=20 * GIB)
# A 30B 4-bit coder with a 0.6B draft on a 32 GiB Mac.
BIG = Sizes(weights=17 * GIB, draft=600 * MIB, cache=GIB)
MAC = Memory(total=32 * GIB, available=28 * GIB)


def test_the_estimate_counts_one_copy_per_process_and_the_draft_once() -> None:
    s = Sizes(weights=1000, draft=100, cache=10)
    assert estimate(s, "shared", BOTH) == 1000 + 100 + 10 + PROCESS_BYTES
    assert estimate(s, "separate", BOTH) == 2 * (1000 + 10 + PROCESS_BYTES) + 100
    assert estimate(s, "separate", frozenset({"batching"})) == 1000 + 10 + PROCESS_BYTES
    assert estimate(s, "shared", frozenset({"speculative"})) == 1000 + 100 + 10 + PROCESS_BYTES


def test_auto_keeps_the_default_model_in_separate_processes() -> None:
    choice = choose("auto", DEFAULT, MACHINE, BOTH)
    assert choice.layout == "separate"
    assert choice.estimate_bytes == choice.separate_bytes < AUTO_SHARE * MACHINE.total
    assert choice.fits and refusal(choice, limit_configured=False) is None
    assert "under 25%" in choice.reason


def test_auto_shares_once_two_copies_take_a_quarter_of_the_memory() -> None:
    small = Memory(total=8 * GIB, available=7 * GIB)  # the same model on a smaller machine
    choice = choose("auto", DEFAULT, small, BOTH)
    assert choice.layout == "shared" and choice.estimate_bytes == choice.shared_bytes
    assert choice.shared_bytes < choice.separate_bytes
    big = choose("auto", BIG, MAC, BOTH)
    assert big.layout == "shared" and big.fits


def test_a_configured_layout_is_kept_and_one_lane_is_one_process() -> None:
    assert choose("shared", DEFAULT, MACHINE, BOTH).layout == "shared"
    assert choose("separate", BIG, MAC, BOTH).layout == "separate"
    one = choose("shared", DEFAULT, MACHINE, frozenset({"batching"}))
    assert one.layout == "separate" and one.separate_bytes == one.shared_bytes
    with pytest.raises(ValueError):
        choose("both", DEFAULT, MACHINE, BOTH)


def test_the_default_limit_is_the_available_memory_less_the_reserve() -> None:
    assert choose("auto", DEFAULT, MACHINE, BOTH).limit_bytes == MACHINE.available - RESERVE_BYTES
    assert choose("auto", DEFAULT, MACHINE, BOTH, limit=123).limit_bytes == 123


def test_the_guard_says_what_is_needed_what_may_be_used_and_what_to_change() -> None:
    choice = choose("separate", BIG, MAC, BOTH)  # two 17 GiB copies on a 32 GiB Mac
    assert not choice.fits
    line = refusal(choice, limit_configured=False)
    assert line is not None and "\n" not in line
    assert f"need about {choice.estimate_bytes / GIB:.2f} GiB" in line
    assert f"but {choice.limit_bytes / GIB:.2f} GiB may be used" in line
    assert "available 28.00 GiB less a 2.00 GiB reserve" in line
    assert 'layout = "shared"' in line and "prompt_cache_bytes" in line and "draft" in line
    shared = choose("shared", BIG, MAC, BOTH, limit=GIB)
    line = refusal(shared, limit_configured=True)
    assert line is not None and "lanes.memory_limit_bytes" in line
    assert 'layout = "shared"' not in line  # already shared: other changes only


def test_the_summary_names_the_choice_and_the_numbers() -> None:
    text = choose("auto", DEFAULT, MACHINE, BOTH).summary()
    assert text.startswith("lanes layout separate (requested auto")
    for part in ("estimate", "separate", "shared", "weights", "draft", "prompt cache", "limit"):
        assert part in text
    assert choose("auto", DEFAULT, MACHINE, BOTH).to_json()["fits"] is True
