"""The worker's HTTP side: /health, /v1/models, /v1/chat/completions, /v1/completions,
/v1/tokenize (a prompt's token count under the chat template, tools included: Anthropic's
count_tokens).

Handlers never wait on the generation thread except through their job's event queue, so
/health answers while a batch is decoding. Tokenizing runs on one thread
(``router.worker.http.tokenizing``): off the event loop, never two encodes at once on the shared
tokenizer, and a generation request's preparation before any token count.

A request's prompt-cache partition comes in the ``X-Speclane-Cache-Partition`` header
(``router.worker_contract``); its job reuses cached KV state of that partition only.

With a worker secret (``router.worker_contract.WORKER_SECRET_ENV``) every endpoint, ``/health``
included, answers only requests carrying it (``WORKER_SECRET_HEADER``), compared in constant
time; anything else is a 401 before routing, parsing or the body is read: the router's
policies, queues and browser rules cannot be skipped by going to the lane's port.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from router import sse
from router.errors import RouterError, bad_request, not_found, render, sse_error_event
from router.worker.decoding.constrain import COMPILER
from router.worker.decoding.tools import (
    CallDelta,
    ParsedCall,
    Piece,
    ToolStream,
    ToolSyntax,
    chat_inputs,
    fallback_syntax,
    syntax_for,
)
from router.worker.engines.engine import Engine
from router.worker.engines.jobs import Event, Failed, Finished, Job, TextDelta
from router.worker.http.shapes import Answer
from router.worker.http.tokenizing import COUNT, GENERATION, TokenizerThread
from router.worker.request.protocol import GenerationRequest, Kind, parse_request, token_budget
from router.worker_contract import (
    CACHE_PARTITION_HEADER,
    CACHE_PARTITION_PATTERN,
    DEFAULT_MAX_BODY_BYTES,
    DRAFT_SOURCE_FIELD,
    SHARED_MODE,
    WORKER_SECRET_HEADER,
    lane_prefix,
    secret_matches,
)


@dataclass(frozen=True)
class WorkerInfo:
    mode: str
    model_name: str
    draft_name: str | None
    num_draft_tokens: int  # 0 when the lane does not speculate
    context_length: int | None = None
    draft_source: str | None = None  # the speculative lane's source without a prediction
    architecture: str | None = None  # the model's config model_type (Ollama's /api/show)


ENGINE = web.AppKey("engine", Engine)
INFO = web.AppKey("info", WorkerInfo)
TOKENIZE = web.AppKey("tokenize", TokenizerThread)
_PARTITION = re.compile(CACHE_PARTITION_PATTERN)


def make_app(
    engine: Engine,
    info: WorkerInfo,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    secret: str | None = None,
) -> web.Application:
    """``secret``: the worker secret every request must carry (None: anyone is answered)."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=_middlewares(secret))
    app.cleanup_ctx.append(_tokenize_pool)
    _lane_routes(app, engine, info)
    return app


def make_shared_app(
    lanes: Mapping[str, tuple[Engine, WorkerInfo]],
    figures: Callable[[], dict[str, object]],
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    secret: str | None = None,
) -> web.Application:
    """Shared mode: each lane's endpoints under its prefix (``contract.lane_prefix``), as a
    one-lane worker serves them at ``/``; ``/health`` at the root reports the process and every
    lane (``figures``: the process's own entries). One tokenize thread serves all lanes: they
    share one tokenizer. ``secret``: as ``make_app`` (the root's check covers the lanes)."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=_middlewares(secret))
    app.cleanup_ctx.append(_tokenize_pool)
    tokenizer = TokenizerThread()
    app[TOKENIZE] = tokenizer
    for lane, (engine, info) in lanes.items():
        sub = web.Application(client_max_size=max_body_bytes, middlewares=[error_middleware])
        sub[TOKENIZE] = tokenizer
        _lane_routes(sub, engine, info)
        app.add_subapp(lane_prefix(lane), sub)

    async def shared_health(request: web.Request) -> web.Response:
        body: dict[str, object] = {
            "status": "ok",
            "mode": SHARED_MODE,
            "pid": os.getpid(),
            **figures(),
        }
        body["lanes"] = {lane: lane_health(engine, info) for lane, (engine, info) in lanes.items()}
        return _json(body)

    app.router.add_get("/health", shared_health)
    return app


def _lane_routes(app: web.Application, engine: Engine, info: WorkerInfo) -> None:
    app[ENGINE] = engine
    app[INFO] = info
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/tokenize", tokenize)


async def _tokenize_pool(app: web.Application) -> AsyncIterator[None]:
    if TOKENIZE not in app:  # shared mode: set by make_shared_app for every lane
        app[TOKENIZE] = TokenizerThread()
    yield
    app[TOKENIZE].shutdown()


def _middlewares(secret: str | None) -> list[Any]:
    """The secret check first: a request without it gets nothing else of the worker."""
    return [error_middleware] if secret is None else [_secret_check(secret), error_middleware]


def _secret_check(secret: str) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if not secret_matches(request.headers.get(WORKER_SECRET_HEADER), secret):
            return _error_response(
                RouterError(
                    401,
                    "this lane worker answers only the router that started it",
                    type="authentication_error",
                    code="worker_secret_required",
                )
            )
        return await handler(request)

    return check


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except RouterError as err:
        return _error_response(err)
    except web.HTTPRequestEntityTooLarge as e:  # past --max-body-bytes: OpenAI-shaped too
        return _error_response(
            RouterError(
                413, f"request body is larger than the limit: {e.text}", code="body_too_large"
            )
        )
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
    return _json(lane_health(request.app[ENGINE], request.app[INFO]))


def lane_health(engine: Engine, info: WorkerInfo) -> dict[str, object]:
    return {
        "status": "ok",
        "mode": info.mode,
        "model": info.model_name,
        "draft_model": info.draft_name,
        "speculative": info.num_draft_tokens > 0,
        "num_draft_tokens": info.num_draft_tokens,
        "draft_source": info.draft_source,
        # what the router's model listings report (/v1/models, Anthropic's, Ollama's)
        "context_length": info.context_length,
        "architecture": info.architecture,
        "active": engine.active,
        "queued": engine.queued,
        "capacity": engine.capacity,
        "pid": os.getpid(),
        **engine.report(),
    }


async def models(request: web.Request) -> web.Response:
    info = request.app[INFO]
    entry = {"id": info.model_name, "object": "model", "created": 0, "owned_by": "speclane"}
    return _json({"object": "list", "data": [entry]})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def tokenize(request: web.Request) -> web.Response:
    """``{"messages": [...]}`` (a chat request, templated as generation would template it)
    or ``{"prompt": "..."}`` -> ``{"count": <tokens>, "model": ...}``; nothing is generated."""
    engine, info = request.app[ENGINE], request.app[INFO]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        raise bad_request(f"invalid JSON body: {e}") from e
    kind: Kind = "chat" if isinstance(body, dict) and "messages" in body else "completion"
    generation = parse_request(body, kind)
    if generation.model is not None and generation.model != info.model_name:
        raise not_found(
            f"model '{generation.model}' is not served here", param="model", code="model_not_found"
        )
    tokenizer = engine.models.tokenizer if engine.models else None
    ids = await request.app[TOKENIZE].run(COUNT, count, tokenizer, generation)
    return _json({"count": len(ids), "model": info.model_name})


def count(tokenizer: Any, generation: GenerationRequest) -> list[int]:
    """The prompt as ``prepare`` would tokenize it, tools in the same syntax, nothing compiled."""
    syntax = syntax_for(tokenizer, generation) if generation.kind == "chat" else None
    return encode(tokenizer, generation, syntax)


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
    check_draft_source(info, generation)
    partition = cache_partition(request)
    tokenizer = engine.models.tokenizer if engine.models else None
    loop = asyncio.get_running_loop()
    thread = request.app[TOKENIZE]
    prepared = await thread.run(GENERATION, prepare, tokenizer, generation)
    prompt_ids = prepared.prompt_ids
    if info.context_length and len(prompt_ids) >= info.context_length:
        raise bad_request(
            f"the prompt has {len(prompt_ids)} tokens; the context is {info.context_length}",
            code="context_length_exceeded",
        )
    budget = token_budget(generation.max_tokens, len(prompt_ids), info.context_length)
    job = Job(
        dataclasses.replace(prepared.generation, max_tokens=budget),
        prompt_ids,
        loop,
        partition=partition,
    )
    if prepared.generation.prediction:
        job.prediction_ids = await thread.run(
            GENERATION, encode_prediction, tokenizer, prepared.generation.prediction
        )
    engine.submit(job)
    answer = Answer(kind, info.model_name)
    try:
        if generation.stream:
            return await _stream(request, job, answer, prepared.tool_stream())
        return await _collect(job, answer, prepared.tool_stream())
    finally:
        engine.cancel(job)  # a no-op once answered; otherwise the client left or we failed


def cache_partition(request: web.Request) -> str:
    """The request's prompt-cache partition ("" without the header)."""
    value = request.headers.get(CACHE_PARTITION_HEADER, "")
    if value and not _PARTITION.fullmatch(value):
        raise bad_request(f"'{CACHE_PARTITION_HEADER}' must match {CACHE_PARTITION_PATTERN}")
    return value


def check_draft_source(info: WorkerInfo, generation: GenerationRequest) -> None:
    """``draft_source: draft_model`` on a speculative lane that has no draft model loaded is
    the client's error, said plainly, rather than a silent plain decoding."""
    if (
        generation.draft_source == "draft_model"
        and info.mode == "speculative"
        and info.draft_name is None
    ):
        raise bad_request(
            f"'{DRAFT_SOURCE_FIELD}': this lane has no draft model loaded; use "
            "'prompt_lookup', 'suffix' or leave the field out",
            param=DRAFT_SOURCE_FIELD,
        )


@dataclass(frozen=True)
class Prepared:
    """A request ready for the engine: its prompt, its constraint, how to read its answer."""

    generation: GenerationRequest
    prompt_ids: list[int]
    syntax: ToolSyntax | None  # None: the answer is not parsed for tool calls

    def tool_stream(self) -> ToolStream | None:
        """How to read the answer; a streamed one sends JSON-syntax calls as they are written."""
        if self.syntax is None:
            return None
        g = self.generation
        return ToolStream(self.syntax, g.tools, g.parallel_tool_calls, incremental=g.stream)


def prepare(tokenizer: Any, generation: GenerationRequest) -> Prepared:
    """Tokenize, and compile the decoding constraint (on the tokenize thread: both block)."""
    syntax = syntax_for(tokenizer, generation) if generation.kind == "chat" else None
    ids = encode(tokenizer, generation, syntax)
    constraint = COMPILER.compile(generation, tokenizer)
    if constraint is not None:
        # Both lanes draft under it (router.worker.drafting.forced): every position is verified
        # under the grammar's mask, and the grammar rolls back what was rejected.
        generation = dataclasses.replace(generation, constraint=constraint)
    return Prepared(generation, ids, syntax if generation.calls_tools else None)


def encode(
    tokenizer: Any, generation: GenerationRequest, syntax: ToolSyntax | None = None
) -> list[int]:
    if generation.kind == "chat":
        messages, tools = chat_inputs(generation, syntax or fallback_syntax())
        extra = {"tools": tools} if tools else {}
        try:
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **extra
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


def _pieces(tools: ToolStream | None, text: str | None) -> list[Piece]:
    """Answer text as content and tool calls; ``None`` text: the answer has ended."""
    if tools is None:
        return [text] if text else []
    return tools.feed(text) if text is not None else tools.finish()


def _finish_reason(tools: ToolStream | None, reason: str) -> str:
    return "tool_calls" if tools is not None and tools.calls and reason == "stop" else reason


async def _collect(job: Job, answer: Answer, tools: ToolStream | None) -> web.Response:
    parts: list[Piece] = []
    while True:
        event = await job.events.get()
        if isinstance(event, TextDelta):
            parts += _pieces(tools, event.text)
        elif isinstance(event, Finished):
            parts += _pieces(tools, None)
            text = "".join(p for p in parts if isinstance(p, str))
            calls = [p.openai_dict() for p in parts if isinstance(p, ParsedCall)]
            reason = _finish_reason(tools, event.finish_reason)
            body = answer.body(
                text or (None if calls else ""), reason, event.usage, calls, event.stop_string
            )
            return _json(body)
        else:
            raise event.error


# While a tool call that is sent whole (a native syntax, keys in another order) or a streamed
# call's head is being written nothing can be sent, so a long call (a patch, a file) would look
# like silence to the router's read timeout. An empty delta at most this often says "still
# generating"; OpenAI clients ignore it.
PROGRESS_EVERY = 5.0


async def _send_pieces(response: web.StreamResponse, answer: Answer, pieces: list[Piece]) -> None:
    for piece in pieces:
        if isinstance(piece, str):
            await _send(response, answer.chunk(piece))
        elif isinstance(piece, CallDelta):
            await _send(response, answer.chunk(None, tool_calls=[piece.delta()]))
        else:
            for delta in piece.stream_deltas():
                await _send(response, answer.chunk(None, tool_calls=[delta]))


async def _stream(
    request: web.Request, job: Job, answer: Answer, tools: ToolStream | None
) -> web.StreamResponse:
    first = await job.events.get()  # errors before the first token are still plain HTTP errors
    if isinstance(first, Failed):
        raise first.error
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    if answer.kind == "chat":
        head = answer.chunk("", role=True)
        if job.request.continuous_usage:
            prompt = len(job.prompt_ids)
            head["usage"] = {
                "prompt_tokens": prompt,
                "completion_tokens": 0,
                "total_tokens": prompt,
            }
        await _send(response, head)
    event: Event = first
    last_sent = time.monotonic()
    while True:
        if isinstance(event, TextDelta):
            pieces = _pieces(tools, event.text)
            if pieces:
                await _send_pieces(response, answer, pieces)
                last_sent = time.monotonic()
            elif time.monotonic() - last_sent >= PROGRESS_EVERY:
                await _send(response, answer.chunk(None))
                last_sent = time.monotonic()
        elif isinstance(event, Finished):
            await _send_pieces(response, answer, _pieces(tools, None))
            reason = _finish_reason(tools, event.finish_reason)
            # Usage once, on the stream's last chunk: the include_usage chunk when asked for,
            # else the finish_reason chunk (where the router reads the draft statistics).
            if job.request.include_usage:
                await _send(response, answer.final_chunk(reason, None, event.stop_string))
                await _send(response, answer.usage_chunk(event.usage))
            else:
                await _send(response, answer.final_chunk(reason, event.usage, event.stop_string))
            await response.write(sse.DONE_EVENT)
            break
        else:
            await response.write(sse_error_event(event.error))
            break
        event = await job.events.get()
    await response.write_eof()
    return response


async def _send(response: web.StreamResponse, chunk: dict[str, object]) -> None:
    await response.write(sse.frame(orjson.dumps(chunk)))


def _json(body: dict[str, object], status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")
