"""Prompt-cache partitions through a real router: what the lanes are told, what external
backends are not, and a cache-affinity decision that never reflects another client's traffic.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import openai

from router.kernel.worker_contract import CACHE_PARTITION_HEADER, CACHE_PARTITION_PATTERN
from tests.conftest import add_fake_lane, fake_upstreams, router_settings, run_router
from tests.routing.test_routing_e2e import policy_router

MODEL = "fake-model"
KEYS = {"alice": "sk-alice-0123456789", "bob": "sk-bob-0123456789", "carol": "sk-carol-0123456789"}
POLICIES = {
    "default.toml": 'client = "default"\n',
    "alice.toml": f'[match]\napi_keys = ["{KEYS["alice"]}"]\nclient_header = ["alice"]\n',
    "bob.toml": f'cache_group = "team"\n[match]\napi_keys = ["{KEYS["bob"]}"]\n',
    "carol.toml": f'cache_group = "team"\n[match]\napi_keys = ["{KEYS["carol"]}"]\n',
    "dave.toml": '[match]\nuser_agent = ["dave-agent"]\n',
}
SYSTEM = {"role": "system", "content": "You keep a secret PIN: 4821. " * 20}
TURN1 = [SYSTEM, {"role": "user", "content": "hello"}]
TURN2 = [*TURN1, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
TURN2B = [*TURN1, {"role": "assistant", "content": "yes"}, {"role": "user", "content": "else"}]


def partition_of(seen: Any) -> str | None:
    return {k.lower(): v for k, v in seen.headers.items()}.get(CACHE_PARTITION_HEADER.lower())


async def ask(
    client: openai.AsyncOpenAI, messages: list[dict[str, str]], **kw: Any
) -> dict[str, str]:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, **kw
    )  # type: ignore[arg-type]
    return {k.lower(): v for k, v in raw.headers.items()}


async def test_each_keyed_client_has_its_partition_and_a_group_shares_one(tmp_path: Path) -> None:
    async with policy_router(tmp_path, POLICIES) as (r, spec, _):
        lane = {"X-Speclane-Lane": "speculative"}
        for who in ("alice", "alice", "bob", "carol"):
            await ask(r.client(api_key=KEYS[who]), TURN1, extra_headers=lane)
        # Labels prove nothing: a header, a user agent or nothing at all is the default's.
        await ask(
            r.client(default_headers={"X-Speclane-Client": "alice"}), TURN1, extra_headers=lane
        )
        await ask(
            r.client(default_headers={"User-Agent": "dave-agent/1"}), TURN1, extra_headers=lane
        )
        await ask(r.client(), TURN1, extra_headers=lane)
        # A client cannot choose its partition: its own header is not forwarded.
        await ask(r.client(), TURN1, extra_headers={**lane, CACHE_PARTITION_HEADER: "x" * 24})
    a1, a2, bob, carol, named, agent, nobody, forged = [partition_of(s) for s in spec.requests]
    assert all(
        p is not None and re.fullmatch(CACHE_PARTITION_PATTERN, p) for p in (a1, bob, nobody)
    )
    assert a1 == a2 and bob == carol
    assert len({a1, bob, nobody}) == 3
    assert named == agent == nobody == forged
    assert "alice" not in str(a1) and "team" not in str(bob)  # opaque: no policy names


async def test_external_backends_are_never_told_the_partition(tmp_path: Path) -> None:
    (tmp_path / "alice.toml").write_text(POLICIES["alice.toml"])
    async with fake_upstreams("ext") as (ext,):
        settings = router_settings(ext, policies_dir=str(tmp_path))
        async with run_router(settings) as r:
            await ask(
                r.client(api_key=KEYS["alice"]),
                TURN1,
                extra_headers={CACHE_PARTITION_HEADER: "forged"},
            )
    assert len(ext.requests) == 1
    assert partition_of(ext.requests[0]) is None


async def test_cache_affinity_never_reflects_another_clients_conversation(tmp_path: Path) -> None:
    async with policy_router(tmp_path, POLICIES) as (r, _, batch):
        alice, bob = r.client(api_key=KEYS["alice"]), r.client(api_key=KEYS["bob"])
        carol = r.client(api_key=KEYS["carol"])
        first = await ask(alice, TURN1, extra_headers={"X-Speclane-Lane": "batching"})
        probe = await ask(bob, TURN2)  # the same conversation, another client
        again = await ask(alice, TURN2)
        await ask(bob, TURN1, extra_headers={"X-Speclane-Lane": "batching"})
        shared = await ask(carol, TURN2B)  # bob's cache group
    assert first["x-speclane-lane"] == "batching"
    assert "cache-affinity" not in probe["x-speclane-decision"]
    assert again["x-speclane-decision"].endswith("cache-affinity->batching")
    assert shared["x-speclane-decision"].endswith("cache-affinity->batching")
    assert len(batch.requests) == 4


async def test_a_lane_alone_is_told_the_partition(tmp_path: Path) -> None:
    """Both a lane and an external backend serve the model: only the lane gets the header."""
    async with fake_upstreams("ext", "lane") as (ext, lane):
        settings = router_settings(ext)

        def setup(wired: object) -> None:
            add_fake_lane(wired, "batching", lane)  # type: ignore[arg-type]

        async with run_router(settings, setup=setup) as r:
            client = r.client()
            for target in ("batching", "ext"):
                await ask(client, TURN1, extra_headers={"X-Speclane-Lane": target})
    assert [partition_of(s) is not None for s in lane.requests] == [True]
    assert [partition_of(s) for s in ext.requests] in ([], [None])


def test_the_key_kept_on_disk_gives_a_client_the_same_token_after_a_restart(
    tmp_path: Path,
) -> None:
    """With the disk tier on, a client's files stay its own across router restarts: the
    partition tokens' key is kept in the tier's directory (0600), drawn once."""
    import stat

    from router.proxy.partition import KEY_FILE, keep_key_in, wire_token

    assert keep_key_in(tmp_path / "kv")
    first = wire_token("client:alice")
    assert keep_key_in(tmp_path / "elsewhere")  # another router's directory: another key
    assert wire_token("client:alice") != first
    assert keep_key_in(tmp_path / "kv")  # this router, restarted
    assert wire_token("client:alice") == first
    assert re.fullmatch(CACHE_PARTITION_PATTERN, first)
    assert stat.S_IMODE((tmp_path / "kv" / KEY_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "kv").stat().st_mode) == 0o700
