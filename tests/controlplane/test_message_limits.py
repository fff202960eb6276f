"""One message-size limit for both planes: the control plane refuses a version whose push
would exceed it, and a data plane that still receives too large a push backs off."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from rimuru.controlplane.hotness import HotnessConfig
from rimuru.dataplane.serve.grpc_front.policy_watch import Backoff, PolicyWatcher
from rimuru.v1 import control_pb2 as pb
from rimuru.v1 import control_pb2_grpc as pb_grpc
from tests.controlplane.conftest import TOKEN
from tests.controlplane.test_model_shape import layers
from tests.controlplane.test_policy_watch import running
from tests.controlplane.test_watch_policy import set_policy

AUTH = (("authorization", f"Bearer {TOKEN}"),)
LIMIT = 4096  # bytes; layers(16, 64) is about 9 KiB on the wire


def upload_just_under(limit: int) -> pb.UploadRankingRequest:
    """The largest one-layer upload that the server receives (the push adds the policy)."""
    fits = None
    for num_experts in range(8, 1024, 8):
        request = pb.UploadRankingRequest(
            deployment="qwen", ranking_id="big", layers=layers(1, num_experts)
        )
        if request.ByteSize() > limit - 32:
            return fits
        fits = request
    raise AssertionError("unreachable for a 4 KiB limit")


async def test_a_ranking_whose_push_exceeds_the_limit_is_refused_and_nothing_stored(
    start_control_plane,
):
    cp = await start_control_plane(token=TOKEN, max_message_bytes=LIMIT)
    async with grpc.aio.insecure_channel(cp.target) as channel:
        stub = pb_grpc.PolicyServiceStub(channel)
        await set_policy(stub, AUTH)
        small = await stub.UploadRanking(
            pb.UploadRankingRequest(deployment="qwen", ranking_id="small", layers=layers(2, 4)),
            metadata=AUTH,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.UploadRanking(upload_just_under(LIMIT), metadata=AUTH)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "message limit" in info.value.details()
        current = await stub.GetPolicy(pb.GetPolicyRequest(deployment="qwen"))
        assert current == small.policy  # no version added, the small ranking kept
        ranking = await stub.GetRanking(pb.GetRankingRequest(deployment="qwen"))
        assert ranking.ref.id == "small"


async def test_an_oversize_push_backs_off_instead_of_reconnecting_every_half_second(
    start_control_plane,
):
    cp = await start_control_plane(token=TOKEN)  # the shared limit: the push is sent
    async with grpc.aio.insecure_channel(cp.target) as channel:
        stub = pb_grpc.PolicyServiceStub(channel)
        await set_policy(stub, AUTH)
        await stub.UploadRanking(
            pb.UploadRankingRequest(deployment="qwen", ranking_id="big", layers=layers(16, 64)),
            metadata=AUTH,
        )
    # A data plane whose receive limit is smaller (an old build, a changed constant).
    watcher = PolicyWatcher(
        cp.target,
        "pod-a",
        "qwen",
        apply=lambda update: None,
        backoff=Backoff(initial_s=0.05, multiplier=2.0, jitter=0.0),
        token=TOKEN,
        max_message_bytes=LIMIT,
    )
    async with running(watcher.run()):
        await asyncio.sleep(1.5)
    # Growing delays connect at about 0, 0.05, 0.15, 0.35, 0.75 and 1.55 s; a backoff that
    # restarted after each connect would reconnect every 0.05 s (about 25 times).
    assert 2 <= watcher.num_connects <= 6
    assert watcher.applied_version == 0


async def test_an_online_hotness_version_whose_push_exceeds_the_limit_is_refused(
    start_control_plane,
):
    hotness = HotnessConfig(min_tokens_per_layer=0, min_interval_s=0.0)
    cp = await start_control_plane(token=TOKEN, hotness=hotness, max_message_bytes=LIMIT)
    async with grpc.aio.insecure_channel(cp.target) as channel:
        stub = pb_grpc.PolicyServiceStub(channel)
        before = await set_policy(stub, AUTH, online_hotness=True)
        discovery = pb_grpc.PolicyDiscoveryServiceStub(channel)
        # 16 layers x 64 experts: a ranking push of about 9 KiB, over the 4 KiB limit.
        rows = [pb.LayerRoutingCounts(layer=i, counts=range(1, 65)) for i in range(16)]
        report = pb.RoutingReport(node_id="pod-a", deployment="qwen", layers=rows)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await discovery.ReportRouting(iter([report]), metadata=AUTH)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith("layers: its push to the data planes would be ")
        assert info.value.details().endswith(
            f"over the {LIMIT}-byte message limit both planes share "
            "(rimuru.rpc.MAX_MESSAGE_BYTES); nothing stored"
        )
        # Nothing was stored, so nothing a data plane could not receive is ever pushed.
        assert await stub.GetPolicy(pb.GetPolicyRequest(deployment="qwen")) == before
