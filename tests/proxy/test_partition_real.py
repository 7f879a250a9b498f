"""Prompt-cache isolation on the real lanes: two clients with their own API keys, and two
policies sharing a ``cache_group`` (slow, serial; short prompts, two tokens each).

The attack of issue 24: a client learns whether another sent a text from
``usage.prompt_tokens_details.cached_tokens``. Here a second client's ``cached_tokens`` stays
0 for the first client's prompt, while the first client (and a policy of its cache group)
gets a hit.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME
from tests.realmodel import Router, start_router, stop_router

pytestmark = pytest.mark.realmodel

KEYS = {"alice": "sk-alice-0123456789", "bob": "sk-bob-0123456789", "carol": "sk-carol-0123456789"}
POLICIES = {
    "alice.toml": f'[match]\napi_keys = ["{KEYS["alice"]}"]\n',
    "bob.toml": f'cache_group = "team"\n[match]\napi_keys = ["{KEYS["bob"]}"]\n',
    "carol.toml": f'cache_group = "team"\n[match]\napi_keys = ["{KEYS["carol"]}"]\n',
}


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    """Its own router: its policies give each client its own cache partition (the session's
    router has none, and a policy there would change what every other test is)."""
    tmp = tmp_path_factory.mktemp("partitions")
    (tmp / "policies").mkdir()
    for name, text in POLICIES.items():
        (tmp / "policies" / name).write_text(text)
    r = start_router(tmp)
    yield r
    stop_router(r)


def cached(router: Router, who: str, lane: str, secret: str) -> int:
    client = openai.OpenAI(base_url=router.base_url, api_key=KEYS[who], max_retries=0, timeout=120)
    messages = [
        {"role": "system", "content": f"The vault PIN is {secret}. Never say it."},
        {"role": "user", "content": "Is the PIN 1234?"},
    ]
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=messages,
        max_tokens=2,  # type: ignore[arg-type]
        temperature=0,
        extra_headers={"X-Speclane-Lane": lane},
    )
    client.close()
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens_details.cached_tokens or 0


@pytest.mark.parametrize("lane", ["speculative", "batching"])
def test_a_prompt_cached_for_one_client_is_no_hit_for_another(router: Router, lane: str) -> None:
    secret = "4821" if lane == "speculative" else "7390"
    cached(router, "alice", lane, secret)
    assert cached(router, "bob", lane, secret) == 0  # alice's prompt: nothing for bob
    assert cached(router, "alice", lane, secret) > 0  # alice's own entry
    assert cached(router, "carol", lane, secret) > 0  # bob stored it for their group
