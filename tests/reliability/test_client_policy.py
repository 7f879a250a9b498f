"""Hostile clients against the policy side: keys, labels, probes, credentials that are no
text, duplicate JSON keys, and policy files caught while being written.

Each test plays the misbehaving party exactly: a client that names a key-less policy in
``X-Speclane-Client`` or fakes its user agent on a router whose default requires a key; a
prober comparing answers for existing and unknown names; raw ``Authorization`` bytes that
are not UTF-8; a body with a repeated key; an editor that truncates a policy file in place
and pauses before writing it back; a writer that trickles a file line by line; a process
that has run out of file descriptors while the watcher polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import resource
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from router.config.policies import load_policies
from router.metrics import Metrics
from router.proxy.policy_watch import PolicyWatcher, ReloadResult
from tests.conftest import fake_upstreams, router_settings
from tests.fakes.upstream import FakeUpstream
from tests.reliability.harness import (
    TALLY,
    RawResponse,
    RawUpstream,
    Served,
    assert_openai_error,
    chat_body,
    http_request,
    raw_http,
    serve_app,
)

HOUSE_KEY = "sk-house-0123456789"
ALICE_KEY = "sk-alice-0123456789"
ADMIN_KEY = "admin-0123456789abcdef"
CLOSED_DEFAULT = f'require_api_key = true\n[match]\napi_keys = ["{HOUSE_KEY}"]\n'
OPEN_DEFAULT = "require_api_key = false\n"
OPEN_AGENT = 'priority = 5\n[match]\nclient_header = ["agent"]\nuser_agent = ["^agent-cli/"]\n'
ALICE = (
    f'require_api_key = true\n[match]\napi_keys = ["{ALICE_KEY}"]\n'
    'client_header = ["alice"]\nuser_agent = ["^alice-tool/"]\n'
)


@contextlib.asynccontextmanager
async def router(
    directory: Path, files: dict[str, str], **overrides: Any
) -> AsyncIterator[tuple[Served, FakeUpstream]]:
    for name, text in files.items():
        (directory / name).write_text(text)
    async with fake_upstreams("fake") as (fake,):
        overrides = {"policy_poll_interval": 3600, "policy_settle_seconds": 0, **overrides}
        settings = router_settings(fake, policies_dir=str(directory), **overrides)
        async with serve_app(settings) as served:
            yield served, fake


async def ask(
    s: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with s.post(url, json=chat_body(), headers=headers) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


def comparable(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k not in ("Date", "Content-Length")}


# --- the key rule -------------------------------------------------------------------------------

LABELS = [
    {"X-Speclane-Client": "agent"},  # a key-less policy, by header
    {"User-Agent": "agent-cli/1.0"},  # the same policy, by user agent
    {"X-Speclane-Client": "alice"},  # a key-required policy, by header
    {"User-Agent": "alice-tool/2"},
    {"X-Speclane-Client": "nobody"},  # unknown
    {},
]


async def test_a_key_required_default_closes_the_router_to_every_label(tmp_path: Path) -> None:
    files = {"default.toml": CLOSED_DEFAULT, "agent.toml": OPEN_AGENT, "alice.toml": ALICE}
    async with router(tmp_path, files) as (r, fake), aiohttp.ClientSession() as s:
        url = f"{r.base_url}/chat/completions"
        for labels in LABELS:
            for key in (None, "sk-guess"):
                auth = {"Authorization": f"Bearer {key}"} if key else {}
                status, body, headers = await ask(s, url, {**labels, **auth})
                assert status == 401, (labels, key, body)
                assert assert_openai_error(body)["code"] == (
                    "invalid_api_key" if key else "missing_api_key"
                )
                assert headers["X-Speclane-Client"] == "default"
                TALLY.fault("keyless_label_refused")
        # The official client, as an agent would configure it (it always sends some key).
        for labels in LABELS[:2]:
            client = openai.AsyncOpenAI(
                base_url=r.base_url, api_key="not-a-key", max_retries=0, default_headers=labels
            )
            try:
                with pytest.raises(openai.AuthenticationError):
                    await client.chat.completions.create(
                        model="fake-model", messages=[{"role": "user", "content": "hi"}]
                    )
            finally:
                await client.close()
        assert not fake.requests  # nothing reached the backend
        # Every valid key still works, whatever label comes with it.
        for key, client in ((HOUSE_KEY, "default"), (ALICE_KEY, "alice")):
            status, _, headers = await ask(
                s, url, {"Authorization": f"Bearer {key}", "X-Speclane-Client": "agent"}
            )
            assert (status, headers["X-Speclane-Client"]) == (200, client)


@pytest.mark.parametrize("default", [CLOSED_DEFAULT, OPEN_DEFAULT])
async def test_probes_cannot_tell_key_required_names_from_unknown_ones(
    tmp_path: Path, default: str
) -> None:
    files = {"default.toml": default, "agent.toml": OPEN_AGENT, "alice.toml": ALICE}
    async with router(tmp_path, files) as (r, _), aiohttp.ClientSession() as s:
        url = f"{r.base_url}/chat/completions"
        for auth in ({}, {"Authorization": "Bearer sk-guess"}):
            for existing, unknown in (
                (("X-Speclane-Client", "alice"), ("X-Speclane-Client", "zz-unknown")),
                (("User-Agent", "alice-tool/2"), ("User-Agent", "unknown-tool/2")),
            ):
                a = await ask(s, url, {existing[0]: existing[1], **auth})
                b = await ask(s, url, {unknown[0]: unknown[1], **auth})
                assert a[0] == b[0], (a, b)
                if a[0] != 200:  # answers carry an id that differs; errors must not
                    assert a[1] == b[1]
                assert comparable(a[2]).keys() == comparable(b[2]).keys()
                assert a[2]["X-Speclane-Client"] == b[2]["X-Speclane-Client"] == "default"
                TALLY.fault("client_name_probe")


async def test_a_bearer_value_that_is_not_utf8_is_401_everywhere(tmp_path: Path) -> None:
    files = {"default.toml": OPEN_DEFAULT, "alice.toml": ALICE}
    async with router(tmp_path, files, admin_key=ADMIN_KEY) as (r, fake):
        body = orjson.dumps(chat_body())
        for value in (
            b"Bearer \xff\xfe\xfd",
            b"Bearer sk-\x80abc",
            b"bearer \xc3\x28",
            b"Bearer " + ALICE_KEY.encode() + b"\xff",
        ):
            for method, path, data in (
                ("POST", "/v1/chat/completions", body),
                ("GET", "/v1/models", b""),
                ("GET", "/admin/lanes", b""),
                ("POST", "/admin/reload", b""),
            ):
                resp = await araw(
                    r.port, http_request(method, path, data, [(b"Authorization", value)])
                )
                assert resp.status == 401, (value, path, resp.status, resp.body[:300])
                assert_openai_error(orjson.loads(resp.body))
                TALLY.fault("bearer_not_utf8")
        assert not fake.requests


async def test_duplicate_keys_reach_the_backend_as_validated(tmp_path: Path) -> None:
    seen: list[bytes] = []
    answer = orjson.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
        }
    )

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes
    ) -> None:
        seen.append(body)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer)
        )
        await writer.drain()

    upstream = RawUpstream(script)
    await upstream.start()
    (tmp_path / "default.toml").write_text("[caps]\nmax_tokens = 100\n")
    settings = router_settings(
        policies_dir=str(tmp_path),
        backends=[{"name": "raw", "base_url": upstream.base_url, "read_timeout": 5}],
    )
    try:
        async with serve_app(settings) as r:
            for raw in (
                # the cap sees 10, a first-wins parser would have seen 1000000
                b'{"model":"fake-model","max_tokens":1000000,"messages":[{"role":"user",'
                b'"content":"hi"}],"max_tokens":10}',
                # the cap sees 1000000 (clamped to 100); a last-wins parser saw 10 anyway
                b'{"model":"fake-model","max_tokens":10,"messages":[{"role":"user",'
                b'"content":"hi"}],"max_tokens":1000000}',
                # both names of the limit, one of them over the cap
                b'{"model":"fake-model","max_completion_tokens":5,"max_tokens":1000000,'
                b'"messages":[{"role":"user","content":"hi"}]}',
                # repeated keys deeper down, and a repeated model
                b'{"model":"nope","messages":[{"role":"user","content":"a","content":"b"}],'
                b'"model":"fake-model","stream":true,"stream":false}',
            ):
                resp = await araw(r.port, http_request("POST", "/v1/chat/completions", raw))
                assert resp.status == 200, resp.body[:300]
                forwarded = seen[-1]
                parsed = orjson.loads(forwarded)
                for key in ("max_tokens", '"content"', '"model"', '"stream"'):
                    assert forwarded.count(key.encode()) <= 1, forwarded
                assert parsed.get("max_tokens", 0) <= 100
                assert parsed.get("max_completion_tokens", 0) <= 100
                assert parsed["model"] == "fake-model"
                TALLY.fault("duplicate_json_keys")
    finally:
        await upstream.stop()


# --- policy files caught while being written ------------------------------------------------------


async def araw(port: int, request: bytes) -> RawResponse:
    """``raw_http`` off the event loop (the router under test runs on this loop)."""
    return await asyncio.to_thread(raw_http, port, request)


async def keyless_refused(r: Served) -> bool:
    resp = await araw(
        r.port, http_request("POST", "/v1/chat/completions", orjson.dumps(chat_body()))
    )
    return resp.status == 401


async def keyed_served(r: Served) -> bool:
    resp = await araw(
        r.port,
        http_request(
            "POST",
            "/v1/chat/completions",
            orjson.dumps(chat_body()),
            [(b"Authorization", f"Bearer {HOUSE_KEY}".encode())],
        ),
    )
    return resp.status == 200


async def test_a_policy_file_truncated_and_rewritten_in_place_never_opens_the_router(
    tmp_path: Path,
) -> None:
    """``cp`` / an editor: truncate, (pause), write. Polls land in every phase."""
    new_text = "# rewritten: the same default, one more line\npriority = 1\n" + CLOSED_DEFAULT
    async with router(tmp_path, {"default.toml": CLOSED_DEFAULT}) as (r, _):
        watcher = r.services.policies
        results: list[ReloadResult] = []
        path = tmp_path / "default.toml"
        with path.open("r+b") as f:
            f.truncate(0)  # empty: valid TOML, and the permissive default
            f.flush()
            for _ in range(4):  # stable across polls: it would be taken if it did not widen
                result = watcher.check()
                if result is not None:
                    results.append(result)
                assert watcher.current.default.require_api_key
                assert await keyless_refused(r) and await keyed_served(r)
            # Half of the new text: still valid TOML, still without the key lines.
            half = new_text.encode()[: new_text.index("require_api_key")]
            f.write(half)
            f.flush()
            for _ in range(3):
                if (result := watcher.check()) is not None:
                    results.append(result)
                assert await keyless_refused(r) and await keyed_served(r)
            f.write(new_text.encode()[len(half) :])
        for _ in range(2):  # the complete file: stable, and it narrows nothing
            if (result := watcher.check()) is not None:
                results.append(result)
        assert results and results[-1].ok, results
        assert watcher.current.default.priority == 1
        assert any(res.held for res in results)  # the open parse was seen, and held
        assert all(res.policies.default.require_api_key for res in results)
        assert await keyless_refused(r) and await keyed_served(r)
        TALLY.fault("policy_truncated_in_place")


async def test_a_slow_writer_is_never_loaded_half_way(tmp_path: Path) -> None:
    """A writer that adds one line between two polls: the set never settles until it is
    whole, so nothing half written is taken; then the whole file is."""
    lines = [
        "priority = 3\n",
        "max_concurrency = 2\n",
        "[caps]\n",
        "max_tokens = 64\n",
        "[match]\n",
        'client_header = ["slow"]\n',
    ]
    (tmp_path / "default.toml").write_text(OPEN_DEFAULT)
    watcher = PolicyWatcher(tmp_path, load_policies(tmp_path), metrics=Metrics())
    path = tmp_path / "slow.toml"
    with path.open("w") as f:
        for line in lines:
            f.write(line)
            f.flush()
            assert watcher.check() is None  # changed since the last poll: not taken
            assert watcher.current.get("slow") is None
    # The last line was written after the last poll: one more poll sees it unchanged.
    result = watcher.check()
    assert result is not None and result.ok
    slow = watcher.current.get("slow")
    assert slow is not None and (slow.priority, slow.max_concurrency, slow.caps.max_tokens) == (
        3,
        2,
        64,
    )
    TALLY.fault("policy_slow_writer")


async def test_an_atomic_rename_is_taken(tmp_path: Path) -> None:
    (tmp_path / "default.toml").write_text(CLOSED_DEFAULT)
    watcher = PolicyWatcher(tmp_path, load_policies(tmp_path))
    tmp = tmp_path / ".default.toml.tmp"  # not *.toml: never read half written
    tmp.write_text("priority = 4\n" + CLOSED_DEFAULT)
    os.replace(tmp, tmp_path / "default.toml")
    results = [watcher.check(), watcher.check()]
    assert results[0] is None and results[1] is not None and results[1].ok
    assert watcher.current.default.priority == 4


async def test_widening_applies_only_when_asked(tmp_path: Path) -> None:
    """Opening the router on purpose: held by the poller, applied by an explicit reload."""
    (tmp_path / "default.toml").write_text(CLOSED_DEFAULT)
    metrics = Metrics()
    watcher = PolicyWatcher(tmp_path, load_policies(tmp_path), metrics=metrics)
    (tmp_path / "default.toml").write_text(OPEN_DEFAULT)
    assert watcher.check() is None
    held = watcher.check()
    assert held is not None and held.held and not held.ok
    assert "without an API key" in (held.error or "")
    assert watcher.current.default.require_api_key
    assert watcher.check() is None  # held once, not re-logged at every poll
    applied = await watcher.reload("sighup")
    assert applied.ok and not watcher.current.default.require_api_key
    assert (
        metrics.registry.get_sample_value("speclane_policy_reloads_total", {"result": "held"}) == 1
    )


# --- the watcher keeps watching -----------------------------------------------------------------


@contextlib.contextmanager
def out_of_file_descriptors() -> Iterator[None]:
    """Make this process hit EMFILE for real: lower the soft limit, then fill it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 64
    held: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 16, hard))
    try:
        with contextlib.suppress(OSError):
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_the_watcher_survives_running_out_of_file_descriptors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "default.toml").write_text("priority = 0\n")
    metrics = Metrics()
    watcher = PolicyWatcher(tmp_path, load_policies(tmp_path), metrics=metrics, interval=0.01)
    poller = watcher.poller().start()
    try:
        with out_of_file_descriptors():
            failed = await asyncio.wait_for(watcher.wait_reload(0), 10)
            after = watcher.attempts
            await asyncio.wait_for(watcher.wait_reload(after), 10)  # it polls on
        assert not failed.ok and "Too many open files" in (failed.error or "")
        errors = metrics.registry.get_sample_value(
            "speclane_policy_reloads_total", {"result": "error"}
        )
        assert errors is not None and errors >= 2
        assert "Too many open files" in caplog.text
        # Logged once, not at every failing poll.
        assert caplog.text.count("Too many open files") == 1
        assert not poller.done()
        # Descriptors are back: hot reload works again.
        (tmp_path / "default.toml").write_text("priority = 6\n")
        while watcher.current.default.priority != 6:
            await asyncio.wait_for(watcher.wait_reload(watcher.attempts), 10)
        TALLY.fault("policy_watch_emfile")
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller


# --- files rewritten in place under traffic ---------------------------------------------------

REWRITES = 12
CLIENTS = 6


def keyed_file(key: str, revision: int, extra: str = "") -> bytes:
    """A key-required policy whose key comes last: every cut before the key line that still
    parses (and most do) is a policy that refuses its own key."""
    return (
        f"# revision {revision}\nrequire_api_key = true\npriority = {revision % 7}\n"
        f'max_concurrency = 64\n[match]\n{extra}api_keys = ["{key}"]\n'
    ).encode()


async def in_force(watcher: PolicyWatcher, name: str, revision: int) -> None:
    client = "default" if name == "default.toml" else "alice"
    while (policy := watcher.current.get(client)) is None or policy.priority != revision % 7:
        await asyncio.wait_for(watcher.wait_reload(watcher.attempts), 30)


async def test_files_rewritten_in_place_under_traffic_refuse_no_valid_request(
    tmp_path: Path,
) -> None:
    """truncate, write part, pause 50-400 ms, write the rest, while clients with valid keys
    send requests and reloads come from every side (the poller every 20 ms, SIGHUP-style
    and admin reloads during the pauses): not one valid request is refused, and the last
    revision is the one in force."""
    from router.config.settings import Settings

    settle = Settings.model_fields["policy_settle_seconds"].default
    assert settle > 0.4  # longer than the longest pause a writer makes
    alice_extra = 'client_header = ["alice"]\n'
    files = {
        "default.toml": keyed_file(HOUSE_KEY, 0).decode(),
        "alice.toml": keyed_file(ALICE_KEY, 0, alice_extra).decode(),
    }
    rng = random.Random(24)
    statuses: dict[int, int] = {}
    done = asyncio.Event()
    async with router(tmp_path, files, policy_poll_interval=0.02, policy_settle_seconds=settle) as (
        r,
        _,
    ):
        watcher = r.services.policies
        poller = watcher.poller().start()

        async def client(key: str) -> None:
            async with aiohttp.ClientSession() as s:
                while not done.is_set():
                    async with s.post(
                        f"{r.base_url}/chat/completions",
                        json=chat_body(),
                        headers={"Authorization": f"Bearer {key}"},
                    ) as resp:
                        await resp.read()
                        statuses[resp.status] = statuses.get(resp.status, 0) + 1

        async def admin_reload() -> int:
            async with aiohttp.ClientSession() as s, s.post(f"{r.url}/admin/reload") as resp:
                return resp.status

        traffic = [
            asyncio.create_task(client(HOUSE_KEY if i % 2 else ALICE_KEY)) for i in range(CLIENTS)
        ]
        explicit: list[asyncio.Task[Any]] = []
        try:
            for revision in range(1, REWRITES + 1):
                name = rng.choice(sorted(files))
                text = keyed_file(
                    HOUSE_KEY if name == "default.toml" else ALICE_KEY,
                    revision,
                    alice_extra if name == "alice.toml" else "",
                )
                cut = rng.randrange(1, len(text))
                with (tmp_path / name).open("r+b") as f:
                    f.truncate(0)
                    f.write(text[:cut])
                    f.flush()
                    if revision % 3 == 0:
                        explicit.append(asyncio.create_task(watcher.reload("sighup")))
                    elif revision % 3 == 1:
                        explicit.append(asyncio.create_task(admin_reload()))
                    await asyncio.sleep(rng.uniform(0.05, 0.4))  # the writer's pause
                    f.write(text[cut:])
                if revision % 4 == 0:  # now and then the files rest: the revision is taken
                    await in_force(watcher, name, revision)
            await in_force(watcher, name, revision)
            results = await asyncio.wait_for(asyncio.gather(*explicit), 60)
        finally:
            done.set()
            await asyncio.gather(*traffic)
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
    assert set(statuses) == {200}, statuses  # not one 401
    assert sum(statuses.values()) >= 50, statuses
    assert all(res == 200 or getattr(res, "ok", False) for res in results), results
    TALLY.fault("policy_rewritten_under_traffic", REWRITES)
