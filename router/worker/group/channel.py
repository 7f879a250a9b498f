"""Messages between the ranks: ``all_sum`` of int32 arrays to which only the sender
contributes (every other rank adds zeros), as ``mlx_lm.server`` shares its requests.

Collectives pair up in the order the ranks call them, so every rank must make the same
calls in the same order: each message is one frame (and one payload when it did not fit
inline), and an agreement is one more ``all_sum`` of one value per rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

from router.worker.group.protocol import FRAME, Message, decode, encode, payload_size


class Channel(Protocol):
    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def all_sum(self, values: Sequence[int]) -> list[int]:
        """The element-wise sum of every rank's ``values`` (the same length on each)."""
        ...


class MxChannel:
    """The group of ``mx.distributed.init()``."""

    def __init__(self, group: Any = None) -> None:
        import mlx.core as mx

        self.group = group if group is not None else mx.distributed.init()

    @property
    def rank(self) -> int:
        return int(self.group.rank())

    @property
    def size(self) -> int:
        return int(self.group.size())

    def all_sum(self, values: Sequence[int]) -> list[int]:
        import mlx.core as mx

        out = mx.distributed.all_sum(mx.array(list(values), mx.int32), group=self.group)
        mx.eval(out)
        # A 1-D int32 array: its tolist() is a list of ints (the stub types every rank).
        return cast("list[int]", out.tolist())


def send(channel: Channel, message: Message) -> None:
    """Rank 0: hand ``message`` to every other rank."""
    frame, payload = encode(message)
    channel.all_sum(frame)
    if payload:
        channel.all_sum(payload)


def receive(channel: Channel) -> Message:
    """Ranks > 0: the next message rank 0 sends (blocks until it does)."""
    frame = channel.all_sum([0] * FRAME)
    size = payload_size(frame)
    payload = channel.all_sum([0] * size) if size else []
    return decode(frame, payload)


def disagree(channel: Channel, differs: bool) -> bool:
    """Every rank: True on all of them when any one of them ``differs``."""
    return channel.all_sum([1 if differs else 0])[0] > 0


def gather_memory(channel: Channel, rss_mib: int) -> list[int]:
    """Every rank: each rank's ``rss_mib``, by rank."""
    values = [0] * channel.size
    values[channel.rank] = rss_mib
    return channel.all_sum(values)


def own_rss_mib() -> int:
    """This process's resident memory in MiB (Linux: now; elsewhere: its peak)."""
    import os
    import resource
    import sys

    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") >> 20
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak >> 20 if sys.platform == "darwin" else peak >> 10)
