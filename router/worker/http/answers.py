"""A request's answer from its jobs' events: one job per choice (``n``), read as events come,
the whole answer (``collect``) or a stream of chunks (``stream``) in OpenAI's shapes.

Each choice reads its own text: tool calls out of it (``router.worker.decoding.tools``), its
log-probabilities in line with it (``router.worker.http.shapes.LogprobShapes``). The usage is
the choices' merged (``router.worker.engines.stats.merge_usage``): the prompt once, the
completion tokens of all.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from router.kernel import sse
from router.kernel.errors import sse_error_event
from router.kernel.worker_contract import STREAM_USAGE_FIELD
from router.worker.decoding.tools import CallDelta, ParsedCall, Piece, ToolStream
from router.worker.engines.jobs import Event, Failed, Finished, Job, TextDelta
from router.worker.engines.logprobs import TokenLogprob
from router.worker.engines.stats import merge_usage
from router.worker.http.shapes import Answer, LogprobShapes

# While a tool call that is sent whole (a native syntax, keys in another order) or a streamed
# call's head is being written nothing can be sent, so a long call (a patch, a file) would look
# like silence to the router's read timeout. An empty delta at most this often says "still
# generating"; OpenAI clients ignore it.
PROGRESS_EVERY = 5.0


@dataclass
class Choice:
    """One choice's reading of its job's events."""

    index: int
    tools: ToolStream | None  # None: the text is not parsed for tool calls
    shapes: LogprobShapes | None  # None: no log-probabilities were asked for
    parts: list[Piece] = field(default_factory=list)
    entries: list[TokenLogprob] = field(default_factory=list)  # not yet sent (a stream)
    finished: Finished | None = None

    def pieces(self, text: str | None) -> list[Piece]:
        """Answer text as content and tool calls; ``None`` text: the answer has ended."""
        if self.tools is None:
            return [text] if text else []
        return self.tools.feed(text) if text is not None else self.tools.finish()

    def reason(self, finished: Finished) -> str:
        reason = finished.finish_reason
        calls = self.tools is not None and self.tools.calls
        return "tool_calls" if calls and reason == "stop" else reason

    def take_logprobs(self) -> dict[str, object] | None:
        """The entries not sent yet, shaped (then forgotten); None when there are none."""
        if self.shapes is None or not self.entries:
            return None
        shaped, self.entries = self.shapes.shape(self.entries), []
        return shaped


class Events:
    """The jobs' events as they come, each with its choice's index."""

    def __init__(self, jobs: list[Job]) -> None:
        self._jobs = jobs
        self._merged: asyncio.Queue[tuple[int, Event]] | None = None
        self._pumps: list[asyncio.Task[None]] = []
        if len(jobs) > 1:
            self._merged = asyncio.Queue()
            self._pumps = [asyncio.create_task(self._pump(i, j)) for i, j in enumerate(jobs)]

    async def _pump(self, index: int, job: Job) -> None:
        assert self._merged is not None
        while True:
            event = await job.events.get()
            self._merged.put_nowait((index, event))
            if not isinstance(event, TextDelta):
                return

    async def get(self) -> tuple[int, Event]:
        if self._merged is None:
            return 0, await self._jobs[0].events.get()
        return await self._merged.get()

    def close(self) -> None:
        for pump in self._pumps:
            pump.cancel()


async def collect(jobs: list[Job], answer: Answer, choices: list[Choice]) -> web.Response:
    events = Events(jobs)
    try:
        left = len(choices)
        while left:
            index, event = await events.get()
            choice = choices[index]
            if isinstance(event, TextDelta):
                choice.parts += choice.pieces(event.text)
                choice.entries += event.logprobs
            elif isinstance(event, Finished):
                choice.parts += choice.pieces(None)
                choice.finished = event
                left -= 1
            else:
                raise event.error
    finally:
        events.close()
    bodies = []
    for choice in choices:
        finished = choice.finished
        assert finished is not None
        text = "".join(p for p in choice.parts if isinstance(p, str))
        calls = [p.openai_dict() for p in choice.parts if isinstance(p, ParsedCall)]
        logprobs = None if choice.shapes is None else choice.shapes.shape(choice.entries)
        bodies.append(
            answer.choice(
                choice.index,
                text or (None if calls else ""),
                choice.reason(finished),
                calls,
                finished.stop_string,
                logprobs,
            )
        )
    usage = merge_usage([c.finished.usage for c in choices if c.finished is not None])
    return json_response(answer.body(bodies, usage))


async def stream(
    request: web.Request, jobs: list[Job], answer: Answer, choices: list[Choice]
) -> web.StreamResponse:
    events = Events(jobs)
    try:
        return await _stream(request, jobs[0], events, answer, choices)
    finally:
        events.close()


async def _stream(
    request: web.Request, first_job: Job, events: Events, answer: Answer, choices: list[Choice]
) -> web.StreamResponse:
    index, event = await events.get()  # errors before the first token are still plain errors
    if isinstance(event, Failed):
        raise event.error
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    generation = first_job.request
    if answer.kind == "chat":
        for choice in choices:
            # An answer that must be a tool call opens with no content (null), as OpenAI's.
            forced = choice.tools is not None and generation.tool_choice == "required"
            head = answer.chunk(None if forced else "", role=True, index=choice.index)
            if generation.continuous_usage and choice.index == 0:
                prompt = len(first_job.prompt_ids)
                head["usage"] = {
                    "prompt_tokens": prompt,
                    "completion_tokens": 0,
                    "total_tokens": prompt,
                }
            await _send(response, head)
    last_sent = time.monotonic()
    left = len(choices)
    while True:
        choice = choices[index]
        if isinstance(event, TextDelta):
            choice.entries += event.logprobs
            pieces = choice.pieces(event.text)
            if pieces:
                await _send_pieces(response, answer, choice, pieces)
                last_sent = time.monotonic()
            elif time.monotonic() - last_sent >= PROGRESS_EVERY:
                await _send(response, answer.chunk(None, index=index))
                last_sent = time.monotonic()
        elif isinstance(event, Finished):
            await _send_pieces(response, answer, choice, choice.pieces(None))
            choice.finished = event
            left -= 1
            final = answer.final_chunk(
                choice.reason(event), event.stop_string, choice.take_logprobs(), index=index
            )
            if left:
                await _send(response, final)
            else:
                await _end(response, answer, choices, final, generation.include_usage)
                break
        else:
            await response.write(sse_error_event(event.error))
            break
        index, event = await events.get()
    await response.write_eof()
    return response


async def _end(
    response: web.StreamResponse,
    answer: Answer,
    choices: list[Choice],
    final: dict[str, object],
    include_usage: bool,
) -> None:
    """The last choice's finish chunk, and the usage once, on the stream's last chunk: the
    include_usage chunk when asked for; else none, as OpenAI's, and the finish chunk carries
    it under a field of ours (where the router reads the draft statistics)."""
    usage = merge_usage([c.finished.usage for c in choices if c.finished is not None])
    if include_usage:
        await _send(response, final)
        await _send(response, answer.usage_chunk(usage))
    else:
        await _send(response, {**final, STREAM_USAGE_FIELD: usage})
    await response.write(sse.DONE_EVENT)


async def _send_pieces(
    response: web.StreamResponse, answer: Answer, choice: Choice, pieces: list[Piece]
) -> None:
    """One choice's pieces as chunks; the entries not sent yet go with the first (text the
    tool parser holds waits, and so do they)."""
    index = choice.index
    for piece in pieces:
        logprobs = choice.take_logprobs()
        if isinstance(piece, str):
            await _send(response, answer.chunk(piece, logprobs=logprobs, index=index))
        elif isinstance(piece, CallDelta):
            chunk = answer.chunk(None, tool_calls=[piece.delta()], logprobs=logprobs, index=index)
            await _send(response, chunk)
        else:
            for delta in piece.stream_deltas():
                chunk = answer.chunk(None, tool_calls=[delta], logprobs=logprobs, index=index)
                await _send(response, chunk)
                logprobs = None


async def _send(response: web.StreamResponse, chunk: dict[str, object]) -> None:
    await response.write(sse.frame(orjson.dumps(chunk)))


def json_response(body: dict[str, object], status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")
