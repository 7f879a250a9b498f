"""The prompt cache's disk tier: entries spill to files and are found again after a restart.

Every entry the lane stores in memory (``router.worker.engines.promptcache``) of the served
model is also written here, off the generation thread; a lookup that misses memory, or hits
only a shorter prefix, asks this tier for a longer one of the same partition and loads it
back (reading a file is far cheaper than a prefill). So a worker restart, a crash, an unload
on TTL or an eviction from memory costs a read, not the prompt again; and in the separate
layout the other lane's worker, sharing the directory, finds what this one stored.

- Files: one per entry, ``<hash>.safetensors`` in one directory (0700, files 0600). The hash
  is of the model's identity, the partition and the token prefix: the name reveals nothing.
  Inside (mlx's safetensors): each layer's keys and values, and metadata naming the model and
  tokenizer identities, the partition's hash, the token prefix itself and a checksum of the
  data. Only plain ``KVCache`` layers are written (a model with other caches keeps memory only).
- Atomic: written to a temporary file, fsynced, renamed into place (and the directory
  fsynced). A crash leaves a whole file or none; a leftover temporary file is removed.
- Checked: at start every file's header is read (never its data) to rebuild the index; on
  load the metadata must name this model, this tokenizer and the requester's partition, the
  name must be the hash of what the metadata says, and the data must match its checksum. A
  file failing any of that is dropped with a log line and never loaded. Files of another
  model (a model swap) stay, counted in the bound, never loaded for this one.
- Bounded: ``max_bytes`` for all files in the directory; before a write, whole-sequence
  entries are removed least recently used first, then system-prompt entries. A write that
  does not fit alone is not made. The writer's queue holds ``QUEUE_SIZE`` entries and
  ``MAX_QUEUED_BYTES`` of their arrays; a store that finds it full is dropped (counted),
  never waited for.
- Isolation: the index is searched under the requester's partition hash only, and a loaded
  file's metadata must name that partition: partition A never finds B's entries on disk.

Thread-safe: the generation thread(s) look up and load, the writer thread writes and evicts;
one lock guards the index. The writer gets the stored entry's own arrays (evaluated, never
changed in place: the memory cache only copies them out) and slices and copies them on its
own thread, so a store costs the generation thread nothing (MLX evaluates an array on the
thread that made it: the writer makes its own).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import queue
import secrets
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router.worker.engines.entrykinds import SEQUENCE, SYSTEM, USER

log = logging.getLogger("speclane.worker")

FORMAT = "speclane-prompt-cache/1"
SUFFIX = ".safetensors"
TMP_PREFIX = ".tmp-"
QUEUE_SIZE = 4  # entries waiting for the writer (a sequence and its segment each); more are dropped
MAX_QUEUED_BYTES = 1 << 30  # their arrays, all together (held alive until written)
MAX_HEADER_BYTES = 64 << 20  # a safetensors header past this is not ours
MAX_FILES = 4096  # files indexed; past this the oldest are removed
STALE_TMP_SECONDS = 3600.0  # a temporary file this old was left by a crash
KINDS = (SEQUENCE, USER, SYSTEM)
DIGEST = 16  # bytes of a blake2b digest in names and hashes


@dataclass(frozen=True)
class Identity:
    """What a file must have been made by to be loaded: the model and its tokenizer."""

    model: str
    tokenizer: str


@dataclass
class Entry:
    name: str  # the file name
    model: str  # the model identity it names
    partition: str  # the partition's hash
    owner: str  # the partition's token as the lane got it (opaque: the router's keyed hash)
    tokens: bytes  # the token prefix, int32 little-endian
    nbytes: int  # the file's size
    kind: str
    used: float  # last written or loaded (the file's mtime)

    @property
    def length(self) -> int:
        return len(self.tokens) // 4

    def token_list(self) -> list[int]:
        return unpack(self.tokens)


@dataclass
class DiskFigures:
    hits: int = 0  # loads that gave a lookup a longer prefix
    loaded_tokens: int = 0  # prompt tokens those loads held
    writes: int = 0
    dropped: int = 0  # stores dropped: the writer was behind
    refused: int = 0  # files dropped on load or at indexing: corrupt, foreign, misnamed
    evicted: int = 0


@dataclass(frozen=True)
class Write:
    owner: str
    partition: str
    tokens: bytes
    kind: str
    layers: list[tuple[Any, Any]]  # each layer's keys and values (evaluated, whole buffers)
    length: int  # the positions to write
    nbytes: int  # what the file's arrays hold


def identity_of(model_dir: Path) -> Identity:
    """The model's identity: a hash of its config and its weight files' names and sizes (not
    their bytes: reading gigabytes at start is too slow); the tokenizer's: of its files."""
    model = hashlib.blake2b(digest_size=DIGEST)
    tokenizer = hashlib.blake2b(digest_size=DIGEST)
    for path in sorted(model_dir.iterdir()):
        if not path.is_file():
            continue
        if path.name == "config.json":
            model.update(b"config\0" + path.read_bytes())
        elif path.suffix in (".safetensors", ".npz", ".gguf", ".bin"):
            model.update(f"{path.name}\0{path.stat().st_size}\0".encode())
        elif path.name.startswith("tokenizer") or path.name in ("vocab.json", "merges.txt"):
            tokenizer.update(path.name.encode() + b"\0" + path.read_bytes())
    return Identity(model.hexdigest(), tokenizer.hexdigest())


def partition_hash(identity: Identity, partition: str) -> str:
    digest = hashlib.blake2b(digest_size=DIGEST, person=b"speclane-part")
    digest.update(f"{identity.model}\0{partition}".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def entry_name(model: str, partition_hashed: str, tokens: bytes) -> str:
    digest = hashlib.blake2b(digest_size=DIGEST, person=b"speclane-kv")
    digest.update(f"{model}\0{partition_hashed}\0".encode())
    digest.update(tokens)
    return digest.hexdigest() + SUFFIX


def pack(tokens: Iterable[int]) -> bytes:
    values = list(tokens)
    return struct.pack(f"<{len(values)}i", *values)


def unpack(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 4}i", data))


def common_prefix(a: bytes, b: bytes) -> int:
    """Tokens two packed prefixes share (a binary search over C slice comparisons)."""
    lo, hi = 0, min(len(a), len(b)) // 4
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[: 4 * mid] == b[: 4 * mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def checksum(arrays: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    for name in sorted(arrays):
        digest.update(name.encode() + b"\0")
        digest.update(memoryview(arrays[name]).cast("B"))
    return digest.hexdigest()


def read_header(path: Path) -> tuple[dict[str, str], int]:
    """A safetensors file's metadata and the size its header says the file has (raises
    ValueError for anything else)."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("no header")
        (size,) = struct.unpack("<Q", head)
        if not 0 < size <= MAX_HEADER_BYTES:
            raise ValueError("header size out of range")
        raw = f.read(size)
    if len(raw) != size:
        raise ValueError("header cut short")
    header = json.loads(raw)
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError("not a speclane prompt-cache file")
    end = 0
    for tensor in header.values():
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise ValueError("a tensor without offsets")
        end = max(end, int(offsets[1]))
    return meta, 8 + size + end


@dataclass
class DiskTier:
    directory: Path
    max_bytes: int
    identity: Identity
    figures: DiskFigures = field(default_factory=DiskFigures)
    max_queued_bytes: int = MAX_QUEUED_BYTES

    def __post_init__(self) -> None:
        if self.max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self._lock = threading.Lock()
        self._index: dict[str, Entry] = {}  # file name -> entry (every model's)
        self._seen_mtime = -1
        self._queue: queue.Queue[Write | None] = queue.Queue(QUEUE_SIZE)
        self._queued_bytes = 0  # the arrays of the entries queued (guarded by the lock)
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
                entry = self._read_entry(name)
                if entry is not None:
                    with self._lock:
                        self._index[name] = entry

    def _remove_stale_tmp(self, path: Path, now: float) -> None:
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > STALE_TMP_SECONDS:
                path.unlink()

    def _read_entry(self, name: str) -> Entry | None:
        path = self.directory / name
        try:
            stat = path.stat()
            meta, size = read_header(path)
            if size != stat.st_size:
                raise ValueError(f"{stat.st_size} bytes where the header says {size}")
            tokens = base64.b64decode(meta["tokens"], validate=True)
            if entry_name(meta["model"], meta["partition"], tokens) != name:
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
        return Entry(name, model, hashed, owner, tokens, stat.st_size, kind, stat.st_mtime)

    def _refuse(self, name: str, why: str) -> None:
        """Drop a file that must never be loaded, and say so."""
        log.warning("prompt cache on disk: %s dropped: %s", name, why)
        self.figures.refused += 1
        with contextlib.suppress(OSError):
            (self.directory / name).unlink()
        with self._lock:
            self._index.pop(name, None)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._index.values())

    def entries(self) -> list[Entry]:
        """This model's entries (every partition's)."""
        with self._lock:
            return [e for e in self._index.values() if e.model == self.identity.model]

    # --- lookups (generation thread) -----------------------------------------------------------

    def find(self, partition: str, tokens: list[int]) -> tuple[Entry, int] | None:
        """This partition's entry sharing the longest prefix with ``tokens``, and how many
        tokens it shares (None: no entry shares any); of several, the smallest file."""
        self.refresh()
        hashed = partition_hash(self.identity, partition)
        packed = pack(tokens)
        best: tuple[Entry, int] | None = None
        with self._lock:
            candidates = [
                e
                for e in self._index.values()
                if e.partition == hashed and e.model == self.identity.model
            ]
        for entry in candidates:
            shared = common_prefix(entry.tokens, packed)
            if not shared or (best is not None and shared < best[1]):
                continue
            # as much shared: the smaller file (a system prompt's, not a whole conversation)
            if best is None or shared > best[1] or entry.nbytes < best[0].nbytes:
                best = (entry, shared)
        return best

    def load(self, partition: str, entry: Entry) -> list[Any] | None:
        """The entry's KV state as ``KVCache`` layers, after every check (None: refused, or
        gone meanwhile)."""
        import mlx.core as mx
        from mlx_lm.models.cache import KVCache

        path = self.directory / entry.name
        hashed = partition_hash(self.identity, partition)
        try:
            meta, size = read_header(path)
            if size != path.stat().st_size:
                raise ValueError("cut short")
            if meta.get("model") != self.identity.model:
                raise ValueError("made by another model")
            if meta.get("tokenizer") != self.identity.tokenizer:
                raise ValueError("made with another tokenizer")
            if meta.get("partition") != hashed or entry.partition != hashed:
                raise ValueError("another partition's entry")
            tokens = base64.b64decode(meta["tokens"], validate=True)
            if entry_name(meta["model"], meta["partition"], tokens) != entry.name:
                raise ValueError("the name is not the hash of its contents")
            arrays = mx.load(str(path))
            assert isinstance(arrays, dict)
            if checksum(arrays) != meta.get("checksum"):
                raise ValueError("the data does not match its checksum")
            layers = int(meta["layers"])
            length = len(tokens) // 4
            cache = []
            for i in range(layers):
                keys, values = arrays[f"k{i}"], arrays[f"v{i}"]
                if keys.ndim != 4 or keys.shape[2] != length or values.shape[2] != length:
                    raise ValueError("a layer's length is not the prefix's")
                layer = KVCache()
                layer.keys, layer.values, layer.offset = keys, values, length
                cache.append(layer)
            if len(arrays) != 2 * layers:
                raise ValueError("arrays beyond the layers")
        except FileNotFoundError:
            with self._lock:
                self._index.pop(entry.name, None)
            return None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            self._refuse(entry.name, str(e))
            return None
        mx.eval([(c.keys, c.values) for c in cache])
        now = time.time()
        with contextlib.suppress(OSError):
            os.utime(path, (now, now))
        entry.used = now
        self.figures.hits += 1
        self.figures.loaded_tokens += length
        return cache

    def recent(self, per_partition: int, kind: str = SYSTEM) -> list[Entry]:
        """This model's ``per_partition`` most recently used entries of ``kind`` in each
        partition, most recent first."""
        found = sorted(
            (e for e in self.entries() if e.kind == kind), key=lambda e: e.used, reverse=True
        )
        taken: dict[str, int] = {}
        out = []
        for e in found:
            if taken.get(e.partition, 0) < per_partition:
                taken[e.partition] = taken.get(e.partition, 0) + 1
                out.append(e)
        return out

    # --- writes -------------------------------------------------------------------------------

    def put(self, partition: str, tokens: list[int], cache: list[Any], kind: str) -> bool:
        """Queue ``cache`` (the KV state of exactly ``tokens``) for writing; False when not
        queued: the writer is behind (dropped), the layers are not plain ``KVCache``, or the
        same entry is on disk already."""
        from mlx_lm.models.cache import KVCache

        if not self.max_bytes or not tokens:
            return False
        if not all(type(c) is KVCache and c.keys is not None for c in cache):
            return False
        packed = pack(tokens)
        hashed = partition_hash(self.identity, partition)
        name = entry_name(self.identity.model, hashed, packed)
        with self._lock:
            if name in self._index:
                return False
        n = len(tokens)
        if any(c.offset < n for c in cache):
            return False
        size = sum(_head_bytes(c.keys, n) + _head_bytes(c.values, n) for c in cache)
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
        try:
            self._queue.put_nowait(Write(partition, hashed, packed, kind, layers, n, size))
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
            self._write_file(item)
        finally:
            with self._lock:
                self._queued_bytes -= item.nbytes

    def _write_file(self, item: Write) -> None:
        import mlx.core as mx

        name = entry_name(self.identity.model, item.partition, item.tokens)
        size = item.nbytes
        if size > self.max_bytes:
            return
        arrays: dict[str, Any] = {}
        for i, (keys, values) in enumerate(item.layers):
            arrays[f"k{i}"] = mx.contiguous(keys[..., : item.length, :])
            arrays[f"v{i}"] = mx.contiguous(values[..., : item.length, :])
        mx.eval(list(arrays.values()))
        self.refresh()
        # the header: every array's entry, the tokens in base64, the rest of the metadata
        header = HEADER_SLACK + ARRAY_HEADER_BYTES * len(arrays) + len(item.tokens) * 2
        self._make_room(size + header)
        meta = {
            "format": FORMAT,
            "model": self.identity.model,
            "tokenizer": self.identity.tokenizer,
            "partition": item.partition,
            "owner": item.owner,
            "kind": item.kind,
            "tokens": base64.b64encode(item.tokens).decode("ascii"),
            "layers": str(len(item.layers)),
            "checksum": checksum(arrays),
        }
        tmp = self.directory / f"{TMP_PREFIX}{secrets.token_hex(8)}{SUFFIX}"
        final = self.directory / name
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            mx.save_safetensors(str(tmp), arrays, meta)
            os.chmod(tmp, 0o600)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
            _fsync_dir(self.directory)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        stat = final.stat()
        model = self.identity.model
        entry = Entry(
            name,
            model,
            item.partition,
            item.owner,
            item.tokens,
            stat.st_size,
            item.kind,
            time.time(),
        )
        with self._lock:
            self._index[name] = entry
        self.figures.writes += 1
        if item.kind == SEQUENCE:
            self._drop_superseded(entry)

    def _drop_superseded(self, entry: Entry) -> None:
        """A conversation's earlier turns: whole-sequence entries of the partition that are a
        prefix of the new one (which, trimmed, holds them)."""
        with self._lock:
            older = [
                e
                for e in self._index.values()
                if e.partition == entry.partition
                and e.model == entry.model
                and e.kind == SEQUENCE
                and e.name != entry.name
                and e.length < entry.length
                and entry.tokens.startswith(e.tokens)
            ]
        for e in older:
            self._unlink(e)

    def _make_room(self, size: int) -> None:
        """Remove entries until ``size`` more bytes fit: whole sequences first, least recently
        used first, then system prompts; and the oldest past ``MAX_FILES``."""
        with self._lock:
            order = sorted(self._index.values(), key=lambda e: (e.kind == SYSTEM, e.used))
            total = sum(e.nbytes for e in order)
            count = len(order)
        for e in order:
            if total + size <= self.max_bytes and count < MAX_FILES:
                break
            self._unlink(e)
            total -= e.nbytes
            count -= 1
            self.figures.evicted += 1

    def _unlink(self, entry: Entry) -> None:
        with contextlib.suppress(OSError):
            (self.directory / entry.name).unlink()
        with self._lock:
            self._index.pop(entry.name, None)

    def stats(self) -> dict[str, int]:
        with self._lock:
            own = [e for e in self._index.values() if e.model == self.identity.model]
            total = sum(e.nbytes for e in self._index.values())
        f = self.figures
        return {
            "max_bytes": self.max_bytes,
            "bytes": total,
            "entries": len(own),
            "hits": f.hits,
            "loaded_tokens": f.loaded_tokens,
            "writes": f.writes,
            "dropped": f.dropped,
            "refused": f.refused,
            "evicted": f.evicted,
        }


HEADER_SLACK = 4096  # a file's metadata beyond its arrays' entries and its tokens
ARRAY_HEADER_BYTES = 256  # an array's entry in the header (name, dtype, shape, offsets)


def _head_bytes(array: Any, n: int) -> int:
    """Bytes of ``array[..., :n, :]`` (a KV layer's first ``n`` positions), without slicing."""
    b, heads, _, dim = array.shape
    return int(b * heads * n * dim * array.itemsize)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
