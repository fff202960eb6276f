"""The data plane's link to the control plane: follow policy pushes, report routing counts.

The xDS mechanics (streams, ACK/NACK, reconnects with backoff and jitter) are
policy_watch.py's; this module only connects them to the engine thread:

  * a push is converted (a version that does not convert is NACKed) and handed to the
    engine thread, which applies all of it between two steps or raises ValueError (NACK,
    the old policy stays);
  * routing counts are the increments of the engine's cumulative counters, read from the
    snapshots the engine thread publishes (the event loop never touches the engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import torch

from rimuru.dataplane.serve.grpc_front import convert
from rimuru.dataplane.serve.grpc_front.policy_watch import Backoff, PolicyWatcher, RoutingReporter
from rimuru.dataplane.serve.plane.engine_loop import EngineLoop
from rimuru.dataplane.serve.plane.errors import EngineFailed
from rimuru.dataplane.serve.plane.events import EngineSnapshot
from rimuru.v1 import control_pb2 as cpb

log = logging.getLogger("rimuru.serve.control")


@dataclass(frozen=True)
class ControlPlaneLink:
    """Where the control plane is and who this data plane is to it."""

    target: str  # host:port
    deployment: str
    node_id: str
    report_interval_s: float = 10.0
    backoff: Backoff = field(default_factory=Backoff)
    token: str | None = None  # the data planes' bearer token: WatchPolicy, ReportRouting
    root_certificates: bytes | None = None  # PEM CA of a TLS control plane; None = plaintext


class RoutingDeltas:
    """Per-layer routing counts since the previous call, from cumulative snapshots."""

    def __init__(self, latest: Callable[[], EngineSnapshot | None]) -> None:
        self._latest = latest
        snapshot = latest()
        self._last = snapshot.routing_counts if snapshot is not None else None

    def __call__(self) -> dict[int, list[int]]:
        snapshot = self._latest()
        if snapshot is None:
            return {}
        counts = snapshot.routing_counts  # [L, E]
        last = self._last
        if last is None or last.shape != counts.shape or bool((counts < last).any()):
            last = torch.zeros_like(counts)  # counters were reset: count from zero again
        self._last = counts
        delta = counts - last
        if not bool(delta.any()):
            return {}
        # Every layer, zeros included: the control plane takes a report of layers 0..L-1.
        return dict(enumerate(delta.tolist()))


class PolicyFollower:
    """Runs the watcher and the reporter as tasks of the current event loop."""

    def __init__(self, link: ControlPlaneLink, engine: EngineLoop) -> None:
        self.link = link
        self._engine = engine
        self.watcher = PolicyWatcher(
            link.target,
            link.node_id,
            link.deployment,
            self._apply,
            backoff=link.backoff,
            root_certificates=link.root_certificates,
            token=link.token,
        )
        self.reporter = RoutingReporter(
            link.target,
            link.node_id,
            link.deployment,
            RoutingDeltas(lambda: engine.snapshot),
            interval_s=link.report_interval_s,
            backoff=link.backoff,
            token=link.token,
            root_certificates=link.root_certificates,
        )
        self._tasks: list[asyncio.Task] = []
        self._rng = random.Random()

    def start(self) -> None:
        """After the engine is up: its snapshot gives the model's shape."""
        snapshot = self._engine.snapshot
        if snapshot is not None:
            num_layers, num_experts = snapshot.routing_counts.shape
            self.watcher.model_shape = (int(num_layers), int(num_experts))
        self._tasks = [
            asyncio.create_task(self._supervise(self.watcher.run), name="rimuru-policy-watch"),
            asyncio.create_task(self._supervise(self.reporter.run), name="rimuru-routing-report"),
        ]
        log.info(
            "following policies of %r on %s as %r",
            self.link.deployment,
            self.link.target,
            self.link.node_id,
        )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _supervise(self, run: Callable[[], Awaitable[None]]) -> None:
        """Restart `run` if it ends on an error it does not retry itself.

        The watcher and reporter retry failed RPCs, but a write on a stream the control
        plane already closed raises asyncio.InvalidStateError, which ended the reporter
        for good; the data plane must keep reporting after a control-plane restart."""
        attempt = 0
        while True:
            started = time.monotonic()
            try:
                await run()
                return
            except Exception as exc:
                if time.monotonic() - started > self.link.backoff.max_s:
                    attempt = 0  # it ran for a while: start over from the shortest delay
                delay = self.link.backoff.delay(attempt, self._rng)
                attempt += 1
                log.warning("%s ended on %r; restarting in %.1f s", run.__qualname__, exc, delay)
                await asyncio.sleep(delay)

    async def _apply(self, update: cpb.PolicyUpdate) -> None:
        change = convert.policy_change(update)  # ValueError -> NACK
        try:
            await asyncio.wrap_future(self._engine.apply_policy(change))  # ValueError -> NACK
        except EngineFailed as exc:
            raise ValueError(str(exc)) from None
