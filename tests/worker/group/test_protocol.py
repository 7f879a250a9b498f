"""The op log's frames: what rank 0 encodes, followers decode, and frames no leader sends."""

from __future__ import annotations

from typing import Any

import pytest

from router.worker.group.protocol import (
    FRAME,
    HEADER,
    INLINE,
    MAGIC,
    MAX_PARTITION_BYTES,
    Message,
    Op,
    ProtocolError,
    checksum,
    decode,
    encode,
    pairs,
    parse_sampled,
    parse_step,
    payload_size,
    step_data,
)


@pytest.mark.parametrize(
    "message",
    [
        Message(Op.FORWARD, slot=3, offset=17, tokens=(5, 6, 7)),
        Message(Op.FETCH, slot=0, offset=2, tokens=tuple(range(40)), partition="client-a_1"),
        Message(Op.FETCH, slot=1, tokens=tuple(range(5000)), partition="p"),
        Message(Op.STORE, slot=2, offset=9, partition="é", checksum=checksum([1, 2, 3])),
        Message(Op.END),
        Message(Op.STOP),
        Message(Op.MEMORY),
    ],
)
def test_a_message_survives_its_frame(message: Message) -> None:
    frame, payload = encode(message)
    assert len(frame) == FRAME
    assert payload_size(frame) == len(payload)
    assert decode(frame, payload) == message


def test_a_decoding_step_fits_inline_and_a_prompt_does_not() -> None:
    step = Message(Op.FORWARD, 0, 100, tuple(range(33)), "partition-of-64-chars".ljust(20, "x"))
    assert encode(step)[1] == []
    prompt = Message(Op.FETCH, 0, 0, tuple(range(INLINE + 1)))
    assert len(encode(prompt)[1]) == INLINE + 1


def frame_of(message: Message) -> list[int]:
    return encode(message)[0]


def with_value(frame: list[int], index: int, value: int) -> list[int]:
    out = list(frame)
    out[index] = value
    return out


@pytest.mark.parametrize(
    ("frame", "payload", "says"),
    [
        ([0] * FRAME, [], "not a group frame"),  # an all_sum nobody fed
        (with_value(frame_of(Message(Op.END)), 0, MAGIC | 99), [], "unknown op"),
        (with_value(frame_of(Message(Op.END)), 3, -1), [], "bad sizes"),
        (with_value(frame_of(Message(Op.END)), 3, 1 << 30), [], "bad sizes"),
        (with_value(frame_of(Message(Op.END)), 4, MAX_PARTITION_BYTES + 1), [], "bad sizes"),
        (with_value(frame_of(Message(Op.END)), 1, -5), [], "negative"),
        (frame_of(Message(Op.FETCH, 0, 0, tuple(range(100)))), [1, 2], "expected 100"),
        ([MAGIC | 1] * (FRAME - 1), [], "a frame has"),
    ],
)
def test_frames_no_leader_sends_are_refused(
    frame: list[int], payload: list[int], says: str
) -> None:
    with pytest.raises(ProtocolError, match=says):
        decode(frame, payload)


def test_a_partition_that_is_not_utf8_is_refused() -> None:
    frame = frame_of(Message(Op.STORE, partition="ab"))
    frame[HEADER : HEADER + 2] = [0xFF, 0xFE]
    with pytest.raises(ProtocolError, match="UTF-8"):
        decode(frame)


def test_what_cannot_be_framed_is_refused_by_the_sender() -> None:
    with pytest.raises(ValueError, match="int32"):
        encode(Message(Op.FORWARD, tokens=(1 << 31,)))
    with pytest.raises(ValueError, match="too large"):
        encode(Message(Op.STORE, partition="x" * (MAX_PARTITION_BYTES + 1)))


def test_checksum_sees_order_and_length() -> None:
    assert checksum([1, 2, 3]) != checksum([3, 2, 1])
    assert checksum([0]) != checksum([0, 0])
    assert checksum([]) != checksum([0])


@pytest.mark.parametrize(
    "message",
    [
        Message(Op.BATCH_RESET),
        Message(Op.BATCH_INSERT, slot=5, offset=3, tokens=(1, 2, 3, 4), partition="p", value=64),
        Message(Op.BATCH_NEXT, value=512),
        Message(Op.BATCH_STEP, slot=2, tokens=step_data([0, 1], [7, 8], [[9, 10], []])),
        Message(Op.BATCH_SAMPLED, slot=2, offset=3, tokens=(1, 2, 3, 4, 5, 6)),
        Message(Op.BATCH_STORE, slot=4, checksum=checksum([1, 2])),
        Message(Op.BATCH_REMOVE, tokens=(3, checksum([5]), 4, 0), value=1),
    ],
)
def test_a_batch_message_survives_its_frame(message: Message) -> None:
    frame, payload = encode(message)
    assert decode(frame, payload) == message


def test_a_batch_steps_rows_and_drafts_come_back_as_sent() -> None:
    data = step_data([3, 4, 9], [11, 12, 13], [[1, 2], [], [5]])
    message = Message(Op.BATCH_STEP, slot=3, tokens=data)
    assert parse_step(message) == ([3, 4, 9], [11, 12, 13], [[1, 2], [], [5]])
    assert (
        encode(Message(Op.BATCH_STEP, slot=8, tokens=step_data(*[[0] * 8] * 2, [[]] * 8)))[1] == []
    )  # a plain step of a batch of 8 fits inline: one collective
    sampled = Message(Op.BATCH_SAMPLED, slot=2, offset=2, tokens=(1, 2, 3, 4))
    assert parse_sampled(sampled, 2, 2) == [[1, 2], [3, 4]]
    assert pairs(Message(Op.BATCH_REMOVE, tokens=(1, 10, 2, 20))) == [(1, 10), (2, 20)]


@pytest.mark.parametrize(
    ("parse", "says"),
    [
        (lambda: parse_step(Message(Op.BATCH_STEP, slot=2, tokens=(0, 1, 0))), "batch step"),
        (lambda: parse_step(Message(Op.BATCH_STEP, slot=1, tokens=(0, 1, 2, 5))), "add up"),
        (lambda: parse_step(Message(Op.BATCH_NEXT, value=1)), "batch step"),
        (lambda: parse_sampled(Message(Op.BATCH_SAMPLED, 2, 3, (1,) * 6), 2, 2), "2x2"),
        (lambda: parse_sampled(Message(Op.BATCH_SAMPLED, 1, 2, (1,)), 1, 2), "fill"),
        (lambda: parse_sampled(Message(Op.BATCH_STEP, 1, 1, (1,)), 1, 1), "samples"),
        (lambda: pairs(Message(Op.BATCH_REMOVE, tokens=(1, 2, 3))), "pair up"),
    ],
)
def test_batch_data_no_leader_sends_is_refused(parse: Any, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        parse()
