"""Who watches which deployment, and the xDS ACK/NACK state machine of each watch.

One `Watch` per open WatchPolicy stream. The control plane pushes a version with a fresh
nonce; the data plane answers with that nonce: an ACK echoes the pushed version, a NACK
carries its previous version and an error. An answer whose nonce is not the latest one
sent on the stream is stale and changes nothing. The current version is pushed when it is
neither what the node reported on connect (or applied since) nor what was last pushed to
it: a NACKed version is not pushed again on the same stream, and a node ahead of a control
plane that lost its history (numbering from 1 again) still gets the current policy.

The registry keeps one record per (deployment, node id). A watch with a node id whose
stream is still connected is refused (AlreadyExists): it would end that node's stream
and answer pushes in its place. A node reconnecting after its stream broke finds the
record disconnected and takes it over (a higher `generation`), so the old stream's late
answers or disconnect cannot touch it; a stream that broke unseen (a vanished host) is
ended by the server's keepalive pings. No gRPC here: servicers.py drives a Watch.

The registry is bounded, since anyone who reaches the port may open a watch: a record
whose node is disconnected and unseen for `ttl_s` is dropped, and at `max_subscribers`
records a new node takes the place of the longest-unseen disconnected one, or is refused
(ResourceExhausted) when all are connected. With NACK errors kept to MAX_ERROR_CHARS,
ListSubscribers of a full registry stays under gRPC's default 4 MiB message limit.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from rimuru.controlplane.errors import AlreadyExists, InvalidArgument, ResourceExhausted
from rimuru.controlplane.policy import Policy, check_deployment

MAX_NODE_ID_LEN = 253
MAX_ERROR_CHARS = 512
DEFAULT_MAX_SUBSCRIBERS = 1024
DEFAULT_TTL_S = 3600.0


@dataclass(frozen=True)
class Subscriber:
    """A data plane as ListSubscribers shows it."""

    node_id: str
    deployment: str
    applied_version: int = 0
    pushed_version: int = 0
    last_error: str = ""  # of the last NACK; cleared by the next ACK
    last_nacked_version: int = 0
    connected: bool = False
    last_seen_unix_seconds: float = 0.0


class Answer(Enum):
    ACK = "ack"
    NACK = "nack"
    STALE = "stale"


@dataclass
class _Record:
    view: Subscriber
    generation: int = 0
    nonce: str = ""  # latest push not yet answered; "" = nothing outstanding


class Watch:
    """One open stream: waits for pushable versions and takes the node's answers."""

    def __init__(
        self,
        registry: SubscriberRegistry,
        key: tuple[str, str],
        generation: int,
        current_policy: Callable[[str], Policy | None],
    ) -> None:
        self._registry = registry
        self._key = key
        self._generation = generation
        self._current_policy = current_policy
        self._wake = asyncio.Event()
        self._closed = False

    @property
    def deployment(self) -> str:
        return self._key[0]

    @property
    def node_id(self) -> str:
        return self._key[1]

    def wake(self) -> None:
        self._wake.set()

    async def next_push(self) -> tuple[Policy, str] | None:
        """Wait for a version the node neither runs nor was sent; None once the watch is
        closed. Not only a newer one: a control plane that lost its history numbers from 1
        again, and a node that applied a higher number must still get the current policy
        (the store is the source of truth; docs/kubernetes.md).

        Returns the policy and the nonce the node must echo; the push is recorded as sent.
        """
        while not self._closed:
            # Clear before looking, so a version stored in between still wakes us.
            self._wake.clear()
            record = self._registry._own(self._key, self._generation)
            if record is None:
                return None
            policy = self._current_policy(self.deployment)
            seen = (record.view.applied_version, record.view.pushed_version)
            if policy is not None and policy.version not in seen:
                nonce = secrets.token_hex(8)
                record.nonce = nonce
                record.view = replace(record.view, pushed_version=policy.version)
                return policy, nonce
            await self._wake.wait()
        return None

    def answer(self, version_info: int, nonce: str, error_detail: str) -> Answer:
        record = self._registry._own(self._key, self._generation)
        if record is None:
            return Answer.STALE
        record.view = replace(record.view, last_seen_unix_seconds=self._registry.clock())
        if not nonce or nonce != record.nonce:
            return Answer.STALE
        record.nonce = ""  # answered: a repeat of this nonce is stale
        if error_detail:
            # A NACK's version_info is what the node still runs; it also covers an ACK
            # that was overtaken by this push and so went stale.
            record.view = replace(
                record.view,
                applied_version=version_info,
                last_error=error_detail[:MAX_ERROR_CHARS],
                last_nacked_version=record.view.pushed_version,
            )
            return Answer.NACK
        record.view = replace(record.view, applied_version=version_info, last_error="")
        return Answer.ACK

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        record = self._registry._own(self._key, self._generation)
        if record is not None:
            record.view = replace(
                record.view, connected=False, last_seen_unix_seconds=self._registry.clock()
            )
        self._registry._watches.get(self._key[0], set()).discard(self)


class SubscriberRegistry:
    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        *,
        max_subscribers: int = DEFAULT_MAX_SUBSCRIBERS,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        if max_subscribers < 1 or not ttl_s > 0:
            raise ValueError(
                f"max_subscribers must be >= 1 and ttl_s > 0; got {max_subscribers}, {ttl_s}"
            )
        self.clock = clock
        self.max_subscribers = max_subscribers
        self.ttl_s = ttl_s
        self._records: dict[tuple[str, str], _Record] = {}
        self._watches: dict[str, set[Watch]] = {}

    def open_watch(
        self,
        node_id: str,
        deployment: str,
        applied_version: int,
        current_policy: Callable[[str], Policy | None],
    ) -> Watch:
        check_deployment(deployment)
        if not node_id or len(node_id) > MAX_NODE_ID_LEN or not node_id.isprintable():
            raise InvalidArgument(
                "node_id", f"must be 1..{MAX_NODE_ID_LEN} printable characters (e.g. the pod name)"
            )
        key = (deployment, node_id)
        self._expire()
        record = self._records.get(key)
        if record is not None and record.view.connected:
            raise AlreadyExists(
                f"node {node_id!r} of deployment {deployment!r} is connected on another "
                "stream: give each data plane its own --node-id"
            )
        if record is None:
            self._make_room()
            record = self._records[key] = _Record(Subscriber(node_id, deployment))
        record.generation += 1
        record.nonce = ""
        # The node's report on connect is the truth: it may have restarted with nothing.
        record.view = replace(
            record.view,
            applied_version=applied_version,
            pushed_version=0,
            connected=True,
            last_seen_unix_seconds=self.clock(),
        )
        watch = Watch(self, key, record.generation, current_policy)
        self._watches.setdefault(deployment, set()).add(watch)
        return watch

    def notify(self, deployment: str) -> None:
        """A new version of `deployment` exists: every watch of it looks again."""
        for watch in self._watches.get(deployment, ()):
            watch.wake()

    def list(self, deployment: str = "") -> list[Subscriber]:
        self._expire()
        views = [r.view for r in self._records.values()]
        if deployment:
            views = [v for v in views if v.deployment == deployment]
        return sorted(views, key=lambda v: (v.deployment, v.node_id))

    def _expire(self) -> None:
        oldest_kept = self.clock() - self.ttl_s
        for key, record in list(self._records.items()):
            if not record.view.connected and record.view.last_seen_unix_seconds < oldest_kept:
                del self._records[key]

    def _make_room(self) -> None:
        if len(self._records) < self.max_subscribers:
            return
        disconnected = [k for k, r in self._records.items() if not r.view.connected]
        if not disconnected:
            raise ResourceExhausted(
                f"{self.max_subscribers} data planes are connected already: the control "
                "plane watches no more"
            )
        del self._records[
            min(disconnected, key=lambda k: self._records[k].view.last_seen_unix_seconds)
        ]

    def _own(self, key: tuple[str, str], generation: int) -> _Record | None:
        """The record, if the watch of this generation still owns it."""
        record = self._records.get(key)
        return record if record is not None and record.generation == generation else None
