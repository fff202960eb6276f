"""The engine thread: the one owner of the Engine, stepping it off the event loop.

    event loop                           engine thread
    ----------                           -------------
    submit(spec, sink)  ──┐              repeat:
    abort(id)           ──┼── inbox ──>    take commands (block only while idle)
    call(fn) / policy   ──┘                apply them, in order, between two steps
                                           step() while there is work
    sink(event)  <── call_soon_threadsafe ─ hand each stream its events (one batch a step)
    snapshot     <── atomic reference ──── publish an EngineSnapshot

What must stay true:
  * only this thread touches the Engine; the event loop reads published snapshots;
  * commands are applied between two steps, so a policy version is never half-applied
    and an abort never races a forward;
  * a sink receives TokensEvents then exactly one FinishedEvent, or one RejectedEvent
    alone; after a client's own abort it receives nothing more;
  * an aborted request's pages are released by the next step (run even when idle), so
    `Engine.num_leaked_pages()` is 0 whenever no request is in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rimuru.dataplane.engine.engine import Engine, RequestOutput
from rimuru.dataplane.engine.sched.request import Request, RequestStatus
from rimuru.dataplane.serve.plane.engine_state import take_snapshot, warm_up
from rimuru.dataplane.serve.plane.errors import (
    EngineFailed,
    InvalidArgument,
    QueueFull,
    RequestFailed,
)
from rimuru.dataplane.serve.plane.events import (
    EngineSnapshot,
    Event,
    FinishedEvent,
    GenerateSpec,
    ModelInfo,
    PolicyChange,
    RejectedEvent,
    Timing,
    TokensEvent,
    Usage,
)
from rimuru.dataplane.serve.plane.observer import Observer

log = logging.getLogger("rimuru.serve.engine")

Sink = Callable[[Event], None]  # called on the event loop


@dataclass
class _Submit:
    engine_id: str
    spec: GenerateSpec
    sink: Sink


@dataclass
class _Abort:
    engine_id: str
    notify: bool  # True: the server aborts (drain past its grace) and the client hears it
    reason: str  # the metric's label: "cancelled", "deadline" (the client's) or "shutdown"


@dataclass
class _Call:
    fn: Callable[[Engine], Any]
    future: concurrent.futures.Future


class _Stop:
    pass


@dataclass
class _Stream:
    request: Request
    sink: Sink
    scheduled_time: float | None = None  # start of the step that first scheduled it


class EngineLoop:
    def __init__(
        self,
        build_engine: Callable[[], Engine],
        *,
        max_waiting: int | None = None,
        observer: Observer | None = None,
    ) -> None:
        """max_waiting: requests allowed in the engine's waiting queue, new or preempted
        (None = any); a request that arrives when it is full is refused (QueueFull)."""
        if max_waiting is not None and max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0 or None; got {max_waiting}")
        self._build_engine = build_engine
        self._max_waiting = max_waiting
        self._observer = observer or Observer()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = threading.Lock()  # orders "inbox closed" against every put
        self._closed = False
        self._streams: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._needs_reclaim_step = False
        self._policy_version = 0
        self._pending: list[tuple[Sink, Event]] = []  # events of this round, sent in one batch
        self._answers: list[tuple[concurrent.futures.Future, Any, Exception | None]] = []
        # Resolved by the thread: ready -> ModelInfo once warmed up; done -> when it exits.
        self.ready: concurrent.futures.Future[ModelInfo] = concurrent.futures.Future()
        self.done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.snapshot: EngineSnapshot | None = None

    # ------------------------------------------------------------------ event-loop side
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine loop is already started")
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="rimuru-engine", daemon=True)
        self._thread.start()

    def submit(self, engine_id: str, spec: GenerateSpec, sink: Sink) -> None:
        self._send(_Submit(engine_id, spec, sink))

    def abort(self, engine_id: str, *, notify: bool = False, reason: str = "cancelled") -> None:
        self._send(_Abort(engine_id, notify, reason))

    def call(self, fn: Callable[[Engine], Any]) -> concurrent.futures.Future:
        """Run fn(engine) on the engine thread between two steps; its result or exception."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._send(_Call(fn, future))
        return future

    def _send(self, command) -> None:
        with self._closing:
            if not self._closed:
                self._inbox.put(command)
                return
        # The thread has ended: nothing will ever read the inbox again.
        if isinstance(command, _Call):
            command.future.set_exception(EngineFailed("the engine loop has stopped"))
        elif isinstance(command, _Submit):
            error = EngineFailed("the engine has stopped")
            with contextlib.suppress(RuntimeError):  # a closed event loop: nobody listens
                self._loop.call_soon_threadsafe(command.sink, RejectedEvent(error))

    def apply_policy(self, change: PolicyChange) -> concurrent.futures.Future:
        """All of `change` or none of it (ValueError, the old policy stays)."""
        return self.call(lambda engine: self._apply_policy(engine, change))

    def stop(self) -> None:
        """Abort what is left (clients get FINISH_REASON_ABORT) and end the thread."""
        self._inbox.put(_Stop())

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        engine = None
        try:
            engine = self._build_engine()
            info = warm_up(engine)
            self._publish(engine)
        except BaseException as exc:
            log.exception("the engine failed to start")
            if engine is not None:  # tensor parallel: its other ranks must not outlive it
                try:
                    engine.close()
                except Exception:
                    log.exception("closing the engine that failed to start")
            with self._closing:
                self._closed = True
            self._drain_calls()
            self.ready.set_exception(exc)
            self.done.set_result(None)
            return
        self.ready.set_result(info)
        try:
            self._serve(engine)
        except BaseException as exc:
            log.exception("the engine loop failed")
            self._fail_all(EngineFailed(f"the engine failed: {exc!r}"))
        finally:
            with self._closing:
                self._closed = True
            self._drain_calls()
            try:
                engine.close()  # tensor parallel: the other ranks stop with it
            finally:
                self.done.set_result(None)

    def _serve(self, engine: Engine) -> None:
        while True:
            idle = not engine.has_unfinished_requests() and not self._needs_reclaim_step
            for command in self._take_commands(block=idle):
                if isinstance(command, _Stop):
                    for engine_id in list(self._streams):
                        self._abort(engine, engine_id, notify=True, reason="shutdown")
                    engine.step()  # completes the reclaim of the aborted requests' pages
                    self._publish(engine)
                    self._flush()
                    return
                self._apply(engine, command)
            if engine.has_unfinished_requests() or self._needs_reclaim_step:
                self._step(engine)
            # Publish before anyone hears of this round: a client that got its final message
            # (or a call's result) and then asks EngineStats sees at least this state.
            self._publish(engine)
            self._flush()

    def _take_commands(self, block: bool) -> list:
        commands = [self._inbox.get()] if block else []
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                return commands

    def _apply(self, engine: Engine, command) -> None:
        if isinstance(command, _Submit):
            self._add(engine, command)
        elif isinstance(command, _Abort):
            self._abort(engine, command.engine_id, command.notify, command.reason)
        elif isinstance(command, _Call):
            try:
                self._answers.append((command.future, command.fn(engine), None))
            except Exception as exc:
                self._answers.append((command.future, None, exc))

    def _add(self, engine: Engine, command: _Submit) -> None:
        spec = command.spec
        if self._max_waiting is not None and len(engine.scheduler.waiting) >= self._max_waiting:
            error = QueueFull(
                f"{len(engine.scheduler.waiting)} requests are already waiting "
                f"(--max-waiting {self._max_waiting}): retry later or on another replica"
            )
            self._post(command.sink, RejectedEvent(error))
            return
        try:
            engine.add_request(
                spec.prompt_token_ids,
                spec.params,
                request_id=command.engine_id,
                arrival_time=spec.arrival_time,
            )
        except ValueError as exc:
            # The server checked the prompt and the context length before submitting; what is
            # left depends on the pool and the policy: the request can never fit.
            self._post(
                command.sink, RejectedEvent(InvalidArgument("sampling.max_tokens", str(exc)))
            )
            return
        request = engine.requests[command.engine_id]
        self._streams[command.engine_id] = _Stream(request, command.sink)

    def _abort(self, engine: Engine, engine_id: str, notify: bool, reason: str) -> None:
        stream = self._streams.pop(engine_id, None)
        if stream is None:  # finished meanwhile, or never added: nothing was aborted
            return
        engine.abort(engine_id)
        engine.forget(engine_id)
        self._needs_reclaim_step = True
        self._observer.on_aborted(reason)
        if notify:
            self._post(stream.sink, _finished(stream, "aborted"))

    def _step(self, engine: Engine) -> None:
        started = time.monotonic()
        outputs = engine.step()
        self._needs_reclaim_step = False
        for stream in self._streams.values():
            if stream.scheduled_time is None and stream.request.status is not RequestStatus.WAITING:
                stream.scheduled_time = started
                self._observer.on_scheduled(
                    len(stream.request.prompt_token_ids), started - stream.request.arrival_time
                )
        self._deliver(engine, outputs)

    def _deliver(self, engine: Engine, outputs: list[RequestOutput]) -> None:
        num_new = 0
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            num_new += len(out.new_token_ids)
            self._post(stream.sink, TokensEvent(tuple(out.new_token_ids)))
            if out.error is not None:  # the engine gave up on it: the client is told why
                del self._streams[out.request_id]
                engine.forget(out.request_id)
                self._observer.on_aborted(out.finish_reason)
                error = (
                    InvalidArgument("prompt", out.error)
                    if out.finish_reason == "refused"
                    else RequestFailed(out.error)
                )
                self._post(stream.sink, RejectedEvent(error))
                continue
            if out.finished:
                del self._streams[out.request_id]
                engine.forget(out.request_id)
                finished = _finished(stream, out.finish_reason or "stopped")
                self._observer.on_finished(finished, tuple(stream.request.token_times))
                self._post(stream.sink, finished)
        self._observer.on_tokens(num_new)

    def _post(self, sink: Sink, event: Event) -> None:
        self._pending.append((sink, event))

    def _flush(self) -> None:
        """Answer this round's calls, then send its events: one wake-up of the event loop."""
        answers, self._answers = self._answers, []
        for future, result, exc in answers:
            if not future.set_running_or_notify_cancel():
                continue
            if exc is None:
                future.set_result(result)
            else:
                future.set_exception(exc)
        batch, self._pending = self._pending, []
        if not batch or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # a closed event loop: nobody listens any more
            self._loop.call_soon_threadsafe(_deliver_batch, batch)

    def _fail_all(self, error: EngineFailed) -> None:
        for stream in self._streams.values():
            self._post(stream.sink, RejectedEvent(error))
        self._streams.clear()
        self._flush()

    def _drain_calls(self) -> None:
        """Answer what was sent before the inbox closed (nothing arrives after)."""
        for command in self._take_commands(block=False):
            if isinstance(command, _Call):
                command.future.set_exception(EngineFailed("the engine loop has stopped"))
            elif isinstance(command, _Submit):
                self._post(command.sink, RejectedEvent(EngineFailed("the engine has stopped")))
        self._flush()

    def _apply_policy(self, engine: Engine, change: PolicyChange) -> int:
        """Runs on the engine thread. Checks everything before changing anything."""
        ranking = change.ranking
        engine.apply_policy(change.tunables, ranking)  # all or nothing (live_policy.py)
        self._policy_version = change.version
        log.info(
            "policy version %d applied: %s%s",
            change.version,
            change.tunables,
            f", ranking {ranking.source!r}" if ranking is not None else "",
        )
        return change.version

    def _publish(self, engine: Engine) -> None:
        self.snapshot = take_snapshot(engine, self._policy_version)
        self._observer.on_snapshot(self.snapshot)


def _deliver_batch(batch: list[tuple[Sink, Event]]) -> None:
    for sink, event in batch:
        sink(event)


def _finished(stream: _Stream, finish_reason: str) -> FinishedEvent:
    r = stream.request
    last = r.token_times[-1] if r.token_times else (r.finish_time or time.monotonic())
    scheduled = stream.scheduled_time if stream.scheduled_time is not None else last
    return FinishedEvent(
        finish_reason,
        Usage(
            len(r.prompt_token_ids),
            len(r.output_token_ids),
            r.num_preemptions,
            r.num_cached_tokens or 0,
        ),
        Timing(
            queue_seconds=scheduled - r.arrival_time,
            time_to_first_token_seconds=r.ttft or 0.0,
            mean_inter_token_seconds=r.tpot or 0.0,
            e2e_seconds=last - r.arrival_time,  # to the last token, as the proto says
        ),
    )
