"""Data-plane side of the control plane: follow policy pushes, report routing counts.

`PolicyWatcher` keeps one WatchPolicy stream open (xDS semantics, see control.proto):
on every (re)connect it sends the version it has applied, so the control plane pushes
only a version it does not run; each push goes to the `apply` callback (sync or async): returning is an
ACK, a ValueError a NACK with its message (the previous version stays applied), and any
other exception a NACK marked "internal error" with the trace logged.
When the control plane is unreachable the last applied policy simply stays in force and
the watcher retries with exponential backoff and jitter.

`RoutingReporter` streams per-layer expert routing counts every `interval_s` for online
hotness; counts that could not be sent are kept and sent with the next report.

Imports only rimuru.v1 (the data plane may not import rimuru.controlplane).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import grpc

from rimuru.rpc import MAX_MESSAGE_BYTES, message_size_options
from rimuru.v1 import control_pb2 as pb
from rimuru.v1 import control_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

# A push handler: apply atomically or raise ValueError (-> NACK with its message).
ApplyFn = Callable[[pb.PolicyUpdate], Awaitable[None] | None]
# Per-layer routing counts since the previous call: {layer: [count per expert]}.
CountsFn = Callable[[], Mapping[int, Sequence[int]]]

# Pings keep a quiet stream honest: a control plane that vanished without closing the
# connection is noticed within keepalive_time + keepalive_timeout.
CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
)


# Codes that end a stream which connected but will fail the same way again (our node id
# is in use, a push over the receive limit, a bad token): the backoff keeps growing
# rather than restarting from its shortest delay after each such connect.
REFUSALS = frozenset(
    {
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }
)


@dataclass(frozen=True)
class Backoff:
    """gRPC's connection backoff: initial * multiplier**attempt, capped, +-jitter."""

    initial_s: float = 0.5
    multiplier: float = 1.6
    max_s: float = 30.0
    jitter: float = 0.2

    def delay(self, attempt: int, rng: random.Random) -> float:
        base = min(self.max_s, self.initial_s * self.multiplier**attempt)
        return base * (1.0 + rng.uniform(-self.jitter, self.jitter))


def open_channel(
    target: str, root_certificates: bytes | None, max_message_bytes: int = MAX_MESSAGE_BYTES
) -> grpc.aio.Channel:
    options = CHANNEL_OPTIONS + message_size_options(max_message_bytes)
    if root_certificates is None:
        return grpc.aio.insecure_channel(target, options=options)
    credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
    return grpc.aio.secure_channel(target, credentials, options=options)


class PolicyWatcher:
    def __init__(
        self,
        target: str,
        node_id: str,
        deployment: str,
        apply: ApplyFn,
        *,
        applied_version: int = 0,
        root_certificates: bytes | None = None,
        backoff: Backoff = Backoff(),
        rng: random.Random | None = None,
        token: str | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        """applied_version: what the node runs already (0 = start-up flags only).
        token: the data planes' bearer token (a control plane with one requires it).
        max_message_bytes: the receive limit; a larger push ends the stream (no nonce to
        NACK) with RESOURCE_EXHAUSTED, and the watcher backs off as from any refusal."""
        self._max_message_bytes = max_message_bytes
        self._metadata = _bearer(token)
        self.target = target
        self.node_id = node_id
        self.deployment = deployment
        self._apply = apply
        self._root_certificates = root_certificates
        self._backoff = backoff
        self._rng = rng or random.Random()
        self.applied_version = applied_version
        # (MoE layers, experts per layer), sent on connect: the control plane checks
        # rankings against it. (0, 0) = unknown.
        self.model_shape = (0, 0)
        self.last_applied: pb.PolicyUpdate | None = None
        self.num_connects = 0
        self.num_pushes = 0  # updates received, applied or NACKed
        self.connected = False
        self._changed = asyncio.Condition()

    async def run(self) -> None:
        """Follow the control plane until cancelled.

        The backoff starts over only after a stream that was up: it delivered a push, or
        it lasted the longest delay. One that connected and ended without either is a
        refusal, whatever its code: a control plane that refuses a watch at once (registry
        full, bad identity) may end it while the opening is still in flight, and gRPC's
        client then reports CANCELLED or INTERNAL in place of the server's status;
        restarting the backoff on those would reconnect to a full control plane every few
        tens of milliseconds."""
        attempt = 0
        while True:
            num_pushes_before = self.num_pushes
            started = time.monotonic()
            refused = False
            try:
                await self._follow_once()
                reason = "stream ended"
            except grpc.aio.AioRpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
                refused = exc.code() in REFUSALS
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    reason += (
                        f" (a push over this node's {self._max_message_bytes}-byte receive "
                        "limit? Both planes must use rimuru.rpc.MAX_MESSAGE_BYTES)"
                    )
            await self._set_connected(False)
            was_up = self.num_pushes > num_pushes_before or (
                time.monotonic() - started >= self._backoff.max_s
            )
            if was_up and not refused:
                attempt = 0  # start over from the shortest delay
            delay = self._backoff.delay(attempt, self._rng)
            attempt += 1
            log.warning(
                "policy watch %s: %s; retrying in %.1f s, keeping version %d",
                self.target,
                reason,
                delay,
                self.applied_version,
            )
            await asyncio.sleep(delay)

    async def wait_for(self, predicate: Callable[[PolicyWatcher], bool]) -> None:
        """Block until `predicate(self)` holds (checked after every state change)."""
        async with self._changed:
            await self._changed.wait_for(lambda: predicate(self))

    async def _follow_once(self) -> None:
        answers: asyncio.Queue[pb.PolicyDiscoveryRequest] = asyncio.Queue()
        opening = self._request(version_info=self.applied_version)
        opening.num_layers, opening.num_experts = self.model_shape
        answers.put_nowait(opening)

        async def requests():
            while True:
                yield await answers.get()

        channel = open_channel(self.target, self._root_certificates, self._max_message_bytes)
        async with channel:
            call = pb_grpc.PolicyDiscoveryServiceStub(channel).WatchPolicy(
                requests(), metadata=self._metadata
            )
            try:
                await call.wait_for_connection()
                self.num_connects += 1
                await self._set_connected(True)
                newest_on_stream = 0
                async for update in call:
                    self.num_pushes += 1
                    answers.put_nowait(await self._handle(update, newest_on_stream))
                    if update.version > newest_on_stream and self.applied_version == update.version:
                        newest_on_stream = update.version
                    await self._notify()
            finally:
                call.cancel()

    async def _handle(
        self, update: pb.PolicyUpdate, newest_on_stream: int
    ) -> pb.PolicyDiscoveryRequest:
        try:
            check_push(update, newest_on_stream)
            result = self._apply(update)
            if inspect.isawaitable(result):
                await result
        except ValueError as exc:
            log.warning("policy version %d rejected: %s", update.version, exc)
            return self._request(self.applied_version, update.nonce, str(exc) or "rejected")
        except Exception as exc:
            # A bug in apply must not end the watch (the node would stop following
            # policies silently): NACK it, so ListSubscribers shows it, and log the trace.
            log.exception("applying policy version %d failed", update.version)
            detail = f"internal error: {type(exc).__name__}: {exc}"
            return self._request(self.applied_version, update.nonce, detail)
        self.applied_version = update.version
        self.last_applied = update
        log.info("policy version %d applied", update.version)
        return self._request(update.version, update.nonce)

    def _request(
        self, version_info: int, nonce: str = "", error_detail: str = ""
    ) -> pb.PolicyDiscoveryRequest:
        return pb.PolicyDiscoveryRequest(
            node_id=self.node_id,
            deployment=self.deployment,
            version_info=version_info,
            response_nonce=nonce,
            error_detail=error_detail,
        )

    async def _set_connected(self, connected: bool) -> None:
        self.connected = connected
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


class RoutingReporter:
    def __init__(
        self,
        target: str,
        node_id: str,
        deployment: str,
        counts: CountsFn,
        *,
        interval_s: float = 10.0,
        root_certificates: bytes | None = None,
        backoff: Backoff = Backoff(),
        rng: random.Random | None = None,
        token: str | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0; got {interval_s}")
        # Reports move the online hotness ranking, so a control plane with a token wants it.
        self._metadata = _bearer(token)
        self.target = target
        self.node_id = node_id
        self.deployment = deployment
        self._counts = counts
        self._interval_s = interval_s
        self._root_certificates = root_certificates
        self._backoff = backoff
        self._rng = rng or random.Random()
        self._unsent: dict[int, list[int]] = {}
        self.num_reports_sent = 0

    async def run(self) -> None:
        """Report until cancelled."""
        attempt = 0
        while True:
            num_sent_before = self.num_reports_sent
            try:
                await self._report_once()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                # InvalidStateError: a write on a stream the server already closed (the
                # control plane went away between two reports) — as retryable as an RPC error.
                if self.num_reports_sent > num_sent_before:
                    attempt = 0
                delay = self._backoff.delay(attempt, self._rng)
                attempt += 1
                reason = (
                    exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "stream closed"
                )
                log.warning(
                    "routing reports to %s: %s; retrying in %.1f s",
                    self.target,
                    reason,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _report_once(self) -> None:
        async with open_channel(self.target, self._root_certificates) as channel:
            call = pb_grpc.PolicyDiscoveryServiceStub(channel).ReportRouting(
                metadata=self._metadata
            )
            try:
                while True:
                    await asyncio.sleep(self._interval_s)
                    self._take_counts()
                    if not self._unsent:
                        continue
                    await call.write(self._report())
                    self._unsent.clear()
                    self.num_reports_sent += 1
            finally:
                call.cancel()

    def _take_counts(self) -> None:
        for layer, row in self._counts().items():
            kept = self._unsent.setdefault(layer, [0] * len(row))
            if len(kept) != len(row):  # a different shape: the newer counts win
                kept[:] = [0] * len(row)
            for e, c in enumerate(row):
                kept[e] += int(c)

    def _report(self) -> pb.RoutingReport:
        return pb.RoutingReport(
            node_id=self.node_id,
            deployment=self.deployment,
            layers=[
                pb.LayerRoutingCounts(layer=layer, counts=row)
                for layer, row in sorted(self._unsent.items())
            ],
        )


def check_push(update: pb.PolicyUpdate, newest_on_stream: int) -> None:
    """What control.proto promises of a push (ValueError -> NACK). A version may be lower
    than the one the node runs only as a stream's first push: a control plane that lost
    its history numbers from 1 again, and the store there is the source of truth."""
    if update.version < 1:
        raise ValueError(f"version: must be >= 1; got {update.version}")
    if update.HasField("policy") and update.policy.version != update.version:
        raise ValueError(
            f"policy.version: {update.policy.version} differs from the push's {update.version}"
        )
    if update.version <= newest_on_stream:
        raise ValueError(
            f"version: {update.version} is not newer than version {newest_on_stream}, "
            "applied earlier on this stream"
        )


def _bearer(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {token}"),) if token else None
