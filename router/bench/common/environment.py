"""What a benchmark was measured on: versions (where the bench runs: an attached router's may
differ), hardware, machine load, and the lanes' models as the lanes report them."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import aiohttp

from router import __version__


def commit() -> str:
    """The checked-out commit, ``-dirty`` when tracked files have changed."""
    argv = ["git", "describe", "--always", "--dirty", "--exclude=*"]
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    return "unknown"


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"speclane": __version__, "python": platform.python_version()}
    for name in ("mlx", "mlx-lm", "aiohttp"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def hardware() -> dict[str, Any]:
    memory = None
    with contextlib.suppress(ValueError, OSError, AttributeError):
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_gib": memory,
        "mlx_device": _mlx_device(),
    }
    if platform.system() == "Linux":
        from router.lanes.blas import openblas_path

        preload = None if os.environ.get("SPECLANE_NO_OPENBLAS") == "1" else openblas_path()
        info["openblas_preloaded"] = preload
    return info


def record() -> dict[str, Any]:
    """Versions, hardware and machine load, for a benchmark's results file."""
    return {"versions": versions(), "hardware": hardware(), "load_average": load_average()}


def load_average() -> list[float] | None:
    with contextlib.suppress(OSError, AttributeError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


async def lanes_info(
    session: aiohttp.ClientSession, root_url: str, api_key: str | None = None
) -> list[dict[str, Any]]:
    """The router's lanes as its admin endpoint and the workers' health report them; empty
    when the admin endpoint is closed to us (another machine, an admin key)."""
    data = await _get_json(session, f"{root_url}/admin/lanes", api_key)
    lanes = []
    for backend in (b for b in (data or {}).get("backends", []) if b.get("lane")):
        entry = {
            "lane": backend["lane"],
            "model": backend.get("model"),
            "draft_model": backend.get("draft"),
            "state": backend.get("state"),
            "speculation": backend.get("speculation"),
        }
        # The worker's own facts, as its /health reported them to the router (a worker
        # answers only the router that started it).
        worker = backend.get("worker")
        if isinstance(worker, dict):
            entry.update(worker)
        lanes.append(entry)
    return lanes


async def served_models(
    session: aiohttp.ClientSession, base_url: str, api_key: str | None = None
) -> list[str]:
    data = await _get_json(session, f"{base_url}/models", api_key)
    return [str(m["id"]) for m in (data or {}).get("data", []) if "id" in m]


async def _get_json(
    session: aiohttp.ClientSession, url: str, api_key: str | None = None
) -> dict[str, Any] | None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(10)) as resp:
            data = await resp.json(content_type=None) if resp.status == 200 else None
            return data if isinstance(data, dict) else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _mlx_device() -> str | None:
    try:
        import mlx.core as mx

        device = mx.default_device()
        return str(getattr(device.type, "name", device))  # "cpu" / "gpu"
    except Exception:  # no mlx, or no usable device: the record just says so
        return None
