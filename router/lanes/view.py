"""What the admin API and the status page show of the lane worker processes: each lane's
state, the processes with their memory, and the layout with the numbers behind it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from router.lanes.layout import LayoutChoice
from router.lanes.models import ModelManager
from router.lanes.rankgroup import host_memory
from router.lanes.supervisor import LaneSupervisor


def supervised_states(supervisors: Iterable[LaneSupervisor]) -> dict[str, str]:
    """Each lane's state: that of the process serving it (one process serves both lanes in
    the shared layout)."""
    return {lane: s.status.state.value for s in supervisors for lane in s.lanes}


def workers(supervisors: Iterable[LaneSupervisor]) -> list[dict[str, Any]]:
    """The lane worker processes: the lanes each serves, its state, pid and memory."""
    return [
        {
            "lanes": list(s.lanes),
            "state": s.status.state.value,
            "pid": s.status.pid,
            "restarts": s.status.restarts,
            **(s.memory or {}),
            **_cores(s),
            **_group(s),
        }
        for s in supervisors
    ]


# A lane process's OpenBLAS threads, as the core share last set them (router.worker.engines.
# cores): a property of the process, read from its last /health (refreshed every poll).
CORE_FIGURES = ("blas_threads", "blas_thread_changes")


def _cores(supervisor: LaneSupervisor) -> dict[str, Any]:
    health = supervisor.status.health or {}
    return {k: health[k] for k in CORE_FIGURES if k in health}


def _group(supervisor: LaneSupervisor) -> dict[str, Any]:
    """A group of ranks (``lanes.group``): its ranks, their hosts and each host's memory, as
    rank 0 last reported them."""
    spec = supervisor.command.group
    if spec is None:
        return {}
    health = supervisor.status.health or {}
    reported = health.get("group")
    memory = reported.get("rank_memory_bytes") if isinstance(reported, dict) else None
    hosts = list(spec.rank_hosts)
    return {
        "group": {
            "ranks": spec.ranks,
            "hosts": hosts,
            "backend": spec.backend,
            "parallel": spec.parallel,
            "rank_memory_bytes": memory if isinstance(memory, list) else None,
            "host_memory_bytes": host_memory(hosts, health) or None,
        }
    }


def every_lane(
    supervisors: list[LaneSupervisor], manager: ModelManager | None
) -> tuple[list[LaneSupervisor], dict[str, str]]:
    """The worker processes and each lane backend's state, of every loaded model (the
    start-up model's ``supervisors`` alone without models on demand)."""
    states = supervised_states(supervisors)
    if manager is None:
        return supervisors, states
    return manager.supervisors(), {**states, **manager.supervised_states()}


def layout(choice: LayoutChoice | None) -> dict[str, Any] | None:
    return choice.to_json() if choice is not None else None
