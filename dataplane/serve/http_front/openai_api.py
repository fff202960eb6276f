"""OpenAI-compatible HTTP handlers, served from the same DataPlane (and engine thread) as
gRPC; openai_app.py is the FastAPI app that routes to them.

    POST /v1/completions, /v1/chat/completions   JSON, or server-sent events (`stream`)
    GET  /v1/models, /health, /metrics

    request ──validate──> n x DataPlane.open_stream ──> engine thread (as a gRPC Generate)
    events of the n streams, merged ──> one JSON body, or one SSE chunk per token batch
    client gone (any time) ──> every stream closed: the engine aborts and frees the pages

Each choice is an independent engine request (n > 1, or a batch of prompts; with a seed,
choice i uses seed + i, as vLLM does).

What must stay true, because one event loop also serves every gRPC stream:
  * nothing sized by the client runs on the loop unbounded: the body is capped before it
    is read (413, openai_app.read_body), then parsed, validated and tokenized on a worker
    thread, and stop strings are
    bounded in number and length and matched in O(1) a character (stop_strings.py);
  * a request is refused (400/413/429, an OpenAI error object) before its response starts:
    a streaming response's 200 is sent only once the engine has admitted every choice.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.model.tokenizer import Tokenizer
from rimuru.dataplane.serve.http_front.chat_template import (
    CHATML_END,
    ChatTemplate,
    encode_conversation,
)
from rimuru.dataplane.serve.http_front.openai_protocol import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    FINISH_REASONS,
    MAX_CHOICES,
    ChatCompletionRequest,
    CompletionRequest,
    ModelNotFound,
    chunk,
    error_body,
    http_error,
    model_list,
    now,
    parse_body,
    usage,
)
from rimuru.dataplane.serve.http_front.stop_strings import StopSet, StopStrings
from rimuru.dataplane.serve.plane.errors import FailedPrecondition, InvalidArgument, ServeError
from rimuru.dataplane.serve.plane.events import (
    Event,
    FinishedEvent,
    GenerateSpec,
    ModelInfo,
    RejectedEvent,
    TokensEvent,
)
from rimuru.dataplane.serve.plane.plane import SERVING, DataPlane, RequestStream

_CLIENT_GONE_STATUS = 499  # nginx's "client closed request": never seen by the client


class _ClientGone(Exception):
    pass


@dataclass
class _Delta:
    text: str
    token_ids: tuple[int, ...]
    finished: bool  # the choice's last delta (finish_reason is set)


@dataclass
class _Choice:
    """One sequence of a response: its engine stream and its output so far."""

    index: int
    stream: RequestStream
    num_prompt_tokens: int
    detokenize: Callable[[tuple[int, ...]], str]  # streaming: text of these new ids
    flush: Callable[[], str]
    stop: StopStrings
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    num_cached_tokens: int = 0  # from the engine's final event (0 if a stop string ended it)

    def take(self, event: Event) -> _Delta:
        if isinstance(event, RejectedEvent):
            raise event.error
        if isinstance(event, TokensEvent):
            self.token_ids.extend(event.token_ids)
            released = self.stop.add(self.detokenize(event.token_ids))
            if self.stop.stopped:  # a stop string: the engine request ends here
                self.finish_reason = "stop"
                self.stream.close()
            ids = event.token_ids
        else:
            assert isinstance(event, FinishedEvent)
            self.num_cached_tokens = event.usage.cached_tokens
            released = self.stop.add(self.flush()) + self.stop.flush()
            self.finish_reason = self.finish_reason or FINISH_REASONS.get(
                event.finish_reason, event.finish_reason
            )
            ids = ()
        self.text.append(released)
        return _Delta(released, ids, self.finish_reason is not None)


@dataclass(frozen=True)
class _Job:
    """A validated request, before it reaches the engine."""

    request_id: str
    prompts: list[list[int]]
    body: CompletionRequest | ChatCompletionRequest
    max_tokens: list[int]  # per prompt
    stop_set: StopSet
    extra_stop_token_ids: tuple[int, ...] = ()


class OpenAIRoutes:
    """The handlers; the FastAPI app (openai_app.create_app) only routes to them."""

    def __init__(self, plane: DataPlane, chat_template: ChatTemplate) -> None:
        self._plane = plane
        self._chat_template = chat_template
        self._created = now()

    # ------------------------------------------------------------------ endpoints
    async def completions(self, raw: bytes, request: Request) -> Response:
        info = self._plane.require_serving()
        job = await asyncio.to_thread(self._completion_job, raw, info)
        return await self._respond(job, request, info, chat=False)

    async def chat_completions(self, raw: bytes, request: Request) -> Response:
        info = self._plane.require_serving()
        job = await asyncio.to_thread(self._chat_job, raw, info)
        return await self._respond(job, request, info, chat=True)

    def models(self) -> dict:
        info = self._plane.require_serving()
        return model_list(info.model_name, info.max_model_len, self._created)

    def health(self) -> Response:
        if self._plane.state == SERVING:
            return Response(status_code=200)
        body = error_body(f"the data plane is {self._plane.state}", "service_unavailable_error")
        return JSONResponse(body, status_code=503)

    # ------------------------------------------------------------------ validation
    # The *_job methods run on a worker thread: everything there grows with the body.
    def _completion_job(self, raw: bytes, info: ModelInfo) -> _Job:
        body = parse_body(CompletionRequest, raw)
        self._admit(body, info)
        prompts = body.prompts()
        _check_num_choices(len(prompts), body)
        ids = [
            self._prompt_ids(p, info, "prompt" if len(prompts) == 1 else f"prompt[{i}]")
            for i, p in enumerate(prompts)
        ]
        max_tokens = [
            self._max_tokens(body.max_tokens, len(p), info, DEFAULT_COMPLETION_MAX_TOKENS)
            for p in ids
        ]
        stop_set = StopSet(body.stop_strings)
        return _Job(f"cmpl-{uuid.uuid4().hex}", ids, body, max_tokens, stop_set)

    def _chat_job(self, raw: bytes, info: ModelInfo) -> _Job:
        body = parse_body(ChatCompletionRequest, raw)
        self._admit(body, info)
        _check_num_choices(1, body)
        tokenizer = self._require_tokenizer("messages", info)
        conversation = body.conversation()
        try:
            ids = encode_conversation(self._chat_template, tokenizer, conversation)
        except InvalidArgument:
            raise
        except ValueError as exc:  # the template refused the conversation
            raise InvalidArgument("messages", str(exc)) from None
        if not ids:
            raise InvalidArgument("messages", "render to an empty prompt")
        max_tokens = self._max_tokens(body.requested_max_tokens, len(ids), info, None)
        extra_stop: tuple[int, ...] = ()
        if self._chat_template.is_chatml:  # base models' EOS is not ChatML's end of turn
            end = tokenizer.encode(CHATML_END)
            extra_stop = tuple(end) if len(end) == 1 else ()
        stop_set = StopSet(body.stop_strings)
        return _Job(f"chatcmpl-{uuid.uuid4().hex}", [ids], body, [max_tokens], stop_set, extra_stop)

    def _admit(self, body: CompletionRequest | ChatCompletionRequest, info: ModelInfo) -> None:
        if body.model != info.model_name:
            raise ModelNotFound(
                f"model {body.model!r} does not exist here; this server serves "
                f"{info.model_name!r} (GET /v1/models)"
            )
        body.check_supported()
        if body.stop_strings:
            self._require_tokenizer("stop", info)

    def _require_tokenizer(self, name: str, info: ModelInfo) -> Tokenizer:
        if self._plane.tokenizer is None:
            raise FailedPrecondition(
                f"{name}: model {info.model_name!r} has no tokenizer on this server; "
                f"send token ids and no stop strings"
            )
        return self._plane.tokenizer

    def _prompt_ids(self, prompt: str | list[int], info: ModelInfo, name: str) -> list[int]:
        if isinstance(prompt, str):
            ids = self._require_tokenizer(name, info).encode(prompt)
            if not ids:
                raise InvalidArgument(name, "is empty: give at least one character")
            return ids
        if not prompt:
            raise InvalidArgument(name, "is empty: give at least one token id")
        for i, t in enumerate(prompt):
            if not 0 <= t < info.vocab_size:
                raise InvalidArgument(
                    f"{name}[{i}]", f"{t} is outside the vocabulary [0, {info.vocab_size})"
                )
        return list(prompt)

    @staticmethod
    def _max_tokens(requested: int | None, prompt_len: int, info: ModelInfo, default) -> int:
        room = info.max_model_len - prompt_len
        if room < 1:
            raise InvalidArgument(
                "prompt", f"is {prompt_len} tokens; the model's context is {info.max_model_len}"
            )
        max_tokens = requested if requested is not None else min(default or room, room)
        if max_tokens > room:
            raise InvalidArgument(
                "max_tokens",
                f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds the model's "
                f"context of {info.max_model_len} tokens: set max_tokens <= {room}",
            )
        return max_tokens

    # ------------------------------------------------------------------ serving
    async def _respond(self, job: _Job, request: Request, info: ModelInfo, chat: bool) -> Response:
        body = job.body
        arrival = time.monotonic()
        params = [
            body.sampling_params(max_tokens, i, job.extra_stop_token_ids)
            for max_tokens in job.max_tokens
            for i in range(body.n)
        ]
        prompts = [job.prompts[i // body.n] for i in range(len(params))]
        check = None
        if body.stream:
            # A request the engine would refuse (it can never fit in the pool) still gets a
            # 400, not an error inside a 200 stream: this call is ahead of them in its inbox.
            requests = list(zip(prompts, params, strict=True))
            check = self._plane.engine.call(lambda engine: _validate(engine, requests))
        choices: list[_Choice] = []
        try:
            for index, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
                spec = GenerateSpec(f"{job.request_id}-{index}", tuple(prompt), p, arrival)
                stream = self._plane.open_stream(spec)
                choices.append(self._choice(index, stream, len(prompt), p, job.stop_set))
        except BaseException:
            for c in choices:
                c.stream.close()
            raise
        if check is not None:
            try:
                await asyncio.wrap_future(check)
                firsts = await self._admitted(choices)
            except BaseException:
                for c in choices:
                    c.stream.close()
                raise
            events = _Events(choices, request, firsts)
            return self._stream(job, choices, events, info, chat)
        events = _Events(choices, request)
        try:
            async for _ in events:
                pass
        except _ClientGone:
            return Response(status_code=_CLIENT_GONE_STATUS)
        finally:
            events.close()
        kind = "chat.completion" if chat else "text_completion"
        rows = [_whole(c, chat, body.return_token_ids) for c in choices]
        return JSONResponse(
            chunk(kind, job.request_id, info.model_name, now(), rows, _usage(choices))
        )

    async def _admitted(self, choices: list[_Choice]) -> dict[int, Event]:
        """Wait until the engine has taken or refused every choice; raise the first refusal
        (a full queue: 429) so that no 200 is sent for a stream that would only fail.

        The engine thread applies its inbox in order, so this call runs after the choices'
        submits: a choice absent from engine.requests then was refused (its RejectedEvent is
        on its way) or has already finished; either way its first event comes without waiting
        for a forward. Returns those first events, by choice index, for the response."""
        engine_ids = [c.stream.engine_id for c in choices]
        present = await asyncio.wrap_future(
            self._plane.engine.call(lambda engine: [i in engine.requests for i in engine_ids])
        )
        firsts: dict[int, Event] = {}
        for c, taken in zip(choices, present, strict=True):
            if not taken:
                event = await c.stream.next_event()
                if isinstance(event, RejectedEvent):
                    raise event.error
                firsts[c.index] = event
        return firsts

    def _choice(
        self, index: int, stream: RequestStream, num_prompt: int, params, stop_set: StopSet
    ) -> _Choice:
        tokenizer = self._plane.tokenizer
        stop = StopStrings(stop_set)
        if tokenizer is None:
            return _Choice(index, stream, num_prompt, lambda ids: "", lambda: "", stop)
        detok = tokenizer.detokenizer()
        hidden = params.stop_token_set
        if not params.ignore_eos and self._plane.info is not None:
            hidden = hidden | frozenset(self._plane.info.eos_token_ids)

        def detokenize(ids: tuple[int, ...]) -> str:  # a stop token's own text is not output
            return detok.add(t for t in ids if t not in hidden)

        return _Choice(index, stream, num_prompt, detokenize, detok.flush, stop)

    def _stream(self, job, choices, events: _Events, info, chat) -> Response:
        kind = "chat.completion.chunk" if chat else "text_completion"
        model, created = info.model_name, now()
        body = job.body

        def sse(rows: list[dict], usage_row: dict | None = None) -> str:
            data = chunk(kind, job.request_id, model, created, rows, usage_row)
            return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"

        async def body_iterator() -> AsyncIterator[str]:
            try:
                if chat:  # the role comes first, as OpenAI sends it
                    yield sse([_chat_delta(c.index, {"role": "assistant", "content": ""}, None)
                               for c in choices])  # fmt: skip
                async for c, delta in events:
                    yield sse([_delta_row(c, delta, chat, body.return_token_ids)])
                if body.include_usage:
                    yield sse([], _usage(choices))
                yield "data: [DONE]\n\n"
            except _ClientGone:
                return
            except ServeError as exc:  # refused once streaming (queue full), or the engine failed
                yield f"data: {json.dumps(http_error(exc)[1])}\n\n"
            finally:
                events.close()

        return StreamingResponse(body_iterator(), media_type="text/event-stream")


def _validate(engine, requests: list[tuple[list[int], SamplingParams]]) -> None:
    """On the engine thread: Engine.validate_request of each choice, as InvalidArgument."""
    for prompt, params in requests:
        try:
            engine.validate_request(prompt, params)
        except ValueError as exc:
            raise InvalidArgument("max_tokens", str(exc)) from None


class _Events:
    """(choice, delta) of every choice as the engine delivers them, until all have finished.

    Raises _ClientGone once the client disconnects. The watcher closes every stream (the
    engine aborts them) when the client goes or the response completes, so no request
    outlives its HTTP exchange, whoever iterates this and however the response ends."""

    def __init__(
        self, choices: list[_Choice], request: Request, firsts: dict[int, Event] | None = None
    ) -> None:
        """firsts: events already taken off some choices' streams (by _admitted), by index."""
        self._choices = choices
        self._queue: asyncio.Queue = asyncio.Queue()
        for index, event in (firsts or {}).items():
            self._queue.put_nowait((choices[index], event))
        self._tasks = [asyncio.ensure_future(self._pump(c)) for c in choices]
        self._tasks.append(asyncio.ensure_future(self._watch(request)))

    async def _pump(self, choice: _Choice) -> None:
        async for event in choice.stream:
            self._queue.put_nowait((choice, event))

    async def _watch(self, request: Request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        for choice in self._choices:
            choice.stream.close()
        self._queue.put_nowait((None, None))

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> tuple[_Choice, _Delta]:
        while not all(c.finish_reason for c in self._choices):
            choice, event = await self._queue.get()
            if choice is None:
                raise _ClientGone
            if choice.finish_reason is None:  # nothing after its own stop string
                return choice, choice.take(event)
        raise StopAsyncIteration

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for choice in self._choices:
            choice.stream.close()


def _check_num_choices(num_prompts: int, body: CompletionRequest | ChatCompletionRequest) -> None:
    if num_prompts * body.n > MAX_CHOICES:
        raise InvalidArgument(
            "n", f"prompts x n is {num_prompts} x {body.n}; at most {MAX_CHOICES} choices"
        )
    body.check_seed(body.n)


def _usage(choices: list[_Choice]) -> dict:
    # Every choice counts its prompt, as OpenAI does for n > 1.
    return usage(
        sum(c.num_prompt_tokens for c in choices),
        sum(len(c.token_ids) for c in choices),
        sum(c.num_cached_tokens for c in choices),
    )


def _whole(c: _Choice, chat: bool, token_ids: bool) -> dict:
    text = "".join(c.text)
    if chat:
        row = {"index": c.index, "message": {"role": "assistant", "content": text}}
    else:
        row = {"index": c.index, "text": text}
    row |= {"logprobs": None, "finish_reason": c.finish_reason}
    if token_ids:
        row["token_ids"] = list(c.token_ids)
    return row


def _chat_delta(index: int, delta: dict, finish_reason: str | None) -> dict:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def _delta_row(c: _Choice, delta: _Delta, chat: bool, token_ids: bool) -> dict:
    finish = c.finish_reason if delta.finished else None
    if chat:
        row = _chat_delta(c.index, {"content": delta.text} if delta.text else {}, finish)
    else:
        row = {"index": c.index, "text": delta.text, "logprobs": None, "finish_reason": finish}
    if token_ids:
        row["token_ids"] = list(delta.token_ids)
    return row
