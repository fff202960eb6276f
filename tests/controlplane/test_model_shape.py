"""Rankings must have the model's shape (layers x experts) that data planes report."""

from __future__ import annotations

import grpc
import pytest

from rimuru.controlplane.hotness import HotnessConfig
from rimuru.v1 import control_pb2 as pb
from rimuru.v1 import control_pb2_grpc as pb_grpc
from tests.controlplane.conftest import TOKEN
from tests.controlplane.test_watch_policy import RawNode, set_policy

AUTH = (("authorization", f"Bearer {TOKEN}"),)


def layers(num_layers: int, num_experts: int) -> list[pb.LayerRanking]:
    probabilities = [1.0 / num_experts] * num_experts
    return [
        pb.LayerRanking(
            layer=layer, expert_ids=list(range(num_experts)), probabilities=probabilities
        )
        for layer in range(num_layers)
    ]


async def test_an_upload_of_another_shape_is_refused_and_the_old_ranking_stays(
    policy_stub, discovery_stub, auth
):
    await set_policy(policy_stub, auth)
    node = RawNode(discovery_stub, "pod-a", shape=(2, 4), metadata=AUTH)
    await node.push()  # subscribed: the control plane knows the shape now
    good = await policy_stub.UploadRanking(
        pb.UploadRankingRequest(deployment="qwen", ranking_id="good", layers=layers(2, 4)),
        metadata=auth,
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await policy_stub.UploadRanking(
            pb.UploadRankingRequest(deployment="qwen", ranking_id="bad", layers=layers(3, 7)),
            metadata=auth,
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("layers:") and "2 x 4" in info.value.details()
    policy = await set_policy(policy_stub, auth, expert_offload_limit=1)
    assert policy.ranking == good.ranking  # the later version still carries the good one
    node.call.cancel()


async def test_an_online_ranking_of_another_shape_is_refused(start_control_plane):
    cp = await start_control_plane(
        token=TOKEN, hotness=HotnessConfig(min_interval_s=0, drift_threshold=0.01)
    )
    async with grpc.aio.insecure_channel(cp.target) as channel:
        policy_stub = pb_grpc.PolicyServiceStub(channel)
        discovery = pb_grpc.PolicyDiscoveryServiceStub(channel)
        await set_policy(policy_stub, AUTH, online_hotness=True)
        node = RawNode(discovery, "pod-a", shape=(2, 4), metadata=AUTH)
        await node.push()
        report = pb.RoutingReport(
            node_id="x",
            deployment="qwen",
            layers=[pb.LayerRoutingCounts(layer=i, counts=[500] * 5) for i in range(4)],
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await discovery.ReportRouting(iter([report]), metadata=AUTH)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        current = await policy_stub.GetPolicy(pb.GetPolicyRequest(deployment="qwen"))
        assert current.version == 1 and not current.HasField("ranking")
        node.call.cancel()
