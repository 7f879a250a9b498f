"""The worker's HTTP side: /health, /v1/models, /v1/chat/completions, /v1/completions.

Handlers never wait on the generation thread except through their job's event queue, so
/health answers while a batch is decoding. Tokenizing runs on a one-thread executor: off the
event loop, and never two encodes at once on the shared tokenizer.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from router.errors import RouterError, bad_request, not_found, render, sse_error_event
from router.worker.engine import Engine
from router.worker.jobs import Failed, Finished, Job, TextDelta
from router.worker.protocol import GenerationRequest, Kind, parse_request
from router.worker.shapes import Answer


@dataclass(frozen=True)
class WorkerInfo:
    mode: str
    model_name: str
    draft_name: str | None
    num_draft_tokens: int  # 0 when the lane does not speculate
    context_length: int | None = None
    draft_source: str | None = None  # the speculative lane's source without a prediction


ENGINE = web.AppKey("engine", Engine)
INFO = web.AppKey("info", WorkerInfo)
TOKENIZE = web.AppKey("tokenize", ThreadPoolExecutor)


def make_app(engine: Engine, info: WorkerInfo) -> web.Application:
    app = web.Application(middlewares=[error_middleware])
    app[ENGINE] = engine
    app[INFO] = info
    app.cleanup_ctx.append(_tokenize_pool)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    return app


async def _tokenize_pool(app: web.Application) -> AsyncIterator[None]:
    app[TOKENIZE] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
    yield
    app[TOKENIZE].shutdown(wait=False, cancel_futures=True)


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except RouterError as err:
        return _error_response(err)
    except web.HTTPException:
        raise
    except Exception as e:  # the worker's own bug: still an OpenAI-shaped answer
        return _error_response(RouterError(500, f"internal error: {e}", type="server_error"))


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``app``; returns the runner (for cleanup) and the bound port.

    ``handler_cancellation`` makes a client disconnect cancel its handler at once, so the
    handler's ``finally`` cancels the job before the next decoding step.
    """
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, runner.addresses[0][1]


def _error_response(err: RouterError) -> web.Response:
    status, body, headers = render(err)
    return web.Response(status=status, body=body, headers=headers)


async def health(request: web.Request) -> web.Response:
    engine, info = request.app[ENGINE], request.app[INFO]
    return _json(
        {
            "status": "ok",
            "mode": info.mode,
            "model": info.model_name,
            "draft_model": info.draft_name,
            "speculative": info.num_draft_tokens > 0,
            "num_draft_tokens": info.num_draft_tokens,
            "draft_source": info.draft_source,
            "active": engine.active,
            "queued": engine.queued,
            "capacity": engine.capacity,
            "pid": os.getpid(),
        }
    )


async def models(request: web.Request) -> web.Response:
    info = request.app[INFO]
    entry = {"id": info.model_name, "object": "model", "created": 0, "owned_by": "speclane"}
    return _json({"object": "list", "data": [entry]})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def _generate(request: web.Request, kind: Kind) -> web.StreamResponse:
    engine, info = request.app[ENGINE], request.app[INFO]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        raise bad_request(f"invalid JSON body: {e}") from e
    generation = parse_request(body, kind)
    if generation.model is not None and generation.model != info.model_name:
        raise not_found(
            f"model '{generation.model}' is not served here", param="model", code="model_not_found"
        )
    tokenizer = engine.models.tokenizer if engine.models else None
    loop = asyncio.get_running_loop()
    prompt_ids = await loop.run_in_executor(request.app[TOKENIZE], encode, tokenizer, generation)
    if info.context_length and len(prompt_ids) >= info.context_length:
        raise bad_request(
            f"the prompt has {len(prompt_ids)} tokens; the context is {info.context_length}",
            code="context_length_exceeded",
        )
    job = Job(generation, prompt_ids, loop)
    if generation.prediction:
        job.prediction_ids = await loop.run_in_executor(
            request.app[TOKENIZE], encode_prediction, tokenizer, generation.prediction
        )
    engine.submit(job)
    answer = Answer(kind, info.model_name)
    try:
        if generation.stream:
            return await _stream(request, job, answer)
        return await _collect(job, answer)
    finally:
        engine.cancel(job)  # a no-op once answered; otherwise the client left or we failed


def encode(tokenizer: Any, generation: GenerationRequest) -> list[int]:
    if generation.kind == "chat":
        try:
            text = tokenizer.apply_chat_template(
                generation.chat_dicts(), tokenize=False, add_generation_prompt=True
            )
        except Exception as e:  # a template may reject roles or orderings
            message = f"the chat template rejected the messages: {e}"
            raise bad_request(message, param="messages") from e
        ids = tokenizer.encode(text, add_special_tokens=False)
    elif isinstance(generation.prompt, str):
        ids = tokenizer.encode(generation.prompt)
    else:
        ids = list(generation.prompt)
        if max(ids) >= len(tokenizer):
            raise bad_request("'prompt' holds a token id outside the vocabulary", param="prompt")
    if not ids:
        raise bad_request("the prompt is empty after tokenization", param="prompt")
    return list(ids)


def encode_prediction(tokenizer: Any, text: str) -> list[int]:
    """The prediction as the answer's tokens would spell it (no BOS: it is not a prompt)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


async def _collect(job: Job, answer: Answer) -> web.Response:
    parts: list[str] = []
    while True:
        event = await job.events.get()
        if isinstance(event, TextDelta):
            parts.append(event.text)
        elif isinstance(event, Finished):
            return _json(answer.body("".join(parts), event.finish_reason, event.usage))
        else:
            raise event.error


async def _stream(request: web.Request, job: Job, answer: Answer) -> web.StreamResponse:
    first = await job.events.get()  # errors before the first token are still plain HTTP errors
    if isinstance(first, Failed):
        raise first.error
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    if answer.kind == "chat":
        await _send(response, answer.chunk("", role=True))
    event = first
    while True:
        if isinstance(event, TextDelta):
            await _send(response, answer.chunk(event.text))
        elif isinstance(event, Finished):
            await _send(response, answer.final_chunk(event.finish_reason, event.usage))
            if job.request.include_usage:
                await _send(response, answer.usage_chunk(event.usage))
            await response.write(b"data: [DONE]\n\n")
            break
        else:
            await response.write(sse_error_event(event.error))
            break
        event = await job.events.get()
    await response.write_eof()
    return response


async def _send(response: web.StreamResponse, chunk: dict[str, object]) -> None:
    await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")


def _json(body: dict[str, object], status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")
