"""The Responses store shared fairly and counted by what it holds (issue #36, classes 3 and 6):
one client's flood evicts its own entries before another's; the byte bound bounds the
memory; a caller with only a client label never reaches a key holder's items."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import openai
import pytest

from router.frontdoors.responses_store import ResponseStore
from tests.conftest import router_settings, run_router
from tests.fakes.upstream import FakeUpstream

MODEL = "fake-model"


def conversation(n: int, tag: str) -> list[dict[str, object]]:
    """What an agent's turn stores: many short messages (the worst case for a dict tree)."""
    return [{"role": "user" if i % 2 else "assistant", "content": f"{tag} {i}"} for i in range(n)]


def test_a_flood_by_count_evicts_the_flooders_own_entries_first() -> None:
    store = ResponseStore(max_entries=100, max_bytes=1 << 30)
    for i in range(3):
        assert store.put("quiet", f"q{i}", {"id": f"q{i}"}, conversation(2, "q"))
    for i in range(150):
        assert store.put("flood", f"f{i}", {"id": f"f{i}"}, conversation(2, "f"))
    assert all(store.get("quiet", f"q{i}") is not None for i in range(3))
    assert store.held("flood")[0] == 97 and len(store) == 100
    assert store.get("flood", "f149") is not None and store.get("flood", "f52") is None


def test_a_flood_by_bytes_evicts_the_flooders_own_entries_first() -> None:
    store = ResponseStore(max_entries=10_000, max_bytes=256 * 1024)
    small = conversation(4, "mine")
    assert store.put("quiet", "q", {"id": "q"}, small)
    for i in range(150):
        assert store.put("flood", f"f{i}", {"id": f"f{i}"}, [{"content": "x" * 8000}])
    assert store.get("quiet", "q") is not None
    assert store.get("quiet", "q").messages == small  # type: ignore[union-attr]
    assert store.bytes <= store.max_bytes
    # once the flooder holds less than another owner, that owner gives up its oldest
    store = ResponseStore(max_entries=3, max_bytes=1 << 30)
    for rid in ("a1", "a2"):
        store.put("a", rid, {"id": rid}, [])
    store.put("b", "b1", {"id": "b1"}, [])
    store.put("b", "b2", {"id": "b2"}, [])  # a holds the most: its oldest goes
    assert store.get("a", "a1") is None and store.get("a", "a2") is not None
    assert store.held("b") == (2, store.held("b")[1])


def test_the_byte_bound_bounds_the_memory_held() -> None:
    """16 MiB of store once grew the router by 112 MiB: the bound counted JSON while the
    store held Python objects. Now it holds (and counts) compact bytes."""
    bound = 4 << 20
    store = ResponseStore(max_entries=100_000, max_bytes=bound)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(400):
            response = {"id": f"resp_{i}", "object": "response", "output": conversation(3, "o")}
            store.put("c", f"resp_{i}", response, conversation(300, f"turn {i}"))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert store.bytes <= bound
    assert grown < 1.5 * bound, f"{grown / (1 << 20):.1f} MiB held for a {bound >> 20} MiB bound"


POLICIES = {
    "alice.toml": '[match]\napi_keys = ["alice-key"]\nclient_header = ["alice"]\n',
    "bob.toml": 'require_api_key = true\n[match]\napi_keys = ["bob-key"]\n',
}


@pytest.fixture
def policies(tmp_path: Path) -> str:
    for name, text in POLICIES.items():
        (tmp_path / name).write_text(text)
    return str(tmp_path)


async def test_a_label_never_reaches_what_a_key_holder_stored(
    fake: FakeUpstream, policies: str
) -> None:
    async with run_router(router_settings(fake, policies_dir=policies)) as r:
        keyed = r.client(api_key="alice-key")
        labelled = r.client(default_headers={"X-Speclane-Client": "alice"})
        made = await keyed.responses.create(model=MODEL, input="my secret plan")
        with pytest.raises(openai.NotFoundError):
            await labelled.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            await labelled.responses.create(model=MODEL, input="x", previous_response_id=made.id)
        with pytest.raises(openai.NotFoundError):
            await labelled.responses.delete(made.id)
        theirs = await labelled.responses.create(model=MODEL, input="label's own")
        with pytest.raises(openai.NotFoundError):
            await keyed.responses.retrieve(theirs.id)
        assert (await labelled.responses.retrieve(theirs.id)).id == theirs.id
        assert (await keyed.responses.retrieve(made.id)).output_text == made.output_text


async def test_another_clients_flood_leaves_my_stored_responses(
    fake: FakeUpstream, policies: str
) -> None:
    settings = router_settings(fake, policies_dir=policies, responses={"store_entries": 100})
    async with run_router(settings) as r:
        alice, bob = r.client(api_key="alice-key"), r.client(api_key="bob-key")
        mine = await alice.responses.create(model=MODEL, input="remember this")
        for _ in range(150):
            await bob.responses.create(model=MODEL, input="x" * 2000)
        assert (await alice.responses.retrieve(mine.id)).id == mine.id
        follow = await alice.responses.create(
            model=MODEL, input="and then?", previous_response_id=mine.id
        )
    assert follow.previous_response_id == mine.id
    sent = fake.requests[-1].body["messages"]
    assert sent[0] == {"role": "user", "content": "remember this"}
