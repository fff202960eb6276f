"""Online hotness: decayed aggregation (exact, no gRPC) and drift pushes over gRPC."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from rimuru.controlplane.errors import InvalidArgument
from rimuru.controlplane.hotness import HotnessAggregator, HotnessConfig
from rimuru.policy import HotnessRanking
from rimuru.v1 import control_pb2 as pb
from rimuru.v1 import control_pb2_grpc as pb_grpc

CONFIG = HotnessConfig(
    half_life_s=10.0, drift_threshold=0.2, min_tokens_per_layer=10, min_interval_s=5.0
)


def test_counts_halve_every_half_life():
    agg = HotnessAggregator(CONFIG)
    agg.add("qwen", {0: [80, 0], 1: [8, 8]}, now=0.0)
    agg.add("qwen", {0: [0, 40], 1: [0, 0]}, now=10.0)
    assert agg.counts("qwen", now=10.0) == [[40.0, 40.0], [4.0, 4.0]]
    assert agg.counts("qwen", now=30.0) == [[10.0, 10.0], [1.0, 1.0]]
    assert agg.counts("other", now=0.0) is None


def test_total_variation():
    p = HotnessRanking(((0, 1, 2),), ((0.5, 0.5, 0.0),))
    q = HotnessRanking(((2, 1, 0),), ((0.6, 0.4, 0.0),))
    assert p.total_variation(q, 0) == pytest.approx(0.5 * (0.5 + 0.1 + 0.6))
    assert p.total_variation(p, 0) == 0.0


def test_propose_needs_evidence_drift_and_time():
    agg = HotnessAggregator(CONFIG)
    agg.add("qwen", {0: [3, 1, 0]}, now=0.0)
    assert agg.propose("qwen", None, now=0.0) is None  # 4 tokens < 10
    agg.add("qwen", {0: [27, 9, 0]}, now=0.0)
    first = agg.propose("qwen", None, now=0.0)
    assert first == HotnessRanking(((0, 1, 2),), ((0.75, 0.25, 0.0),))
    # Same traffic again: no drift. Later, shifted traffic but too soon after the last.
    agg.add("qwen", {0: [30, 10, 0]}, now=1.0)
    assert agg.propose("qwen", first, now=1.0) is None
    agg.add("qwen", {0: [0, 0, 1000]}, now=2.0)
    assert agg.propose("qwen", first, now=2.0) is None  # min_interval_s = 5
    second = agg.propose("qwen", first, now=5.0)
    assert second is not None and second.order[0] == (2, 0, 1)
    assert HotnessAggregator.drift(second, first) > CONFIG.drift_threshold


def test_small_drift_is_not_pushed():
    agg = HotnessAggregator(CONFIG)
    current = HotnessRanking(((0, 1),), ((0.6, 0.4),))
    agg.add("qwen", {0: [55, 45]}, now=0.0)  # TV 0.05 <= 0.2
    assert agg.propose("qwen", current, now=100.0) is None
    agg.add("qwen", {0: [0, 300]}, now=100.0)
    proposal = agg.propose("qwen", current, now=100.0)
    assert proposal is not None and proposal.order[0] == (1, 0)


@pytest.mark.parametrize(
    ("layers", "field"),
    [({}, "layers"), ({1: [1]}, "layers.layer"), ({0: [1, 2], 1: [1]}, "layers.counts")],
)
def test_bad_reports(layers, field):
    with pytest.raises(InvalidArgument) as info:
        HotnessAggregator(CONFIG).add("qwen", layers, now=0.0)
    assert info.value.field == field


def test_a_report_of_another_shape_starts_afresh():
    agg = HotnessAggregator(CONFIG)
    agg.add("qwen", {0: [5, 5]}, now=0.0)
    agg.add("qwen", {0: [1, 2, 3]}, now=1.0)
    assert agg.counts("qwen", now=1.0) == [[1.0, 2.0, 3.0]]


def report(node: str, *rows: list[int]) -> pb.RoutingReport:
    return pb.RoutingReport(
        node_id=node,
        deployment="qwen",
        layers=[pb.LayerRoutingCounts(layer=i, counts=row) for i, row in enumerate(rows)],
    )


async def send_reports(discovery_stub, *reports: pb.RoutingReport) -> int:
    async def stream():
        for r in reports:
            yield r

    return (await discovery_stub.ReportRouting(stream())).num_reports_accepted


async def test_drift_pushes_a_new_version_to_watchers(start_control_plane):
    cp = await start_control_plane(
        hotness=HotnessConfig(
            half_life_s=1e6, drift_threshold=0.2, min_tokens_per_layer=10, min_interval_s=0.0
        )
    )
    async with grpc.aio.insecure_channel(cp.target) as channel:
        policy_stub = pb_grpc.PolicyServiceStub(channel)
        discovery = pb_grpc.PolicyDiscoveryServiceStub(channel)
        tunables = pb.Tunables(
            mode=pb.MODE_ELASTIC,
            shrink_threshold=2,
            grow_threshold=9,
            max_grow_per_round=5,
            online_hotness=False,
        )
        await policy_stub.SetPolicy(pb.SetPolicyRequest(deployment="qwen", tunables=tunables))
        # online_hotness off: counts are kept, no version is made.
        assert await send_reports(discovery, report("pod-a", [90, 10, 0], [0, 50, 50])) == 1
        assert (await policy_stub.GetPolicy(pb.GetPolicyRequest(deployment="qwen"))).version == 1

        tunables.online_hotness = True
        await policy_stub.SetPolicy(pb.SetPolicyRequest(deployment="qwen", tunables=tunables))
        opening = pb.PolicyDiscoveryRequest(node_id="pod-w", deployment="qwen", version_info=2)
        answers: asyncio.Queue = asyncio.Queue()
        answers.put_nowait(opening)

        async def requests():
            while True:
                yield await answers.get()

        watch = discovery.WatchPolicy(requests())
        # With pod-a's earlier counts, layer 0 is 0 > 1 > 2 and layer 1 is 2 > 1 > 0.
        await send_reports(
            discovery,
            report("pod-b", [10, 0, 0], [0, 0, 20]),
            report("pod-a", [0, 0, 0], [0, 0, 0]),
        )
        update = await asyncio.wait_for(watch.read(), 5)
        assert update.version == 3 and update.policy.reason == "online-hotness"
        assert update.policy.tunables.online_hotness
        assert update.ranking.ref.id == "online" and update.ranking.ref == update.policy.ranking
        assert [list(r.expert_ids) for r in update.ranking.layers] == [[0, 1, 2], [2, 1, 0]]
        assert list(update.ranking.layers[0].probabilities) == pytest.approx(
            [100 / 110, 10 / 110, 0.0]
        )

        # The same mix again: no drift, no version.
        await send_reports(discovery, report("pod-a", [100, 10, 0], [0, 50, 70]))
        assert (await policy_stub.GetPolicy(pb.GetPolicyRequest(deployment="qwen"))).version == 3
        # Traffic moves to expert 2 of layer 0: a new ranking is pushed.
        await send_reports(discovery, report("pod-b", [0, 0, 5000], [0, 50, 70]))
        update = await asyncio.wait_for(watch.read(), 5)
        assert update.version == 4 and update.ranking.layers[0].expert_ids[0] == 2
        # A malformed report is INVALID_ARGUMENT and changes nothing.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await send_reports(discovery, report("pod-b", [1, 2], [1]))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (await policy_stub.GetPolicy(pb.GetPolicyRequest(deployment="qwen"))).version == 4
        watch.cancel()
