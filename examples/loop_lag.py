"""How long a running speclane leaves /healthz unanswered while it takes heavy requests.

    python examples/loop_lag.py --url http://127.0.0.1:8080 --model MODEL [--key KEY]

Sends, one at a time, requests whose translation is heavy (a Responses follow-up replaying a
long stored conversation of developer messages, an Anthropic request with 16
``context_management`` edits over a long tool history, and one with 2,000, which is refused
now, an Ollama chat with a wide body), and
meanwhile asks ``/healthz`` every 10 ms. Prints, per request, its status and time, and the
slowest ``/healthz`` answer during it, next to the slowest during a small request. A router
whose loop is free answers /healthz in milliseconds throughout (docs/security.md, "The event
loop"). The requests generate a few tokens (``max_tokens`` 1): point it at a test router.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import aiohttp


async def healthz_while(session: aiohttp.ClientSession, url: str, work: Any) -> tuple[Any, float]:
    """``work``'s result and the slowest /healthz answer while it ran."""
    slowest = 0.0
    done = asyncio.Event()

    async def probe() -> None:
        nonlocal slowest
        while not done.is_set():
            start = time.monotonic()
            async with session.get(f"{url}/healthz") as resp:
                await resp.read()
            slowest = max(slowest, time.monotonic() - start)
            await asyncio.sleep(0.01)

    task = asyncio.create_task(probe())
    try:
        return await work, slowest
    finally:
        done.set()
        await task


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, dict[str, Any] | None, float]:
    start = time.monotonic()
    async with session.post(url, json=body, headers=headers) as resp:
        answer = None
        if resp.content_type == "application/json":
            answer = await resp.json()
        else:
            await resp.read()
        return resp.status, answer, time.monotonic() - start


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--model", required=True)
    parser.add_argument("--key", default="")
    parser.add_argument("--messages", type=int, default=4000, help="stored conversation size")
    args = parser.parse_args()
    url, model = args.url.rstrip("/"), args.model
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        small = {"model": model, "input": "hi", "max_output_tokens": 1}
        (status, _, took), slowest = await healthz_while(
            session, url, post(session, f"{url}/v1/responses", small, headers)
        )
        print(f"small request: {status} in {took:.2f}s, /healthz at most {slowest * 1000:.0f} ms")

        long = {
            "model": model,
            "max_output_tokens": 1,
            "input": [
                {"type": "message", "role": "developer", "content": f"{n} " + "r" * 1900}
                for n in range(args.messages)
            ],
        }
        status, stored, _ = await post(session, f"{url}/v1/responses", long, headers)
        if status != 200 or stored is None:
            raise SystemExit(f"storing the conversation failed: {status} {stored}")
        follow = {
            "model": model,
            "previous_response_id": stored["id"],
            "input": "and then?",
            "max_output_tokens": 1,
        }
        tools: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for n in range(400):
            tools.append(
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": f"t{n}", "name": "Read", "input": {}}],
                }
            )
            tools.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": f"t{n}", "content": "x" * 4000}
                    ],
                }
            )
        edit = {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "tool_uses", "value": 0},
            "clear_at_least": {"type": "input_tokens", "value": 10**9},
        }
        anthropic = {
            "model": model,
            "max_tokens": 1,
            "messages": tools,
            "context_management": {"edits": [edit] * 16},
        }
        wide = {
            "model": model,
            "stream": False,
            "options": {"num_predict": 1},
            "messages": [{"role": "user", "content": "hi"}] * 50_000,
        }
        flood = {**anthropic, "context_management": {"edits": [edit] * 2000}}  # a 400 now
        cases = [
            ("Responses follow-up on a long conversation", "/v1/responses", follow),
            ("Anthropic, 16 edits over 1.6 MB of tool results", "/v1/messages", anthropic),
            ("Anthropic, 2,000 edits over 1.6 MB of tool results", "/v1/messages", flood),
            ("Ollama chat of 50,000 messages", "/api/chat", wide),
        ]
        for name, path, body in cases:
            (status, _, took), slowest = await healthz_while(
                session, url, post(session, url + path, body, headers)
            )
            print(f"{name}: {status} in {took:.2f}s, /healthz at most {slowest * 1000:.0f} ms")


if __name__ == "__main__":
    asyncio.run(main())
