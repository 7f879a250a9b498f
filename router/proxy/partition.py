"""What a lane is told of a request's prompt-cache partition: an opaque token.

The partition's name (``client:<policy>`` or ``group:<cache_group>``,
``router.config.policies``) becomes a keyed hash under a key drawn when the router starts,
so the lanes never see policy names, and the token means nothing outside this process (the
lanes are its children: they start with it and their caches die with them). It travels in
``CACHE_PARTITION_HEADER`` to speclane's own lanes only (``router.proxy.relay``); external
backends never get it.
"""

from __future__ import annotations

import functools
import hashlib
import secrets

from router.worker_contract import CACHE_PARTITION_HEADER

__all__ = ["CACHE_PARTITION_HEADER", "wire_token"]

_KEY = secrets.token_bytes(32)


@functools.lru_cache(maxsize=1024)  # a handful of partitions, asked for on every request
def wire_token(partition: str) -> str:
    """24 hex digits, matching ``CACHE_PARTITION_PATTERN``."""
    digest = hashlib.blake2b(partition.encode("utf-8", "surrogatepass"), key=_KEY, digest_size=12)
    return digest.hexdigest()
