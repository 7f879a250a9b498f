"""``[lanes.group]``: the lanes whose model spans several ranks (machines) on MLX's own
distributed runtime (``mx.distributed``, started by ``mlx.launch``), one copy for both.

Parsed once here into frozen values: the hosts (a list, a host named twice runs two ranks
there, or an ``mlx.launch`` hostfile, read now so that a broken one fails at start-up with its
key), the backend (``ring`` over TCP, ``jaccl`` over Thunderbolt RDMA, ``mpi``) and how the
model is split (``tensor``: each rank holds a slice of every layer, through the model's
``shard()``; ``pipeline``: each rank holds some of the layers, where the model has
``pipeline()``).
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from router.config.base import Frozen

MAX_RANKS = 64
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class GroupSpec(Frozen):
    """The group of ranks a model's lanes run on; rank 0 (the first host) must be this
    machine: it answers the router's HTTP and holds the draft model."""

    hosts: tuple[str, ...] = ()
    hostfile: Path | None = None
    backend: Literal["ring", "jaccl", "mpi"] = "ring"
    parallel: Literal["tensor", "pipeline"] = "tensor"
    # The ring backend's first port (one more per rank and address); None: a free range on
    # this machine, found at every start.
    port: int | None = Field(default=None, ge=1024, le=65000)

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for host in v:
            if not host or len(host) > 253 or any(c.isspace() or c in ",'\"" for c in host):
                raise ValueError(f"{host!r} is not a host name or address")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> GroupSpec:
        if bool(self.hosts) == (self.hostfile is not None):
            raise ValueError("name the group's ranks with exactly one of hosts or hostfile")
        ranks = self.rank_hosts
        if not 2 <= len(ranks) <= MAX_RANKS:
            raise ValueError(f"a group has 2 to {MAX_RANKS} ranks; {len(ranks)} given")
        if self.backend == "jaccl" and self.hostfile is None:
            raise ValueError(
                "the jaccl backend needs a hostfile naming each host's RDMA devices "
                "(written by mlx.distributed_config --backend jaccl)"
            )
        if self.backend == "ring" and self.hostfile is None:
            for host in self.hosts:
                try:
                    ipaddress.ip_address(host)
                except ValueError:
                    raise ValueError(
                        f"the ring backend needs IP addresses in hosts ({host!r} is a name); "
                        "use a hostfile with ssh names and ips"
                    ) from None
        return self

    @property
    def rank_hosts(self) -> tuple[str, ...]:
        """The host of every rank, rank 0 first."""
        if self.hostfile is not None:
            return hostfile_hosts(self.hostfile)
        return self.hosts

    @property
    def ranks(self) -> int:
        return len(self.rank_hosts)

    @property
    def local(self) -> bool:
        """Every rank on this machine (all on the loopback address)."""
        return all(h in LOCAL_HOSTS for h in self.rank_hosts)


def hostfile_hosts(path: Path) -> tuple[str, ...]:
    """The ssh host of every rank in an ``mlx.launch`` hostfile (a list of hosts, or an
    object with ``hosts``; each host an object with ``ssh``). Raises ValueError."""
    try:
        data = json.loads(path.expanduser().read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"hostfile {path} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"hostfile {path} cannot be read as JSON: {e}") from None
    hosts = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(hosts, list):
        raise ValueError(f"hostfile {path}: expected a list of hosts (or an object with hosts)")
    out = []
    for i, host in enumerate(hosts):
        ssh = host.get("ssh") if isinstance(host, dict) else None
        if not isinstance(ssh, str) or not ssh:
            raise ValueError(f"hostfile {path}: host {i} has no ssh name")
        out.append(ssh)
    return tuple(out)
