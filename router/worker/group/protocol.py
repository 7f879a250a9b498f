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

The batching lane's ops (``router.worker.group.batchlead`` on rank 0, ``batchmirror`` on the
others): every rank runs its own mlx-lm ``BatchGenerator`` and makes it the same calls, so
its batch caches (merged, extended, filtered, right-padded, trimmed per row) stay the same
as rank 0's; only rank 0 samples, and the others take its tokens:

- ``BATCH_RESET``: a fresh generator (uids from 0);
- ``BATCH_INSERT slot=uid offset=cached value=max_tokens tokens partition``: the prompt cache's
  nearest entry for the prompt (agreed on as ``FETCH``), then ``insert`` (``uid``: the one
  rank 0's generator gave);
- ``BATCH_NEXT value=prefill_step_size``: one ``BatchGenerator.next()``;
- ``BATCH_STEP``, inside it, before the decoding pass: each row's uid, pending token and
  draft (``step_data``); ``BATCH_SAMPLED``, after a verify pass: rank 0's samples at every
  position (``slot`` rows of ``offset`` values);
- ``BATCH_STORE slot=uid checksum``: a finished sequence's cache goes into the prompt cache;
- ``BATCH_REMOVE tokens=(uid, checksum)...  value=1 when the caches are kept``: sequences
  leave the batch (stop string, cancel), their caches kept in the prompt cache.

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
    BATCH_RESET = 9
    BATCH_INSERT = 10
    BATCH_NEXT = 11
    BATCH_STEP = 12
    BATCH_SAMPLED = 13
    BATCH_STORE = 14
    BATCH_REMOVE = 15


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
    value: int = 0  # BATCH_INSERT: max_tokens; BATCH_NEXT: prefill step; BATCH_REMOVE: kept


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
        message.value,
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
    return Message(op, slot, offset, tuple(data[:n_tokens]), partition, frame[5], frame[6])


def _counts(frame: Sequence[int]) -> tuple[int, int]:
    n_tokens, n_bytes = frame[3], frame[4]
    if not 0 <= n_tokens <= MAX_TOKENS or not 0 <= n_bytes <= MAX_PARTITION_BYTES:
        raise ProtocolError(f"bad sizes: {n_tokens} tokens, {n_bytes} partition bytes")
    return n_tokens, n_bytes


def step_data(
    uids: Sequence[int], pending: Sequence[int], drafts: Sequence[Sequence[int]]
) -> tuple[int, ...]:
    """A decoding step's rows as ``BATCH_STEP`` data: ``(uid, pending, len(draft))`` per
    row, then every row's draft."""
    if not len(uids) == len(pending) == len(drafts):
        raise ValueError("one pending token and one draft per row")
    head = [v for row in zip(uids, pending, (len(d) for d in drafts), strict=True) for v in row]
    return (*head, *(t for d in drafts for t in d))


def parse_step(message: Message) -> tuple[list[int], list[int], list[list[int]]]:
    """(uids, pending tokens, drafts) of a ``BATCH_STEP`` of ``message.slot`` rows."""
    rows, data = message.slot, message.tokens
    if message.op is not Op.BATCH_STEP or 3 * rows > len(data):
        raise ProtocolError(f"expected a batch step of {rows} rows, got {message.op.name}")
    uids = list(data[0 : 3 * rows : 3])
    pending = list(data[1 : 3 * rows : 3])
    lengths = list(data[2 : 3 * rows : 3])
    if 3 * rows + sum(lengths) != len(data):
        raise ProtocolError("a batch step's drafts do not add up")
    drafts, at = [], 3 * rows
    for n in lengths:
        drafts.append(list(data[at : at + n]))
        at += n
    return uids, pending, drafts


def parse_sampled(message: Message, rows: int, width: int) -> list[list[int]]:
    """Rank 0's samples of a verify pass: ``rows`` lists of ``width`` tokens."""
    if message.op is not Op.BATCH_SAMPLED or (message.slot, message.offset) != (rows, width):
        raise ProtocolError(
            f"expected {rows}x{width} samples, got {message.op.name} "
            f"{message.slot}x{message.offset}"
        )
    if len(message.tokens) != rows * width:
        raise ProtocolError("the samples do not fill their rows")
    data = message.tokens
    return [list(data[r * width : (r + 1) * width]) for r in range(rows)]


def pairs(message: Message) -> list[tuple[int, int]]:
    """``BATCH_REMOVE``'s (uid, checksum) pairs."""
    data = message.tokens
    if len(data) % 2:
        raise ProtocolError("a removal's uids and checksums do not pair up")
    return [(data[i], data[i + 1]) for i in range(0, len(data), 2)]
