"""``[lanes.group]``: parsed once into frozen values; every mistake named by its key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.config.settings import ConfigError, load_settings


def settings_of(tmp_path: Path, group: str, where: str = "lanes.group") -> object:
    config = tmp_path / "speclane.toml"
    config.write_text(f"[{where}]\n{group}")
    return load_settings(config)


def test_three_local_ranks_parse_into_frozen_values(tmp_path: Path) -> None:
    s = settings_of(tmp_path, 'hosts = ["127.0.0.1", "127.0.0.1", "127.0.0.1"]\n')
    group = s.lanes.group  # type: ignore[attr-defined]
    assert group.ranks == 3 and group.local
    assert (group.backend, group.parallel, group.port) == ("ring", "tensor", None)
    with pytest.raises(ValueError, match="frozen"):
        group.backend = "mpi"


def test_a_hostfile_is_read_at_start_up(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(
        json.dumps(
            {
                "backend": "jaccl",
                "hosts": [
                    {"ssh": "mac1.local", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en3"]},
                    {"ssh": "mac2.local", "ips": ["10.0.0.2"], "rdma": ["rdma_en3", None]},
                ],
            }
        )
    )
    s = settings_of(tmp_path, f'hostfile = "{hostfile}"\nbackend = "jaccl"\n')
    group = s.lanes.group  # type: ignore[attr-defined]
    assert group.rank_hosts == ("mac1.local", "mac2.local") and not group.local


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('hosts = ["127.0.0.1"]\n', "2 to 64 ranks"),
        ("backend = 'ring'\n", "exactly one of hosts or hostfile"),
        ('hosts = ["127.0.0.1", "127.0.0.1"]\nhostfile = "h.json"\n', "exactly one of"),
        ('hosts = ["mac1.local", "mac2.local"]\n', "needs IP addresses"),
        ('hosts = ["127.0.0.1", "127.0.0.1"]\nbackend = "nccl"\n', "lanes.group.backend"),
        ('hosts = ["127.0.0.1", "127.0.0.1"]\nparallel = "expert"\n', "lanes.group.parallel"),
        ('hosts = ["127.0.0.1", "127.0.0.1"]\nport = 80\n', "lanes.group.port"),
        ('hosts = ["127.0.0.1", "a,b"]\n', "not a host name"),
        ('hostfile = "/nonexistent/hosts.json"\n', "does not exist"),
        ('hosts = ["10.0.0.1", "10.0.0.2"]\nbackend = "jaccl"\n', "needs a hostfile"),
        ('hosts = ["127.0.0.1", "127.0.0.1"]\nrank = 2\n', "lanes.group.rank"),
    ],
)
def test_mistakes_name_the_key(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=r"lanes\.group") as info:
        settings_of(tmp_path, text)
    assert says in str(info.value)


def test_a_broken_hostfile_says_why(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text('[{"ips": ["10.0.0.1"]}, {"ssh": "b"}]')
    with pytest.raises(ConfigError, match="host 0 has no ssh name"):
        settings_of(tmp_path, f'hostfile = "{hostfile}"\n')


def test_a_model_entry_takes_a_group_too(tmp_path: Path) -> None:
    config = tmp_path / "speclane.toml"
    config.write_text(
        '[[lanes.models]]\nname = "big"\npath = "/models/big"\n'
        '[lanes.models.group]\nhosts = ["10.0.0.1", "10.0.0.2"]\n'
    )
    (entry,) = load_settings(config).lanes.models
    assert entry.group is not None and entry.group.ranks == 2
