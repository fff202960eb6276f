"""Two credentials: the operator token writes policy, the data-plane token only watches
and reports; one `authorization` header per call."""

from __future__ import annotations

import grpc
import pytest

from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.server import create_server
from rimuru.v1 import control_pb2 as pb
from rimuru.v1 import control_pb2_grpc as pb_grpc
from tests.controlplane.test_watch_policy import GOOD, RawNode

OPERATOR = "operator-token-1"
DATAPLANE = "dataplane-token-2"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


REPORT = pb.RoutingReport(
    node_id="pod", deployment="qwen", layers=[pb.LayerRoutingCounts(layer=0, counts=[1, 2])]
)


async def _code(call) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def _watch_code(discovery, metadata) -> grpc.StatusCode:
    node = RawNode(discovery, "pod-w", metadata=metadata)
    try:
        await node.no_push(0.2)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    except AssertionError:
        pass  # a push arrived: the stream was accepted
    code = grpc.StatusCode.OK if not node.call.done() else await node.call.code()
    node.call.cancel()
    return code


@pytest.fixture
async def stubs():
    plane = ControlPlane.open(None)
    server, port = await create_server(
        "127.0.0.1:0", plane, token=OPERATOR, dataplane_token=DATAPLANE
    )
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield pb_grpc.PolicyServiceStub(channel), pb_grpc.PolicyDiscoveryServiceStub(channel)
    await server.stop(None)
    plane.close()


async def test_each_token_allows_only_its_own_methods(stubs):
    policy, discovery = stubs
    set_request = pb.SetPolicyRequest(deployment="qwen", tunables=GOOD)
    ok, denied = grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED
    assert await _code(policy.SetPolicy(set_request, metadata=bearer(DATAPLANE))) == denied
    assert await _code(policy.SetPolicy(set_request, metadata=bearer(OPERATOR))) == ok
    upload = pb.UploadRankingRequest(
        deployment="qwen",
        ranking_id="r",
        layers=[pb.LayerRanking(layer=0, expert_ids=[0, 1], probabilities=[0.5, 0.5])],
    )
    assert await _code(policy.UploadRanking(upload, metadata=bearer(DATAPLANE))) == denied
    report = discovery.ReportRouting(iter([REPORT]), metadata=bearer(OPERATOR))
    assert await _code(report) == denied
    report = discovery.ReportRouting(iter([REPORT]), metadata=bearer(DATAPLANE))
    assert await _code(report) == ok
    assert await _watch_code(discovery, None) == denied
    assert await _watch_code(discovery, bearer(OPERATOR)) == denied
    assert await _watch_code(discovery, bearer(DATAPLANE)) == ok


async def test_two_authorization_headers_are_refused(stubs):
    policy, _ = stubs
    set_request = pb.SetPolicyRequest(deployment="qwen", tunables=GOOD)
    twice = (("authorization", "Bearer wrong"), ("authorization", f"Bearer {OPERATOR}"))
    assert await _code(policy.SetPolicy(set_request, metadata=twice)) == (
        grpc.StatusCode.UNAUTHENTICATED
    )


async def test_with_one_shared_token_watches_need_it_too():
    plane = ControlPlane.open(None)
    server, port = await create_server("127.0.0.1:0", plane, token=OPERATOR)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            discovery = pb_grpc.PolicyDiscoveryServiceStub(channel)
            assert await _watch_code(discovery, None) == grpc.StatusCode.UNAUTHENTICATED
            assert await _watch_code(discovery, bearer("guess")) == grpc.StatusCode.UNAUTHENTICATED
            assert await _watch_code(discovery, bearer(OPERATOR)) == grpc.StatusCode.OK
        assert [s.node_id for s in plane.list_subscribers()] == ["pod-w"]
    finally:
        await server.stop(None)
        plane.close()
