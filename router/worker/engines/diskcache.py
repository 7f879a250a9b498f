"""The prompt cache's disk tier: entries spill to files and are found again after a restart.

Every entry the lane stores in memory (``router.worker.engines.promptcache``) of the served
model is also written here, off the generation thread; a lookup that misses memory, or hits
only a shorter prefix, asks this tier for a longer one of the same partition and loads it
back (reading files is far cheaper than a prefill). So a worker restart, a crash, an unload
on TTL or an eviction from memory costs a read, not the prompt again; and in the separate
layout the other lane's worker, sharing the directory, finds what this one stored.

- Blocks, written incrementally: an entry is a chain of block files
  (``router.worker.engines.diskformat``), each named by the model, the partition and the
  token prefix up to its end. A store writes only the blocks its prefix does not have on
  disk yet: a conversation's next turn writes the turn's new positions, a new conversation
  of the same client only what follows its system prompt. A write is cut at its segment ends
  (the system prompt's end: a block of its own, which later conversations share) and every
  ``block_tokens`` positions (so a block's size, and what a partial match loads, stays
  bounded). Only plain ``KVCache`` layers are written (a model with other caches keeps
  memory only). Files are ``<hash>.safetensors`` in one directory (0700, files 0600).
- Atomic: each block is written to a temporary file, fsynced, renamed into place (and the
  directory fsynced), first blocks first. A crash leaves whole blocks, and a chain missing
  a later block is only shorter; a leftover temporary file is removed.
- Checked: at start every file's header is read (never its data) to rebuild the index; on
  load every block of the chain must name this model, this tokenizer and the requester's
  partition, the block before it and the position it ends at, its name must be the hash of
  the prefix the chain holds up to there, and its data must match its checksum. A block
  failing any of that is dropped with a log line and never loaded (the blocks after it
  go with it: they could never load). Files of another model (a model swap) stay, counted
  in the bound, never loaded for this one; files of an older format are removed.
- Bounded: ``max_bytes`` for all files in the directory; before a write, blocks are removed
  least recently used first (a load or an extension refreshes every block of the chain, so
  a chain's later blocks go before its first ones), whole-sequence blocks before system
  prompts', each with the blocks after it (a chain never loses a middle block); never the
  chain the write extends. A write that does not fit is not made. The writer's queue holds
  ``QUEUE_SIZE`` stores and ``MAX_QUEUED_BYTES`` of their new positions; a store that finds
  it full is dropped (counted), never waited for.
- Isolation: the index is searched under the requester's partition hash only, and a loaded
  block's metadata must name that partition: partition A never finds B's blocks on disk.

Thread-safe: the generation thread(s) look up and load, the writer thread writes and evicts;
one lock guards the index. The writer gets the stored entry's own arrays (evaluated, never
changed in place: the memory cache only copies them out) and slices and copies them on its
own thread, so a store costs the generation thread a hash of its tokens and nothing more
(MLX evaluates an array on the thread that made it: the writer makes its own).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router.worker.engines.diskformat import (
    FORMAT,
    OLD_FORMATS,
    SUFFIX,
    TMP_PREFIX,
    Block,
    Chain,
    Identity,
    checksum,
    common_prefix,
    entry_name,
    head_bytes,
    header_bytes,
    identity_of,
    pack,
    partition_hash,
    prefix_names,
    read_header,
    write_atomic,
)
from router.worker.engines.entrykinds import SEQUENCE, SYSTEM, USER

__all__ = ["SUFFIX", "TMP_PREFIX", "Chain", "DiskTier", "Identity", "identity_of", "read_header"]

log = logging.getLogger("speclane.worker")

QUEUE_SIZE = 4  # stores waiting for the writer; more are dropped
MAX_QUEUED_BYTES = 1 << 30  # their new positions' arrays, all together (held until written)
MAX_FILES = 4096  # files indexed; past this the least recently used are removed
STALE_TMP_SECONDS = 3600.0  # a temporary file this old was left by a crash
BLOCK_TOKENS = 256  # positions a block holds at most
KINDS = (SEQUENCE, USER, SYSTEM)


@dataclass
class DiskFigures:
    hits: int = 0  # loads that gave a lookup a longer prefix
    loaded_tokens: int = 0  # prompt tokens those loads held
    writes: int = 0  # block files written
    written_bytes: int = 0  # their bytes
    dropped: int = 0  # stores dropped: the writer was behind
    refused: int = 0  # files dropped on load or at indexing: corrupt, foreign, misnamed
    evicted: int = 0  # blocks removed for the bound


@dataclass(frozen=True)
class Write:
    owner: str
    partition: str
    tokens: bytes
    segments: tuple[tuple[int, str], ...]  # (end, kind): the write is cut there
    layers: list[tuple[Any, Any]]  # each layer's keys and values (evaluated, whole buffers)
    nbytes: int  # what the new positions' arrays hold (as queued)


@dataclass
class DiskTier:
    directory: Path
    max_bytes: int
    identity: Identity
    figures: DiskFigures = field(default_factory=DiskFigures)
    max_queued_bytes: int = MAX_QUEUED_BYTES
    block_tokens: int = BLOCK_TOKENS

    def __post_init__(self) -> None:
        if self.max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        if self.block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        self._lock = threading.Lock()
        self._index: dict[str, Block] = {}  # file name -> block (every model's)
        self._seen_mtime = -1
        self._queue: queue.Queue[Write | None] = queue.Queue(QUEUE_SIZE)
        self._queued_bytes = 0  # the arrays of the stores queued (guarded by the lock)
        self._writer: threading.Thread | None = None

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Make the directory (0700), rebuild the index from it, start the writer."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(self.directory, 0o700)
        self.refresh(force=True)
        self._writer = threading.Thread(target=self._write_loop, name="kv-writer", daemon=True)
        self._writer.start()

    def close(self, timeout: float = 5.0) -> None:
        """Let the writer finish what is queued, then stop it."""
        if self._writer is None:
            return
        self._queue.put(None)
        self._writer.join(timeout)
        self._writer = None

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the writer has written everything queued (tests, shutdown)."""
        done = self._queue.all_tasks_done
        with done:
            return done.wait_for(lambda: not self._queue.unfinished_tasks, timeout)

    # --- the index ----------------------------------------------------------------------------

    def refresh(self, force: bool = False) -> None:
        """Index files another process (the other lane's worker) wrote or removed since the
        last look; the directory's mtime says whether anything changed."""
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except OSError:
            return
        if mtime == self._seen_mtime and not force:
            return
        self._seen_mtime = mtime
        try:
            names = set(os.listdir(self.directory))
        except OSError:
            return
        now = time.time()
        for name in names:
            if name.startswith(TMP_PREFIX):
                self._remove_stale_tmp(self.directory / name, now)
        with self._lock:
            for gone in set(self._index) - names:
                del self._index[gone]
            known = set(self._index)
        for name in sorted(names - known):
            if name.endswith(SUFFIX) and not name.startswith(TMP_PREFIX):
                block = self._read_block(name)
                if block is not None:
                    with self._lock:
                        self._index[name] = block

    def _remove_stale_tmp(self, path: Path, now: float) -> None:
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > STALE_TMP_SECONDS:
                path.unlink()

    def _read_block(self, name: str) -> Block | None:
        path = self.directory / name
        try:
            stat = path.stat()
            meta, size = read_header(path)
            if meta["format"] in OLD_FORMATS:  # one whole entry per file: not read any more
                log.info("prompt cache on disk: %s removed (an earlier format)", name)
                path.unlink()
                return None
            if size != stat.st_size:
                raise ValueError(f"{stat.st_size} bytes where the header says {size}")
            tokens = base64.b64decode(meta["tokens"], validate=True)
            start, parent = int(meta["start"]), meta["parent"]
            if not tokens or start < 0 or (start == 0) != (parent == ""):
                raise ValueError("its place in a chain is not one")
            if not start and entry_name(meta["model"], meta["partition"], tokens) != name:
                raise ValueError("the name is not the hash of its contents")
            kind = meta["kind"] if meta.get("kind") in KINDS else SEQUENCE
            owner = meta["owner"]
            if meta["model"] == self.identity.model and (
                partition_hash(self.identity, owner) != meta["partition"]
            ):
                raise ValueError("its partition is not the one it names")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            self._refuse(name, f"unreadable ({e})")
            return None
        model, hashed = meta["model"], meta["partition"]
        return Block(
            name, model, hashed, owner, parent, start, tokens, stat.st_size, kind, stat.st_mtime
        )

    def _refuse(self, name: str, why: str) -> None:
        """Drop a file that must never be loaded, and say so; the blocks after it go too."""
        log.warning("prompt cache on disk: %s dropped: %s", name, why)
        self.figures.refused += 1
        with contextlib.suppress(OSError):
            (self.directory / name).unlink()
        with self._lock:
            self._index.pop(name, None)
            after = self._descendants([name])
        for block in after:
            self._unlink(block)

    def _descendants(self, names: Sequence[str]) -> list[Block]:
        """The blocks after ``names`` in their chains, nearest first (the lock held)."""
        children: dict[str, list[Block]] = {}
        for b in self._index.values():
            children.setdefault(b.parent, []).append(b)
        out, todo = [], list(names)
        while todo:
            for child in children.get(todo.pop(), ()):
                out.append(child)
                todo.append(child.name)
        return out

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for b in self._index.values())

    def blocks(self) -> list[Block]:
        """This model's blocks (every partition's)."""
        with self._lock:
            return [b for b in self._index.values() if b.model == self.identity.model]

    def entries(self) -> list[Chain]:
        """This model's whole chains: from a first block to a block no other follows."""
        with self._lock:
            own = {n: b for n, b in self._index.items() if b.model == self.identity.model}
        parents = {b.parent for b in own.values()}
        chains = (self._chain_of(own, b) for b in own.values() if b.name not in parents)
        return [c for c in chains if c is not None]

    @staticmethod
    def _chain_of(index: dict[str, Block], tip: Block) -> Chain | None:
        """The chain ending at ``tip`` (None: a block before it is missing or misplaced)."""
        out = [tip]
        while out[-1].parent:
            parent = index.get(out[-1].parent)
            if parent is None or parent.end != out[-1].start or len(out) > len(index):
                return None
            out.append(parent)
        return Chain(tuple(reversed(out)))

    # --- lookups (generation thread) -----------------------------------------------------------

    def _own(self, hashed: str) -> dict[str, Block]:
        with self._lock:
            return {
                n: b
                for n, b in self._index.items()
                if b.partition == hashed and b.model == self.identity.model
            }

    def _deepest(self, own: dict[str, Block], hashed: str, packed: bytes) -> Chain | None:
        """The longest whole chain of ``own`` that is a prefix of ``packed``."""
        n = len(packed) // 4
        names = prefix_names(
            self.identity.model, hashed, packed, (b.end for b in own.values() if b.end <= n)
        )
        for end in sorted(names, reverse=True):
            block = own.get(names[end])
            chain = self._chain_of(own, block) if block is not None else None
            if chain is not None:
                return chain
        return None

    def find(self, partition: str, tokens: list[int]) -> tuple[Chain, int] | None:
        """This partition's chain sharing the longest prefix with ``tokens``, and how many
        tokens it shares (None: no chain shares any): the longest whole chain that is a
        prefix of ``tokens``, and the one block after it that shares the most of the rest
        (of several, the smallest)."""
        self.refresh()
        hashed = partition_hash(self.identity, partition)
        packed = pack(tokens)
        own = self._own(hashed)
        if not own:
            return None
        chain = self._deepest(own, hashed, packed)
        base = chain.length if chain is not None else 0
        parent = chain.tip.name if chain is not None else ""
        best: tuple[Block, int] | None = None
        rest = packed[4 * base :]
        for block in own.values():
            if block.parent != parent or block.start != base:
                continue
            shared = common_prefix(block.tokens, rest)
            if shared and (
                best is None
                or shared > best[1]
                or (shared == best[1] and block.nbytes < best[0].nbytes)
            ):
                best = (block, shared)
        if best is not None:
            blocks = (*(chain.blocks if chain is not None else ()), best[0])
            return Chain(blocks), base + best[1]
        return (chain, base) if chain is not None else None

    def load(self, partition: str, chain: Chain) -> list[Any] | None:
        """The chain's KV state as ``KVCache`` layers, after every check of every block (None:
        refused, or a block gone meanwhile)."""
        import mlx.core as mx
        from mlx_lm.models.cache import KVCache

        hashed = partition_hash(self.identity, partition)
        names = prefix_names(
            self.identity.model,
            hashed,
            b"".join(b.tokens for b in chain.blocks),
            (b.end for b in chain.blocks),
        )
        layers: list[tuple[list[Any], list[Any]]] = []
        parent, start = "", 0
        for block in chain.blocks:
            arrays = self._load_block(block, hashed, parent, start, names[block.end])
            if arrays is None:
                return None
            count = len(arrays) // 2
            if layers and count != len(layers):
                self._refuse(block.name, "its layers are not its chain's")
                return None
            if not layers:
                layers = [([], []) for _ in range(count)]
            for i, (keys, values) in enumerate(layers):
                keys.append(arrays[f"k{i}"])
                values.append(arrays[f"v{i}"])
            parent, start = block.name, block.end
        cache = []
        for keys, values in layers:
            layer = KVCache()
            layer.keys = keys[0] if len(keys) == 1 else mx.concatenate(keys, axis=2)
            layer.values = values[0] if len(values) == 1 else mx.concatenate(values, axis=2)
            layer.offset = chain.length
            cache.append(layer)
        mx.eval([(c.keys, c.values) for c in cache])
        self._touch(chain)
        self.figures.hits += 1
        self.figures.loaded_tokens += chain.length
        return cache

    def _load_block(
        self, block: Block, hashed: str, parent: str, start: int, name: str
    ) -> dict[str, Any] | None:
        """One block's arrays, checked against the chain it is loaded in."""
        import mlx.core as mx

        path = self.directory / block.name
        try:
            meta, size = read_header(path)
            if size != path.stat().st_size:
                raise ValueError("cut short")
            if meta.get("format") != FORMAT:
                raise ValueError("not this format")
            if meta.get("model") != self.identity.model:
                raise ValueError("made by another model")
            if meta.get("tokenizer") != self.identity.tokenizer:
                raise ValueError("made with another tokenizer")
            if meta.get("partition") != hashed or block.partition != hashed:
                raise ValueError("another partition's block")
            if meta.get("parent") != parent or not int(meta["start"]) == start == block.start:
                raise ValueError("not the block after the one before it")
            if base64.b64decode(meta["tokens"], validate=True) != block.tokens:
                raise ValueError("its tokens changed")
            if block.name != name:
                raise ValueError("the name is not the hash of its prefix")
            arrays = mx.load(str(path))
            assert isinstance(arrays, dict)
            if checksum(arrays) != meta.get("checksum"):
                raise ValueError("the data does not match its checksum")
            layers = int(meta["layers"])
            length = len(block.tokens) // 4
            if len(arrays) != 2 * layers:
                raise ValueError("arrays beyond the layers")
            for i in range(layers):
                keys, values = arrays[f"k{i}"], arrays[f"v{i}"]
                if keys.ndim != 4 or keys.shape[2] != length or values.shape[2] != length:
                    raise ValueError("a layer's length is not the block's")
        except FileNotFoundError:
            with self._lock:
                self._index.pop(block.name, None)
            return None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            self._refuse(block.name, str(e))
            return None
        return arrays

    def _touch(self, chain: Chain) -> None:
        now = time.time()
        for block in chain.blocks:
            with contextlib.suppress(OSError):
                os.utime(self.directory / block.name, (now, now))
            block.used = now

    def recent(self, per_partition: int, kind: str = SYSTEM) -> list[Chain]:
        """This model's ``per_partition`` most recently used chains ending where ``kind``
        ends (no block of that kind follows) in each partition, most recent first."""
        ends = []
        for chain in self.entries():
            kinds = [b.kind for b in chain.blocks]
            if kind not in kinds:
                continue
            last = len(kinds) - 1 - kinds[::-1].index(kind)
            ends.append(Chain(chain.blocks[: last + 1]))
        unique = {c.tip.name: c for c in ends}.values()
        found = sorted(unique, key=lambda c: c.tip.used, reverse=True)
        taken: dict[str, int] = {}
        out = []
        for c in found:
            if taken.get(c.tip.partition, 0) < per_partition:
                taken[c.tip.partition] = taken.get(c.tip.partition, 0) + 1
                out.append(c)
        return out

    # --- writes -------------------------------------------------------------------------------

    def put(
        self,
        partition: str,
        tokens: list[int],
        cache: list[Any],
        segments: Sequence[tuple[int, str]] = (),
    ) -> bool:
        """Queue ``cache`` (the KV state of exactly ``tokens``) for writing, cut at each of
        ``segments`` (``(end, kind)``: the system prompt's end); False when not queued: the
        writer is behind (dropped), the layers are not plain ``KVCache``, or the whole
        prefix is on disk already."""
        from mlx_lm.models.cache import KVCache

        if not self.max_bytes or not tokens:
            return False
        if not all(type(c) is KVCache and c.keys is not None for c in cache):
            return False
        n = len(tokens)
        if any(c.offset < n for c in cache):
            return False
        packed = pack(tokens)
        hashed = partition_hash(self.identity, partition)
        chain = self._deepest(self._own(hashed), hashed, packed)
        have = chain.length if chain is not None else 0
        if have >= n:
            return False
        size = sum(head_bytes(c.keys, n - have) + head_bytes(c.values, n - have) for c in cache)
        with self._lock:
            behind = self._queue.full() or self._queued_bytes + size > self.max_queued_bytes
            if not behind:
                self._queued_bytes += size
        if behind:
            self.figures.dropped += 1
            return False
        # The stored entry's own arrays (evaluated, never changed in place): the writer
        # slices and copies them on its thread, the generation thread pays nothing.
        layers = [(c.keys, c.values) for c in cache]
        cuts = tuple(sorted((e, k) for e, k in segments if 0 < e < n and k in KINDS))
        try:
            self._queue.put_nowait(Write(partition, hashed, packed, cuts, layers, size))
        except queue.Full:  # the other lane's thread took the last place meanwhile
            with self._lock:
                self._queued_bytes -= size
            self.figures.dropped += 1
            return False
        return True

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(item)
            except Exception:
                log.exception("prompt cache on disk: a write failed")
            finally:
                self._queue.task_done()

    def _write(self, item: Write) -> None:
        try:
            self._write_blocks(item)
        finally:
            with self._lock:
                self._queued_bytes -= item.nbytes

    def _cuts(self, item: Write, start: int) -> list[tuple[int, str]]:
        """Where the blocks after ``start`` end, and each one's kind: at each segment end and
        at the end, and every ``block_tokens`` positions between them."""
        n, step = len(item.tokens) // 4, self.block_tokens
        required = sorted({n, *(e for e, _ in item.segments if e > start)})
        ends: list[int] = []
        for end in required:
            begin = ends[-1] if ends else start
            ends += [*range(begin + step, end, step), end]
        out = []
        for end in ends:
            kinds = [k for e, k in item.segments if e >= end]
            out.append((end, SYSTEM if SYSTEM in kinds else USER if kinds else SEQUENCE))
        return out

    def _write_blocks(self, item: Write) -> None:
        import mlx.core as mx

        self.refresh()
        chain = self._deepest(self._own(item.partition), item.partition, item.tokens)
        start = chain.length if chain is not None else 0
        cuts = self._cuts(item, start)
        if not cuts or start >= len(item.tokens) // 4:
            return
        keys0 = item.layers[0][0]
        size = sum(
            2 * len(item.layers) * head_bytes(keys0, end - begin)
            + header_bytes(len(item.layers), end - begin)
            for begin, (end, _) in zip([start, *(e for e, _ in cuts)], cuts, strict=False)
        )
        if size > self.max_bytes:
            return
        kept = chain.blocks if chain is not None else ()
        if not self._make_room(size, len(cuts), {b.name for b in kept}):
            return
        if chain is not None:
            self._touch(chain)
        names = prefix_names(self.identity.model, item.partition, item.tokens, (e for e, _ in cuts))
        parent = chain.tip.name if chain is not None else ""
        for end, kind in cuts:
            arrays: dict[str, Any] = {}
            for i, (keys, values) in enumerate(item.layers):
                arrays[f"k{i}"] = mx.contiguous(keys[..., start:end, :])
                arrays[f"v{i}"] = mx.contiguous(values[..., start:end, :])
            mx.eval(list(arrays.values()))
            tokens = item.tokens[4 * start : 4 * end]
            meta = {
                "format": FORMAT,
                "model": self.identity.model,
                "tokenizer": self.identity.tokenizer,
                "partition": item.partition,
                "owner": item.owner,
                "kind": kind,
                "tokens": base64.b64encode(tokens).decode("ascii"),
                "start": str(start),
                "parent": parent,
                "layers": str(len(item.layers)),
                "checksum": checksum(arrays),
            }
            name = names[end]
            written = write_atomic(self.directory, name, arrays, meta)
            block = Block(
                name,
                self.identity.model,
                item.partition,
                item.owner,
                parent,
                start,
                tokens,
                written,
                kind,
                time.time(),
            )
            with self._lock:
                self._index[name] = block
            self.figures.writes += 1
            self.figures.written_bytes += written
            parent, start = name, end

    def _make_room(self, size: int, files: int, kept: set[str]) -> bool:
        """Remove blocks until ``size`` more bytes and ``files`` more files fit, never one of
        ``kept`` (the chain being extended): blocks whose chain is broken first, then
        whole-sequence blocks, least recently used first, then system prompts', each with
        the blocks after it. False: even so it does not fit."""
        with self._lock:
            index = dict(self._index)
        total, count = sum(b.nbytes for b in index.values()), len(index)

        def broken(b: Block) -> bool:
            return bool(b.parent) and b.parent not in index

        order = sorted(
            index.values(), key=lambda b: (not broken(b), b.kind == SYSTEM, b.used, -b.start)
        )
        removed: set[str] = set()
        for block in order:
            if total + size <= self.max_bytes and count + files <= MAX_FILES:
                break
            if block.name in kept or block.name in removed:
                continue
            with self._lock:
                after = self._descendants([block.name])
            for b in (block, *after):
                if b.name in removed or b.name in kept:
                    continue
                self._unlink(b)
                removed.add(b.name)
                total -= b.nbytes
                count -= 1
                self.figures.evicted += 1
        return total + size <= self.max_bytes

    def _unlink(self, block: Block) -> None:
        with contextlib.suppress(OSError):
            (self.directory / block.name).unlink()
        with self._lock:
            self._index.pop(block.name, None)

    def stats(self) -> dict[str, int]:
        with self._lock:
            own = [b for b in self._index.values() if b.model == self.identity.model]
            total = sum(b.nbytes for b in self._index.values())
        f = self.figures
        return {
            "max_bytes": self.max_bytes,
            "bytes": total,
            "blocks": len(own),
            "hits": f.hits,
            "loaded_tokens": f.loaded_tokens,
            "writes": f.writes,
            "written_bytes": f.written_bytes,
            "dropped": f.dropped,
            "refused": f.refused,
            "evicted": f.evicted,
        }
