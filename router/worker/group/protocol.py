"""The group's op log, as fixed-size int32 frames (pure: no MLX).

One message per operation rank 0 performs on the target's KV caches:

- ``NEW slot``: a fresh cache (a calibration pass's);
- ``FETCH slot tokens partition``: the prompt cache's nearest entry for ``tokens`` (every rank
  looks up its own mirror of the cache, then all agree on the cached length, or all start
  from a fresh cache);
- ``FORWARD slot offset tokens``: trim the cache back to ``offset`` positions (a rejected
  draft's), then one pass of the target over ``tokens``;
- ``STORE slot length checksum partition``: keep the cache's first ``length`` positions in the
  prompt cache; ``checksum`` of those tokens proves the ranks kept the same history;
- ``END``: the request is over, forget every slot; ``STOP``: leave;
- ``IDLE``: rank 0 has nothing to do; the others sleep a little before they wait for the next
  message (a rank waiting inside a collective spins a core);
- ``MEMORY``: every rank adds its resident memory (MiB) at its own index of one ``all_sum``,
  so rank 0 reports every host's memory.

A frame is ``FRAME`` int32 values: ``HEADER`` fields, then the message's data (tokens, then
the partition's UTF-8 bytes) inline when it fits (one collective per step of decoding), else
in a second array of exactly that length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

HEADER = 8
INLINE = 56  # a decoding step (1 + at most 32 draft tokens) and a partition name fit inline
FRAME = HEADER + INLINE
MAGIC = 0x5C1A0000  # every header's first value carries it: a stray all_sum is no op
MAX_TOKENS = 1 << 24  # a prompt longer than any context window
MAX_PARTITION_BYTES = 256
INT32_MAX = (1 << 31) - 1


class Op(IntEnum):
    NEW = 1
    FETCH = 2
    FORWARD = 3
    STORE = 4
    END = 5
    STOP = 6
    MEMORY = 7
    IDLE = 8


class ProtocolError(Exception):
    """A frame no leader sends: the ranks are out of step (the group must restart)."""


@dataclass(frozen=True)
class Message:
    op: Op
    slot: int = 0
    offset: int = 0  # FORWARD: the cache's length before the pass; STORE: the length kept
    tokens: tuple[int, ...] = ()
    partition: str = ""
    checksum: int = 0  # STORE: of the tokens kept


def checksum(tokens: Sequence[int]) -> int:
    """A cheap order-sensitive digest of a token history, within int32."""
    h = len(tokens) & 0x3FFFFFFF
    for t in tokens:
        h = (h * 31 + t + 1) % 1_000_000_007
    return h


def encode(message: Message) -> tuple[list[int], list[int]]:
    """(frame, payload): the payload is empty when the data fit inline."""
    data = list(message.tokens)
    if any(not 0 <= t <= INT32_MAX for t in data):
        raise ValueError("token ids must fit in int32")
    raw = message.partition.encode("utf-8")
    if len(raw) > MAX_PARTITION_BYTES or len(data) > MAX_TOKENS:
        raise ValueError("message too large")
    data += list(raw)
    header = [
        MAGIC | int(message.op),
        message.slot,
        message.offset,
        len(message.tokens),
        len(raw),
        message.checksum,
        0,
        0,
    ]
    if len(data) <= INLINE:
        return header + data + [0] * (INLINE - len(data)), []
    return header + [0] * INLINE, data


def payload_size(frame: Sequence[int]) -> int:
    """How many values the message's second array holds (0: none, the data were inline)."""
    n_tokens, n_bytes = _counts(frame)
    size = n_tokens + n_bytes
    return 0 if size <= INLINE else size


def decode(frame: Sequence[int], payload: Sequence[int] = ()) -> Message:
    """The message of a frame (and its payload); raises ProtocolError on anything else."""
    if len(frame) != FRAME:
        raise ProtocolError(f"a frame has {FRAME} values, not {len(frame)}")
    tag = frame[0]
    if tag & 0xFFFF0000 != MAGIC:
        raise ProtocolError(f"not a group frame: {tag:#x}")
    try:
        op = Op(tag & 0xFFFF)
    except ValueError:
        raise ProtocolError(f"unknown op {tag & 0xFFFF}") from None
    n_tokens, n_bytes = _counts(frame)
    size = n_tokens + n_bytes
    data = list(frame[HEADER : HEADER + size]) if size <= INLINE else list(payload)
    if len(data) != size:
        raise ProtocolError(f"expected {size} values of data, got {len(data)}")
    slot, offset = frame[1], frame[2]
    if slot < 0 or offset < 0:
        raise ProtocolError("negative slot or offset")
    try:
        partition = bytes(data[n_tokens:]).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("the partition is not UTF-8") from None
    return Message(op, slot, offset, tuple(data[:n_tokens]), partition, frame[5])


def _counts(frame: Sequence[int]) -> tuple[int, int]:
    n_tokens, n_bytes = frame[3], frame[4]
    if not 0 <= n_tokens <= MAX_TOKENS or not 0 <= n_bytes <= MAX_PARTITION_BYTES:
        raise ProtocolError(f"bad sizes: {n_tokens} tokens, {n_bytes} partition bytes")
    return n_tokens, n_bytes
