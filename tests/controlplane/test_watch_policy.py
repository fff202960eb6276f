"""WatchPolicy's xDS semantics over real gRPC: push, ACK, NACK, stale nonces, reconnects."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from rimuru.v1 import control_pb2 as pb
from tests.controlplane.conftest import TOKEN

GOOD = pb.Tunables(
    mode=pb.MODE_ELASTIC,
    shrink_threshold=2,
    grow_threshold=9,
    max_grow_per_round=5,
)

# The control plane of these tests has one token: watches need it (auth.py).
AUTH = (("authorization", f"Bearer {TOKEN}"),)


class RawNode:
    """A hand-driven data plane: sends exactly what the test says, reads pushes."""

    def __init__(
        self,
        stub,
        node_id: str,
        deployment: str = "qwen",
        version: int = 0,
        *,
        shape: tuple[int, int] = (0, 0),
        metadata=None,
    ) -> None:
        self.node_id, self.deployment = node_id, deployment
        self._out: asyncio.Queue = asyncio.Queue()
        opening = self.request(version)
        opening.num_layers, opening.num_experts = shape
        self._out.put_nowait(opening)
        self.call = stub.WatchPolicy(self._requests(), metadata=metadata)
        self._pending: asyncio.Future | None = None

    async def _requests(self):
        while True:
            yield await self._out.get()

    def request(self, version: int, nonce: str = "", error: str = "") -> pb.PolicyDiscoveryRequest:
        return pb.PolicyDiscoveryRequest(
            node_id=self.node_id,
            deployment=self.deployment,
            version_info=version,
            response_nonce=nonce,
            error_detail=error,
        )

    def send(self, version: int, nonce: str, error: str = "") -> None:
        self._out.put_nowait(self.request(version, nonce, error))

    async def push(self, timeout: float = 5.0) -> pb.PolicyUpdate:
        update = await asyncio.wait_for(asyncio.shield(self._read()), timeout)
        self._pending = None
        return update

    async def no_push(self, wait_s: float = 0.3) -> None:
        pending = self._read()
        done, _ = await asyncio.wait({pending}, timeout=wait_s)
        assert not done, f"unexpected push: {pending.result()}"

    def _read(self) -> asyncio.Future:
        """The read in flight; it survives a timeout, so no push is lost between waits."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self.call.read())
        return self._pending


async def set_policy(policy_stub, auth, **changes) -> pb.Policy:
    tunables = pb.Tunables()
    tunables.CopyFrom(GOOD)
    for name, value in changes.items():
        setattr(tunables, name, value)
    return await policy_stub.SetPolicy(
        pb.SetPolicyRequest(deployment="qwen", tunables=tunables), metadata=auth
    )


async def subscriber(policy_stub, node_id: str) -> pb.Subscriber:
    listed = await policy_stub.ListSubscribers(pb.ListSubscribersRequest(deployment="qwen"))
    return next(s for s in listed.subscribers if s.node_id == node_id)


async def eventually(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_ack_nack_and_stale_nonces(policy_stub, discovery_stub, auth):
    await set_policy(policy_stub, auth, expert_offload_limit=1)
    node = RawNode(discovery_stub, "pod-a", metadata=AUTH)
    first = await node.push()
    assert first.version == 1 and first.policy.tunables.expert_offload_limit == 1
    assert first.nonce and not first.HasField("ranking")
    node.send(1, first.nonce)  # ACK

    async def acked() -> bool:
        s = await subscriber(policy_stub, "pod-a")
        return s.applied_version == 1 and s.connected

    await eventually(acked)

    # Version 2 is pushed to the open stream; the node NACKs it.
    await set_policy(policy_stub, auth, expert_offload_limit=2)
    second = await node.push()
    assert second.version == 2 and second.nonce != first.nonce
    node.send(1, second.nonce, "expert_offload_limit 2 exceeds this model's 1")

    async def nacked() -> bool:
        s = await subscriber(policy_stub, "pod-a")
        return s.last_error != ""

    await eventually(nacked)
    s = await subscriber(policy_stub, "pod-a")
    assert (s.applied_version, s.pushed_version, s.last_nacked_version) == (1, 2, 2)
    assert s.last_error == "expert_offload_limit 2 exceeds this model's 1"

    # A NACKed version is not pushed again on the same stream.
    await node.no_push()

    # Version 3: a stale answer (old nonce) changes nothing, the right one ACKs.
    await set_policy(policy_stub, auth, expert_offload_limit=3)
    third = await node.push()
    assert third.version == 3
    node.send(3, first.nonce)  # stale: answers an old push
    node.send(3, "made-up-nonce")  # stale: never sent
    await asyncio.sleep(0.2)
    s = await subscriber(policy_stub, "pod-a")
    assert s.applied_version == 1 and s.last_error != ""
    node.send(3, third.nonce)

    async def acked_three() -> bool:
        s = await subscriber(policy_stub, "pod-a")
        return s.applied_version == 3

    await eventually(acked_three)
    s = await subscriber(policy_stub, "pod-a")
    assert s.last_error == "" and s.last_nacked_version == 2  # ACK clears the error
    # Repeating an answered nonce is stale too.
    node.send(1, third.nonce, "late duplicate")
    await asyncio.sleep(0.2)
    assert (await subscriber(policy_stub, "pod-a")).applied_version == 3
    node.call.cancel()

    async def disconnected() -> bool:
        return not (await subscriber(policy_stub, "pod-a")).connected

    await eventually(disconnected)


async def test_reconnect_pushes_only_when_newer(policy_stub, discovery_stub, auth):
    for limit in (1, 2):
        await set_policy(policy_stub, auth, expert_offload_limit=limit)
    # A node that already runs version 2 gets nothing on connect.
    up_to_date = RawNode(discovery_stub, "pod-b", version=2, metadata=AUTH)
    await up_to_date.no_push()
    assert (await subscriber(policy_stub, "pod-b")).applied_version == 2
    # One on version 1 gets version 2 at once.
    behind = RawNode(discovery_stub, "pod-c", version=1, metadata=AUTH)
    assert (await behind.push()).version == 2
    # Every open stream of the deployment gets the next version, nobody else's.
    other = RawNode(discovery_stub, "pod-d", deployment="mixtral", metadata=AUTH)
    await set_policy(policy_stub, auth, expert_offload_limit=3)
    assert (await up_to_date.push()).version == 3
    assert (await behind.push()).version == 3
    await other.no_push()
    for node in (up_to_date, behind, other):
        node.call.cancel()


async def test_a_node_ahead_of_a_control_plane_that_lost_its_history_gets_its_policy(
    policy_stub, discovery_stub, auth
):
    """A replaced control plane without storage numbers from 1 again; a node still on the
    old one's version 3 must get the current policy, not wait for version 4. A NACKed
    version is not pushed again."""
    await set_policy(policy_stub, auth, expert_offload_limit=2)  # version 1
    ahead = RawNode(discovery_stub, "pod-e", version=3, metadata=AUTH)
    update = await ahead.push()
    assert update.version == 1 and update.policy.tunables.expert_offload_limit == 2
    ahead.send(3, update.nonce, error="not today")  # NACK: keeps running version 3
    await ahead.no_push()
    assert (await subscriber(policy_stub, "pod-e")).applied_version == 3
    await set_policy(policy_stub, auth, expert_offload_limit=3)  # version 2
    update = await ahead.push()
    assert update.version == 2
    ahead.send(2, update.nonce)
    await eventually(lambda: _applied(policy_stub, "pod-e", 2))
    ahead.call.cancel()


async def _applied(policy_stub, node_id: str, version: int) -> bool:
    return (await subscriber(policy_stub, node_id)).applied_version == version


async def test_a_connected_node_id_is_not_taken_over(policy_stub, discovery_stub, auth):
    await set_policy(policy_stub, auth)
    owner = RawNode(discovery_stub, "pod-e", metadata=AUTH)
    push = await owner.push()
    intruder = RawNode(discovery_stub, "pod-e", version=1, metadata=AUTH)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await intruder.push()
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    # The owner's stream goes on: its ACK counts, and it gets the next version.
    owner.send(1, push.nonce)
    await eventually(lambda: _applied(policy_stub, "pod-e", 1))
    await set_policy(policy_stub, auth, expert_offload_limit=3)
    assert (await owner.push()).version == 2
    # Once the owner's stream is gone, a reconnect takes the record over.
    owner.call.cancel()
    await eventually(lambda: _disconnected(policy_stub, "pod-e"))
    again = RawNode(discovery_stub, "pod-e", version=1, metadata=AUTH)
    assert (await again.push()).version == 2
    assert (await subscriber(policy_stub, "pod-e")).connected
    again.call.cancel()


async def _disconnected(policy_stub, node_id: str) -> bool:
    return not (await subscriber(policy_stub, node_id)).connected


async def test_watch_with_bad_identity_is_invalid_argument(discovery_stub):
    node = RawNode(discovery_stub, "", deployment="qwen", metadata=AUTH)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await node.push()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("node_id:")
