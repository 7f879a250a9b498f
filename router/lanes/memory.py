"""What the machine and the lanes' files and processes hold in memory (read from the system).

The pure side (the estimate, the layout choice, the guard) is ``router.lanes.layout``; this
module only measures: the weights files on disk, the machine's memory (``/proc/meminfo``, or
``lanes.machine_memory_bytes`` when set), and a worker process's resident and proportional set
size (``/proc/PID/smaps_rollup``; PSS splits pages shared between processes fairly, so the sum
over workers is what they cost together).
"""

from __future__ import annotations

import os
from pathlib import Path

from router.lanes.layout import Memory

WEIGHT_SUFFIXES = (".safetensors", ".npz", ".gguf", ".bin")
MEMINFO = Path("/proc/meminfo")


def weights_bytes(model: str | None) -> int:
    """The size of a local model directory's weights files (0: not a local directory)."""
    if not model:
        return 0
    path = Path(model).expanduser()
    if not path.is_dir():
        return 0
    return sum(
        f.stat().st_size for f in path.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES)
    )


def machine_memory(override: int | None = None) -> Memory:
    """Total and available memory; ``override`` stands for both."""
    if override is not None:
        return Memory(override, override)
    fields = _meminfo()
    total = fields.get("MemTotal") or _sysconf_total()
    return Memory(total, fields.get("MemAvailable", total))


def _meminfo() -> dict[str, int]:
    try:
        text = MEMINFO.read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def _sysconf_total() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on this OS
        return 0


def process_memory(pid: int) -> dict[str, int] | None:
    """``{"rss_bytes": ..., "pss_bytes": ...}`` of a live process (None: not readable here)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if name in ("Rss", "Pss") and parts and parts[0].isdigit():
            values[f"{name.lower()}_bytes"] = int(parts[0]) * 1024
    return values if len(values) == 2 else None


def tree_memory(pid: int) -> dict[str, int] | None:
    """``process_memory`` of ``pid`` and every process below it, summed (a group's launcher
    and its ranks on this machine)."""
    total: dict[str, int] = {}
    for member in _tree(pid):
        for key, value in (process_memory(member) or {}).items():
            total[key] = total.get(key, 0) + value
    return total or None


def _tree(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 1024:
        current = todo.pop()
        out.append(current)
        try:
            tasks = Path(f"/proc/{current}/task").iterdir()
            for task in tasks:
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out
