"""The prompt cache's disk tier: what one block file is, how it is named, read and written.

A block holds the KV state of a run of positions of one token prefix, ``start`` up to its
end, and names the block before it (``parent``: the block ending at ``start``; none for the
first). A chain of blocks from the first is one cached prefix (``Chain``). A block's name is
a hash of the model's identity, the partition's hash and the whole token prefix up to the
block's end: two prefixes that share a block's tokens share its file, and the name reveals
nothing. Inside (mlx's safetensors): each layer's keys and values for the block's positions,
and metadata naming the model and tokenizer identities, the partition's hash and the lane's
opaque partition token, the block's own tokens, its start, its parent and a checksum of the
data.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "speclane-prompt-cache/2"  # blocks; /1 held one whole entry per file
OLD_FORMATS = ("speclane-prompt-cache/1",)
SUFFIX = ".safetensors"
TMP_PREFIX = ".tmp-"
MAX_HEADER_BYTES = 64 << 20  # a safetensors header past this is not ours
DIGEST = 16  # bytes of a blake2b digest in names and hashes
HEADER_SLACK = 4096  # a file's metadata beyond its arrays' entries and its tokens
ARRAY_HEADER_BYTES = 256  # an array's entry in the header (name, dtype, shape, offsets)


@dataclass(frozen=True)
class Identity:
    """What a file must have been made by to be loaded: the model and its tokenizer."""

    model: str
    tokenizer: str


@dataclass
class Block:
    name: str  # the file name: the hash of everything up to the block's end
    model: str  # the model identity it names
    partition: str  # the partition's hash
    owner: str  # the partition's token as the lane got it (opaque: the router's keyed hash)
    parent: str  # the name of the block ending at ``start`` ("" for the first)
    start: int  # the position of the block's first token
    tokens: bytes  # the block's own tokens, int32 little-endian
    nbytes: int  # the file's size
    kind: str
    used: float  # last written, extended or loaded

    @property
    def end(self) -> int:
        return self.start + len(self.tokens) // 4


@dataclass(frozen=True)
class Chain:
    """A cached prefix: its blocks, the first first."""

    blocks: tuple[Block, ...]

    @property
    def tip(self) -> Block:
        return self.blocks[-1]

    @property
    def owner(self) -> str:
        return self.tip.owner

    @property
    def kind(self) -> str:
        return self.tip.kind

    @property
    def length(self) -> int:
        return self.tip.end

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.blocks)

    def token_list(self) -> list[int]:
        return unpack(b"".join(b.tokens for b in self.blocks))


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


def _hasher(model: str, partition_hashed: str) -> Any:
    digest = hashlib.blake2b(digest_size=DIGEST, person=b"speclane-kv")
    digest.update(f"{model}\0{partition_hashed}\0".encode())
    return digest


def entry_name(model: str, partition_hashed: str, tokens: bytes) -> str:
    """The name of the block ending at the end of ``tokens`` (packed)."""
    digest = _hasher(model, partition_hashed)
    digest.update(tokens)
    return digest.hexdigest() + SUFFIX


def prefix_names(
    model: str, partition_hashed: str, tokens: bytes, ends: Iterable[int]
) -> dict[int, str]:
    """The name a block ending at each of ``ends`` (positions within ``tokens``) would have:
    one pass over the tokens."""
    digest, done, out = _hasher(model, partition_hashed), 0, {}
    for end in sorted(set(ends)):
        digest.update(tokens[4 * done : 4 * end])
        done = end
        out[end] = digest.copy().hexdigest() + SUFFIX
    return out


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
    ValueError for anything that is not a prompt-cache file, of this format or an older)."""
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
    if not isinstance(meta, dict) or meta.get("format") not in (FORMAT, *OLD_FORMATS):
        raise ValueError("not a speclane prompt-cache file")
    end = 0
    for tensor in header.values():
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise ValueError("a tensor without offsets")
        end = max(end, int(offsets[1]))
    return meta, 8 + size + end


def header_bytes(layers: int, tokens: int) -> int:
    """What a block file's header may take: every array's entry, the tokens in base64, the
    rest of the metadata."""
    return HEADER_SLACK + ARRAY_HEADER_BYTES * 2 * layers + tokens * 2


def head_bytes(array: Any, n: int) -> int:
    """Bytes of ``n`` positions of a KV layer's array ``[batch, heads, positions, dim]``."""
    b, heads, _, dim = array.shape
    return int(b * heads * n * dim * array.itemsize)


def write_atomic(directory: Path, name: str, arrays: dict[str, Any], meta: dict[str, str]) -> int:
    """Write one file: a temporary file (0600), fsynced, renamed into place, the directory
    fsynced; a crash leaves the whole file or none. Returns its size."""
    import mlx.core as mx

    tmp = directory / f"{TMP_PREFIX}{secrets.token_hex(8)}{SUFFIX}"
    final = directory / name
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
        fsync_dir(directory)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return final.stat().st_size


def fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
