"""The worker's HTTP side: /health, /v1/models, /v1/chat/completions, /v1/completions,
/v1/tokenize (a prompt's token count under the chat template, tools included: Anthropic's
count_tokens).

Handlers never wait on the generation thread except through their job's event queue, so
/health answers while a batch is decoding. Tokenizing runs on one thread
(``router.worker.http.tokenizing``): off the event loop, never two encodes at once on the shared
tokenizer, and a generation request's preparation before any token count.

A request's prompt-cache partition comes in the ``X-Speclane-Cache-Partition`` header
(``router.kernel.worker_contract``); its job reuses cached KV state of that partition only.

With a worker secret (``router.kernel.worker_contract.WORKER_SECRET_ENV``) every endpoint,
``/health`` included, answers only requests carrying it (``WORKER_SECRET_HEADER``), compared
in constant time; anything else is a 401 before routing, parsing or the body is read: the
router's policies, queues and browser rules cannot be skipped by going to the lane's port.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from router.kernel.errors import (
    RouterError,
    bad_request,
    internal_error,
    not_found,
    render,
)
from router.kernel.worker_contract import (
    CACHE_PARTITION_HEADER,
    CACHE_PARTITION_PATTERN,
    DEFAULT_MAX_BODY_BYTES,
    DRAFT_SOURCE_FIELD,
    SHARED_MODE,
    WORKER_SECRET_HEADER,
    lane_prefix,
    secret_matches,
)
from router.worker.decoding.constrain import COMPILER
from router.worker.decoding.tools import (
    ToolStream,
    ToolSyntax,
    chat_inputs,
    fallback_syntax,
    syntax_for,
)
from router.worker.engines.engine import Engine
from router.worker.engines.jobs import Job
from router.worker.engines.promptcache import SYSTEM, Segment
from router.worker.http import answers
from router.worker.http.answers import Choice
from router.worker.http.render import encode_chat, mapped, strings_in
from router.worker.http.shapes import Answer, LogprobShapes
from router.worker.http.tokenizing import COUNT, GENERATION, TokenizerThread
from router.worker.request.protocol import (
    GenerationRequest,
    Kind,
    context_exceeded,
    fit_vocabulary,
    fits_context,
    parse_generation_request,
    prompt_chars,
    token_budget,
)

log = logging.getLogger("speclane.worker")


@dataclass(frozen=True)
class WorkerInfo:
    mode: str
    model_name: str
    draft_name: str | None
    num_draft_tokens: int  # 0 when the lane does not speculate
    context_length: int | None = None
    draft_source: str | None = None  # the speculative lane's source without a prediction
    # Token ids the lane accepts (``fit_vocabulary``) and the most characters one token
    # spells (``fits_context``); None only for scripted test engines.
    vocab_size: int | None = None
    max_token_chars: int | None = None
    # Special tokens' text in messages read as text (``router.worker.http.render``); False:
    # as control tokens (``[lanes] content_special_tokens = "control"``).
    content_specials_as_text: bool = True
    architecture: str | None = None  # the model's config model_type (Ollama's /api/show)


ENGINE = web.AppKey("engine", Engine)
INFO = web.AppKey("info", WorkerInfo)
TOKENIZE = web.AppKey("tokenize", TokenizerThread)
_PARTITION = re.compile(CACHE_PARTITION_PATTERN)


def make_worker_app(
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
    share one tokenizer. ``secret``: as ``make_worker_app`` (the root's check covers the lanes)."""
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
    except Exception:  # the worker's own bug: an OpenAI-shaped answer without its text
        reference = uuid.uuid4().hex[:12]
        log.exception("request failed (reference %s)", reference)
        return _error_response(internal_error("the lane worker", reference, type="server_error"))


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
    generation = checked(body, kind, info)
    tokenizer = engine.models.tokenizer if engine.models else None
    size = prompt_chars(generation)
    ids = await request.app[TOKENIZE].run(
        COUNT, count, tokenizer, generation, info.content_specials_as_text, size=size
    )
    return _json({"count": len(ids), "model": info.model_name})


def count(tokenizer: Any, generation: GenerationRequest, as_text: bool = True) -> list[int]:
    """The prompt as ``prepare`` would tokenize it, tools in the same syntax, nothing compiled."""
    syntax = syntax_for(tokenizer, generation) if generation.kind == "chat" else None
    return encode(tokenizer, generation, syntax, as_text)


async def _generate(request: web.Request, kind: Kind) -> web.StreamResponse:
    engine, info = request.app[ENGINE], request.app[INFO]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        raise bad_request(f"invalid JSON body: {e}") from e
    generation = checked(body, kind, info)
    check_draft_source(info, generation)
    partition = cache_partition(request)
    tokenizer = engine.models.tokenizer if engine.models else None
    loop = asyncio.get_running_loop()
    thread = request.app[TOKENIZE]
    size = prompt_chars(generation)
    prepared = await thread.run(
        GENERATION, prepare, tokenizer, generation, info.content_specials_as_text, size=size
    )
    prompt_ids = prepared.prompt_ids
    if info.context_length and len(prompt_ids) >= info.context_length:
        raise context_exceeded(f"the prompt has {len(prompt_ids)} tokens", info.context_length)
    budget = token_budget(generation.max_tokens, len(prompt_ids), info.context_length)
    first = dataclasses.replace(prepared.generation, max_tokens=budget)
    jobs = [
        Job(nth(first, i), prompt_ids, loop, partition=partition, segments=prepared.segments)
        for i in range(first.n)
    ]
    if prepared.generation.prediction:
        text = prepared.generation.prediction
        prediction = await thread.run(
            GENERATION, encode_prediction, tokenizer, text, size=len(text)
        )
        for job in jobs:
            job.prediction_ids = prediction
    jobs[0].shares_prefill = len(jobs) > 1
    engine.submit(jobs[0])
    # The other choices once the first one's prompt is in the prompt cache: they start from
    # it rather than prefilling it again (on the speculative lane, once it has ended).
    others = asyncio.create_task(_submit_after_prefill(engine, jobs)) if len(jobs) > 1 else None
    answer = Answer(kind, info.model_name)
    choices = [
        Choice(
            i,
            prepared.tool_stream(),
            LogprobShapes(kind) if generation.logprobs is not None else None,
        )
        for i in range(len(jobs))
    ]
    try:
        if generation.stream:
            return await answers.stream(request, jobs, answer, choices)
        return await answers.collect(jobs, answer, choices)
    finally:
        if others is not None:
            others.cancel()
        for job in jobs:  # a no-op once answered; otherwise the client left or we failed
            engine.cancel(job)


def nth(generation: GenerationRequest, index: int) -> GenerationRequest:
    """Choice ``index``'s request: a seeded one draws from the next seed (n equal samples
    would answer nothing more than one)."""
    if index == 0 or generation.seed is None:
        return generation
    return dataclasses.replace(generation, seed=(generation.seed + index) % 2**64)


async def _submit_after_prefill(engine: Engine, jobs: list[Job]) -> None:
    await jobs[0].prefilled.wait()
    for job in jobs[1:]:
        engine.submit(job)


def checked(body: Any, kind: Kind, info: WorkerInfo) -> GenerationRequest:
    """The request validated at the lane's boundary: its fields (``parse_generation_request``), its
    model, and every token id against the vocabulary (``fit_vocabulary``), before any of it
    reaches the tokenizer or MLX."""
    generation = parse_generation_request(body, kind)
    if generation.model is not None and generation.model != info.model_name:
        raise not_found(
            f"model '{generation.model}' is not served here", param="model", code="model_not_found"
        )
    if info.context_length and info.max_token_chars:
        fits_context(generation, info.context_length, info.max_token_chars)
    return fit_vocabulary(generation, info.vocab_size) if info.vocab_size else generation


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
    segments: tuple[Segment, ...] = ()  # prompt positions the prompt cache keeps entries at

    def tool_stream(self) -> ToolStream | None:
        """How to read the answer; a streamed one sends JSON-syntax calls as they are written."""
        if self.syntax is None:
            return None
        g = self.generation
        return ToolStream(self.syntax, g.tools, g.parallel_tool_calls, incremental=g.stream)


def prepare(tokenizer: Any, generation: GenerationRequest, as_text: bool = True) -> Prepared:
    """Tokenize, and compile the decoding constraint (on the tokenize thread: both block)."""
    syntax = syntax_for(tokenizer, generation) if generation.kind == "chat" else None
    ids = encode(tokenizer, generation, syntax, as_text)
    segments = segments_of(tokenizer, generation, syntax, ids, as_text)
    constraint = COMPILER.compile(generation, tokenizer)
    if constraint is not None:
        # Both lanes draft under it (router.worker.drafting.forced): every position is verified
        # under the grammar's mask, and the grammar rolls back what was rejected.
        generation = dataclasses.replace(generation, constraint=constraint)
    return Prepared(generation, ids, syntax if generation.calls_tools else None, segments)


def encode(
    tokenizer: Any,
    generation: GenerationRequest,
    syntax: ToolSyntax | None = None,
    content_specials_as_text: bool = True,
) -> list[int]:
    """The prompt's token ids; a chat's messages are read as text, special tokens included,
    unless ``content_specials_as_text`` is off (``router.worker.http.render``)."""
    if generation.kind == "chat":
        messages, tools = chat_inputs(generation, syntax or fallback_syntax())
        ids = chat_ids(tokenizer, messages, tools, content_specials_as_text)
    elif isinstance(generation.prompt, str):
        ids = tokenizer.encode(generation.prompt)
    else:
        ids = list(generation.prompt)  # checked against the vocabulary (``checked``)
    if not ids:
        raise bad_request("the prompt is empty after tokenization", param="prompt")
    return list(ids)


def chat_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    content_specials_as_text: bool,
    *,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The chat template's token ids for ``messages`` and ``tools`` (``encode_chat``)."""

    def render(escape: Callable[[str], str]) -> str:
        extra = {"tools": mapped(tools, escape)} if tools else {}
        try:
            return str(
                tokenizer.apply_chat_template(
                    mapped(messages, escape),
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                    **extra,
                )
            )
        except Exception as e:  # a template may reject roles or orderings
            message = f"the chat template rejected the messages: {e}"
            raise bad_request(message, param="messages") from e

    return encode_chat(
        tokenizer,
        render,
        strings_in([messages, tools]),
        content_specials_as_text=content_specials_as_text,
    )


def segments_of(
    tokenizer: Any,
    generation: GenerationRequest,
    syntax: ToolSyntax | None,
    ids: list[int],
    content_specials_as_text: bool = True,
) -> tuple[Segment, ...]:
    """Where the prompt's system part (system messages and tools) ends, as a token position
    of ``ids``: the common prefix of ``ids`` and the template rendered for the system part
    and an empty user turn (as ``mlx_lm.server`` finds it), encoded as ``ids`` were. None
    for text prompts, or when nothing but the system part is there."""
    if generation.kind != "chat":
        return ()
    messages, tools = chat_inputs(generation, syntax or fallback_syntax())
    system = 0
    while system < len(messages) and messages[system].get("role") in ("system", "developer"):
        system += 1
    if not (system or tools) or system == len(messages):
        return ()
    head = [*messages[:system], {"role": "user", "content": ""}]
    try:
        system_ids = chat_ids(
            tokenizer, head, tools, content_specials_as_text, add_generation_prompt=False
        )
    except RouterError:  # a template may reject an empty turn: no segment, nothing lost
        return ()
    pairs = enumerate(zip(system_ids, ids, strict=False))
    end = next((i for i, (a, b) in pairs if a != b), min(len(system_ids), len(ids)))
    return (Segment(end, SYSTEM),) if 0 < end < len(ids) else ()


def encode_prediction(tokenizer: Any, text: str) -> list[int]:
    """The prediction as the answer's tokens would spell it (no BOS: it is not a prompt)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


_json = answers.json_response
