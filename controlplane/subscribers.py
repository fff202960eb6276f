"""Who watches which deployment, and the xDS ACK/NACK state machine of each watch.

One `Watch` per open WatchPolicy stream. The control plane pushes a version with a fresh
nonce; the data plane answers with that nonce: an ACK echoes the pushed version, a NACK
carries its previous version and an error. An answer whose nonce is not the latest one
sent on the stream is stale and changes nothing. The current version is pushed when it is
neither what the node reported on connect (or applied since) nor what was last pushed to
it: a NACKed version is not pushed again on the same stream, and a node ahead of a control
plane that lost its history (numbering from 1 again) still gets the current policy.

The registry keeps one record per (deployment, node id); a reconnecting node takes its
record over (a higher `generation`), so the old stream's late answers or disconnect
cannot touch it. No gRPC here: servicers.py drives a Watch.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from rimuru.controlplane.errors import InvalidArgument
from rimuru.controlplane.policy import Policy, check_deployment

MAX_NODE_ID_LEN = 253


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
                last_error=error_detail[:4096],
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
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
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
        record = self._records.get(key)
        if record is None:
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
        # An older stream of this node (not yet seen broken) wakes, finds it lost the
        # record and ends.
        for old in self._watches.get(deployment, ()):
            if old.node_id == node_id:
                old.wake()
        watch = Watch(self, key, record.generation, current_policy)
        self._watches.setdefault(deployment, set()).add(watch)
        return watch

    def notify(self, deployment: str) -> None:
        """A new version of `deployment` exists: every watch of it looks again."""
        for watch in self._watches.get(deployment, ()):
            watch.wake()

    def list(self, deployment: str = "") -> list[Subscriber]:
        views = [r.view for r in self._records.values()]
        if deployment:
            views = [v for v in views if v.deployment == deployment]
        return sorted(views, key=lambda v: (v.deployment, v.node_id))

    def _own(self, key: tuple[str, str], generation: int) -> _Record | None:
        """The record, if the watch of this generation still owns it."""
        record = self._records.get(key)
        return record if record is not None and record.generation == generation else None
