"""The prompt cache's disk tier through the router (slow, serial): after a restart of the
router, the next turn of a conversation is read from the cache, not prefilled again (the
lanes' files, and the partition tokens' key beside them, outlive the router)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME
from router.proxy.partition import KEY_FILE
from tests.realmodel import Router, start_router, stop_router
from tests.worker.engines.test_diskcache_real import FILE, SYSTEM

pytestmark = pytest.mark.realmodel


def turn(router: Router, messages: list[dict[str, str]]) -> tuple[str, int, int]:
    """One short greedy turn: the answer, the prompt's tokens and the cached ones."""
    reply = router.client().chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=4,
        temperature=0,
    )
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return (
        reply.choices[0].message.content or "",
        usage.prompt_tokens,
        usage.prompt_tokens_details.cached_tokens or 0,
    )


def test_after_a_router_restart_the_next_turn_is_read_from_the_cache(tmp_path: Path) -> None:
    first = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"module_7.py:\n{FILE}\nWhich rule covers it?"},
    ]
    router = start_router(tmp_path)
    try:
        answer, prompt, cached = turn(router, first)
        assert prompt >= 1000 and cached == 0
    finally:
        stop_router(router)
    key = tmp_path / "prompt-cache" / KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    router = start_router(tmp_path)  # the same configuration: the same directory
    try:
        following = [
            *first,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And module_8.py?"},
        ]
        _, prompt, cached = turn(router, following)
        assert cached >= 0.8 * prompt
    finally:
        stop_router(router)
