"""The subscriber registry is bounded: records expire, their number is capped, and
ListSubscribers of a full registry fits in one gRPC message."""

from __future__ import annotations

import grpc
import pytest

from rimuru.controlplane import convert
from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.server import create_server
from rimuru.controlplane.store import PolicyStore
from rimuru.controlplane.subscribers import (
    DEFAULT_MAX_SUBSCRIBERS,
    MAX_ERROR_CHARS,
    MAX_NODE_ID_LEN,
    Subscriber,
    SubscriberRegistry,
)
from rimuru.v1 import control_pb2 as pb
from rimuru.v1 import control_pb2_grpc as pb_grpc
from tests.controlplane.test_watch_policy import RawNode, eventually

GRPC_DEFAULT_MAX_MESSAGE_BYTES = 4 * 2**20


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def bounded():
    clock = Clock()
    registry = SubscriberRegistry(clock, max_subscribers=3, ttl_s=60.0)
    plane = ControlPlane(PolicyStore(None), clock=clock, subscribers=registry)
    server, port = await create_server("127.0.0.1:0", plane)
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield clock, pb_grpc.PolicyServiceStub(channel), pb_grpc.PolicyDiscoveryServiceStub(channel)
    await server.stop(None)
    plane.close()


async def _node_ids(policy_stub) -> list[str]:
    listed = await policy_stub.ListSubscribers(pb.ListSubscribersRequest())
    return [s.node_id for s in listed.subscribers]


async def test_records_are_capped_and_expire(bounded):
    clock, policy_stub, discovery_stub = bounded
    for i in range(6):  # fake node ids that connect and leave at once
        node = RawNode(discovery_stub, f"fake-{i}")
        await node.no_push(0.05)
        node.call.cancel()
        clock.now += 1
    await eventually(lambda: _all_disconnected(policy_stub))
    assert await _node_ids(policy_stub) == ["fake-3", "fake-4", "fake-5"]

    live = [RawNode(discovery_stub, f"pod-{i}") for i in range(3)]
    for node in live:
        await node.no_push(0.05)
    assert sorted(await _node_ids(policy_stub)) == ["pod-0", "pod-1", "pod-2"]
    extra = RawNode(discovery_stub, "pod-3")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await extra.push()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    live[0].call.cancel()
    await eventually(lambda: _count_connected(policy_stub, 2))
    clock.now += 61  # pod-0 unseen past the ttl; connected ones stay
    assert sorted(await _node_ids(policy_stub)) == ["pod-1", "pod-2"]
    for node in live[1:]:
        node.call.cancel()


async def _all_disconnected(policy_stub) -> bool:
    listed = await policy_stub.ListSubscribers(pb.ListSubscribersRequest())
    return not any(s.connected for s in listed.subscribers)


async def _count_connected(policy_stub, n: int) -> bool:
    listed = await policy_stub.ListSubscribers(pb.ListSubscribersRequest())
    return sum(s.connected for s in listed.subscribers) == n


def test_a_full_registry_lists_within_the_default_message_limit():
    wide = "\U0001f600"  # 4 bytes in UTF-8
    worst = Subscriber(
        node_id=wide * MAX_NODE_ID_LEN,
        deployment="d" * 253,
        applied_version=2**64 - 1,
        pushed_version=2**64 - 1,
        last_error=wide * MAX_ERROR_CHARS,
        last_nacked_version=2**64 - 1,
        connected=True,
        last_seen_unix_seconds=1e18,
    )
    response = pb.ListSubscribersResponse(
        subscribers=[convert.subscriber_to_proto(worst)] * DEFAULT_MAX_SUBSCRIBERS
    )
    assert response.ByteSize() < GRPC_DEFAULT_MAX_MESSAGE_BYTES
