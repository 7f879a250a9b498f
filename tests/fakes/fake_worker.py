"""A spawnable fake lane worker that speaks the router.worker contract without MLX.

    python tests/fakes/fake_worker.py --port 0 [--slow-start S] [--exit-early CODE]
        [--ignore-sigterm] [--hang-health-after N] [--stall-after N] [--die-after S]
        [--parent-pid PID]

It accepts the real worker's flags too (--mode, --model, --draft-model, ...), prints the
ready line on stdout once listening, logs to stderr, answers GET /health, GET /v1/models
and a trivial POST /v1/chat/completions. Like the real worker it answers only requests that
carry the worker secret when the supervisor set one (``WORKER_SECRET_ENV``), and counts the
requests it refused (``refused`` in /health, asked with the secret). Standalone on purpose:
it imports nothing from ``router`` but the contract, so it behaves like a foreign process.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import signal
import sys
import time

from aiohttp import web

from router.kernel.worker_contract import (
    STREAM_USAGE_FIELD,
    WORKER_SECRET_ENV,
    WORKER_SECRET_HEADER,
    add_worker_flags,
    ready_line,
    secret_matches,
)

PR_SET_PDEATHSIG = 1


def log(message: str) -> None:
    print(f"fake worker[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def wait_for_file(path: str) -> None:
    """Return once ``path`` exists (--start-when: the test creates it to let the load end)."""
    while not os.path.exists(path):
        time.sleep(0.02)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    add_worker_flags(p, required=False)  # the real worker's flags, defaulted for tests
    p.set_defaults(mode="speculative", model="fake-model")
    p.add_argument("--slow-start", type=float, default=0.0, help="seconds before listening")
    p.add_argument("--exit-early", type=int, help="exit with this code before becoming ready")
    p.add_argument(
        "--start-when", help="listen only once this file exists (a test's gate on the load)"
    )
    p.add_argument("--noise-lines", type=int, default=0, help="stderr lines printed at start")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--hang-health-after", type=int, help="/health never answers after N answers")
    p.add_argument(
        "--stall-after",
        type=int,
        help="after N /health answers, report a request active whose progress never moves",
    )
    p.add_argument("--die-after", type=float, help="exit with --die-code this long after ready")
    p.add_argument("--die-code", type=int, default=3)
    p.add_argument(
        "--close-pipes-first",
        action="store_true",
        help="with --die-after: close stdout/stderr a moment before exiting",
    )
    args = p.parse_args(argv)
    if args.model_name is None:
        args.model_name = os.path.basename(args.model.rstrip("/")) or "fake-model"
    return args


class FakeWorker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.health_answers = 0
        self.active = 0
        self.refused = 0
        self.secret = os.environ.pop(WORKER_SECRET_ENV, None) or None

    @web.middleware
    async def check_secret(self, request: web.Request, handler: object) -> web.StreamResponse:
        presented = request.headers.get(WORKER_SECRET_HEADER)
        if self.secret is not None and not secret_matches(presented, self.secret):
            self.refused += 1
            return web.json_response({"error": {"message": "no secret"}}, status=401)
        return await handler(request)  # type: ignore[operator]

    @property
    def stalled(self) -> bool:
        limit = self.args.stall_after
        return limit is not None and self.health_answers >= limit

    def health(self) -> dict[str, object]:
        speculative = self.args.mode == "speculative" and self.args.draft_model is not None
        return {
            "status": "ok",
            "mode": self.args.mode,
            "model": self.args.model_name,
            "draft_model": self.args.draft_model,
            "speculative": speculative,
            "num_draft_tokens": self.args.num_draft_tokens if speculative else 0,
            "active": self.active or int(self.stalled),
            "queued": 0,
            "progress_tokens": self.health_answers if not self.stalled else 7,
            "capacity": 1 if self.args.mode == "speculative" else self.args.max_batch_size,
            "pid": os.getpid(),
            "refused": self.refused,
        }

    async def handle_health(self, request: web.Request) -> web.Response:
        limit = self.args.hang_health_after
        if limit is not None and self.health_answers >= limit:
            await asyncio.Event().wait()  # hung: never answers
        self.health_answers += 1
        return web.json_response(self.health())

    async def handle_models(self, request: web.Request) -> web.Response:
        model = {"id": self.args.model_name, "object": "model", "owned_by": "speclane"}
        return web.json_response({"object": "list", "data": [model]})

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        text = "ok"
        usage = {
            "prompt_tokens": 1,
            "completion_tokens": 1,
            "total_tokens": 2,
            "speclane_spec": {
                "drafted": 0,
                "accepted": 0,
                "rejected": 0,
                "steps": 0,
                "num_draft_tokens": 0,
            },
        }
        base = {
            "id": "chatcmpl-fake",
            "created": int(time.time()),
            "model": body.get("model", self.args.model_name),
        }
        if not body.get("stream"):
            message = {"role": "assistant", "content": text}
            return web.json_response(
                {
                    **base,
                    "object": "chat.completion",
                    "usage": usage,
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunks = [
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": text},
                        "finish_reason": None,
                    }
                ]
            },
            # The usage on the last chunk as the contract says: the include_usage chunk, or
            # (asked for none) the finish chunk's STREAM_USAGE_FIELD.
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ]
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({"choices": [], "usage": usage})
        else:
            chunks[-1][STREAM_USAGE_FIELD] = usage
        for chunk in chunks:
            payload = {**base, "object": "chat.completion.chunk", **chunk}
            await resp.write(f"data: {json.dumps(payload)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def watch_parent(parent_pid: int) -> None:
    """Exit when the parent disappears: PDEATHSIG on Linux, plus a poll everywhere."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    loop = asyncio.get_running_loop()

    def check() -> None:
        if os.getppid() != parent_pid:
            log(f"parent {parent_pid} is gone; exiting")
            os._exit(0)  # also when SIGTERM is ignored
        loop.call_later(0.1, check)

    check()  # the parent may have died before prctl took effect


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if args.parent_pid is not None:
        watch_parent(args.parent_pid)

    for i in range(args.noise_lines):
        log(f"loading shard {i}")
    log(f"loading model {args.model}")
    if args.slow_start:
        await asyncio.sleep(args.slow_start)
    if args.start_when is not None:
        await asyncio.to_thread(wait_for_file, args.start_when)
    if args.exit_early is not None:
        log(f"cannot load model {args.model}: fake failure (exit {args.exit_early})")
        sys.exit(args.exit_early)

    worker = FakeWorker(args)
    app = web.Application(middlewares=[worker.check_secret])
    app.router.add_get("/health", worker.handle_health)
    app.router.add_get("/v1/models", worker.handle_models)
    app.router.add_post("/v1/chat/completions", worker.handle_chat)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(ready_line(port, mode=args.mode, model=args.model_name), end="", flush=True)
    log(f"listening on {args.host}:{port}")

    if args.die_after is not None:

        def die() -> None:
            log(f"dying with code {args.die_code}")
            if args.close_pipes_first:  # the supervisor sees EOF before the exit
                os.close(1)
                os.close(2)
                time.sleep(0.2)
            os._exit(args.die_code)

        loop.call_later(args.die_after, die)
    await stop.wait()
    log("stopping")
    # Hung /health handlers never finish; do not let them delay the exit.
    await asyncio.wait_for(runner.cleanup(), timeout=1.0)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        asyncio.run(serve(args))
    except TimeoutError:
        pass


if __name__ == "__main__":
    main()
