"""What a lane is told of a request's prompt-cache partition: an opaque token.

The partition's name (``client:<policy>`` or ``group:<cache_group>``,
``router.config.policies``) becomes a keyed hash under a key drawn when the router starts,
so the lanes never see policy names, and the token means nothing outside this process (the
lanes are its children: they start with it and their caches die with them). It travels in
``CACHE_PARTITION_HEADER`` to speclane's own lanes only (``router.proxy.relay``); external
backends never get it.

With the prompt cache's disk tier on, the key is kept in a file of the tier's directory
(``keep_key_in``: ``partition.key``, 0600 in the 0700 directory), so that a client's token,
and with it the files the lanes wrote under it, is the same after a router restart; whoever
can read that file can read the cached prompts beside it anyway.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import secrets
from pathlib import Path

from router.kernel.worker_contract import CACHE_PARTITION_HEADER

__all__ = ["CACHE_PARTITION_HEADER", "keep_key_in", "wire_token"]

log = logging.getLogger("router.proxy")

KEY_FILE = "partition.key"
KEY_BYTES = 32
_KEY = secrets.token_bytes(KEY_BYTES)


def keep_key_in(directory: Path) -> bool:
    """Use the key kept in ``directory``'s ``KEY_FILE`` from now on, made there if missing;
    False (the key drawn at start stays, with a log line) when it can be neither read nor
    made."""
    global _KEY
    path = directory / KEY_FILE
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            key = path.read_bytes()
            if len(key) == KEY_BYTES:
                _KEY = key
                wire_token.cache_clear()
                return True
        key = secrets.token_bytes(KEY_BYTES)
        tmp = directory / f".{KEY_FILE}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # two routers starting at once: one key wins, both read it
        _KEY = path.read_bytes()
    except OSError as e:
        log.warning("prompt-cache partitions: cannot keep the key in %s (%s)", path, e)
        return False
    wire_token.cache_clear()
    return True


@functools.lru_cache(maxsize=1024)  # a handful of partitions, asked for on every request
def wire_token(partition: str) -> str:
    """24 hex digits, matching ``CACHE_PARTITION_PATTERN``."""
    digest = hashlib.blake2b(partition.encode("utf-8", "surrogatepass"), key=_KEY, digest_size=12)
    return digest.hexdigest()
