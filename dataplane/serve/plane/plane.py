"""The data plane's domain object on the event loop: lifecycle, admission, request streams.

Lifecycle (health follows it; see server.py):

    loading ──(engine built, warmed up, tokenizer loaded)──> serving ──(SIGTERM)──> draining
       │                                                        │                       │
       └──────────────(engine thread failed)──────────────> failed            stopped <─┘

Only `serving` admits requests; the others answer UNAVAILABLE (or INTERNAL once failed).
The servicer translates protos and calls in here; the engine thread is reached only
through EngineLoop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable

from rimuru.dataplane.model.tokenizer import Tokenizer
from rimuru.dataplane.serve.plane.engine_loop import EngineLoop
from rimuru.dataplane.serve.plane.errors import EngineFailed, Unavailable
from rimuru.dataplane.serve.plane.events import (
    EngineSnapshot,
    Event,
    FinishedEvent,
    GenerateSpec,
    ModelInfo,
    RejectedEvent,
)

log = logging.getLogger("rimuru.serve")

LOADING, SERVING, DRAINING, STOPPED, FAILED = "loading", "serving", "draining", "stopped", "failed"
_ABORT_DELIVERY_S = 5.0  # after the grace: time for aborted streams to get their final message


class RequestStream:
    """One Generate call's events, in order; closing it early aborts the request."""

    def __init__(self, plane: DataPlane, engine_id: str) -> None:
        self.engine_id = engine_id
        self._plane = plane
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self.done = False  # the engine is finished with it (final or rejected received)

    def put(self, event: Event) -> None:
        """Sink for the engine thread's events (runs on the event loop)."""
        if isinstance(event, FinishedEvent | RejectedEvent):
            self.done = True
            self._plane._forget(self)
        self._events.put_nowait(event)

    async def next_event(self) -> Event:
        """The next event; iterating afterwards goes on from the one after it."""
        return await self._events.get()

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, FinishedEvent | RejectedEvent):
                return

    def close(self, reason: str = "cancelled") -> None:
        """Idempotent. Before the end: the client went away -> abort; reason: "cancelled"
        or "deadline" (the client's), counted in rimuru_request_aborted_total."""
        if not self.done:
            self.done = True
            self._plane._forget(self)
            self._plane.engine.abort(self.engine_id, reason=reason)


class DataPlane:
    def __init__(
        self,
        engine: EngineLoop,
        load_tokenizer: Callable[[ModelInfo], Tokenizer | None] = lambda info: None,
    ) -> None:
        self.engine = engine
        self.state = LOADING
        self.info: ModelInfo | None = None
        self.tokenizer: Tokenizer | None = None
        self._load_tokenizer = load_tokenizer
        self._streams: dict[str, RequestStream] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._ids = itertools.count()
        self._on_state: list[Callable[[str], None]] = []

    def on_state_change(self, callback: Callable[[str], None]) -> None:
        self._on_state.append(callback)

    def _set_state(self, state: str) -> None:
        if state != self.state:
            log.info("data plane %s -> %s", self.state, state)
            self.state = state
            for callback in self._on_state:
                callback(state)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> ModelInfo:
        """Start the engine thread; returns once the model is loaded and warmed up."""
        self.engine.start(asyncio.get_running_loop())
        try:
            info = await asyncio.wrap_future(self.engine.ready)
            self.tokenizer = await asyncio.to_thread(self._load_tokenizer, info)
        except BaseException:
            self._set_state(FAILED)
            raise
        self.info = info
        asyncio.wrap_future(self.engine.done).add_done_callback(self._engine_exited)
        self._set_state(SERVING)
        return info

    def _engine_exited(self, _future) -> None:
        if self.state in (LOADING, SERVING, DRAINING):  # nobody asked it to stop: it failed
            self._set_state(FAILED)

    async def drain(self, grace_s: float) -> int:
        """Stop admitting; wait up to grace_s for in-flight streams; abort the rest.

        Returns how many streams were aborted (their clients get FINISH_REASON_ABORT)."""
        if self.state == SERVING:
            self._set_state(DRAINING)
        left: list[str] = []
        try:
            if not self._idle.is_set():
                await asyncio.wait_for(self._idle.wait(), timeout=max(0.0, grace_s))
        except TimeoutError:
            left = list(self._streams)
            for engine_id in left:
                self.engine.abort(engine_id, notify=True, reason="shutdown")
            log.warning("drain: grace of %.1f s over, aborted %d streams", grace_s, len(left))
        # The aborted streams still send their final message (FINISH_REASON_ABORT).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout=_ABORT_DELIVERY_S)
        return len(left)

    async def stop(self) -> None:
        """End the engine thread (after drain). Safe to call more than once."""
        if self.state != FAILED:
            self._set_state(STOPPED)
        self.engine.stop()
        await asyncio.to_thread(self.engine.join)

    # ------------------------------------------------------------------ requests
    def require_serving(self) -> ModelInfo:
        if self.state == SERVING and self.info is not None:
            return self.info
        if self.state == FAILED:
            raise EngineFailed("the engine failed; this replica is unhealthy")
        if self.state == LOADING:
            raise Unavailable("the model is loading: retry once health reports SERVING")
        raise Unavailable("the server is shutting down: retry on another replica")

    def open_stream(self, spec: GenerateSpec) -> RequestStream:
        self.require_serving()
        engine_id = f"{spec.client_request_id or 'req'}#{next(self._ids)}"
        stream = RequestStream(self, engine_id)
        self._streams[engine_id] = stream
        self._idle.clear()
        self.engine.submit(engine_id, spec, stream.put)
        return stream

    def _forget(self, stream: RequestStream) -> None:
        self._streams.pop(stream.engine_id, None)
        if not self._streams:
            self._idle.set()

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    def snapshot(self) -> EngineSnapshot:
        snapshot = self.engine.snapshot
        if snapshot is None:
            raise Unavailable("the model is loading: retry once health reports SERVING")
        return snapshot
