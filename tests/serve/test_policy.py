"""Live policy from a real control plane: pushes change the adjuster with no restart, invalid
ones are NACKed, the data plane survives a control-plane restart, routing feeds hotness."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import pytest

from rimuru.controlplane.hotness import HotnessConfig
from rimuru.dataplane.serve.grpc_front.control import ControlPlaneLink
from rimuru.dataplane.serve.grpc_front.policy_watch import Backoff
from rimuru.v1 import control_pb2 as cpb
from rimuru.v1 import control_pb2_grpc as cpb_grpc

DEPLOYMENT = "tiny-test"
FAST = Backoff(initial_s=0.05, multiplier=1.5, max_s=0.2)
BASE = dict(
    mode=cpb.MODE_ELASTIC,
    expert_offload_limit=4,
    shrink_threshold=2,
    grow_threshold=9,
    max_grow_per_round=5,
)


def _link(port: int, node: str = "dp-0") -> ControlPlaneLink:
    return ControlPlaneLink(
        f"127.0.0.1:{port}", DEPLOYMENT, node, report_interval_s=0.1, backoff=FAST
    )


async def _set(channel, **changes) -> cpb.Policy:
    stub = cpb_grpc.PolicyServiceStub(channel)
    tunables = cpb.Tunables(**{**BASE, **changes})
    return await stub.SetPolicy(cpb.SetPolicyRequest(deployment=DEPLOYMENT, tunables=tunables))


async def _subscriber(channel, node: str = "dp-0") -> cpb.Subscriber | None:
    stub = cpb_grpc.PolicyServiceStub(channel)
    listed = await stub.ListSubscribers(cpb.ListSubscribersRequest(deployment=DEPLOYMENT))
    return next((s for s in listed.subscribers if s.node_id == node), None)


async def _workload(dp, max_tokens: int = 20) -> None:
    """Four requests of max_tokens each: max_tokens + 1 engine steps."""
    prompts = [[11, 12, 13], [7] * 9, [151_000, 4], [99] * 20]
    await asyncio.gather(*(dp.generate(p, max_tokens=max_tokens, ignore_eos=True) for p in prompts))


async def _at_version(dp, version: int, eventually) -> None:
    async def applied() -> bool:
        return (await dp.stats()).policy_version == version

    await eventually(applied, what=f"policy version {version} applied")


async def test_live_tuning_changes_the_adjuster_and_invalid_pushes_are_nacked(
    start_control_plane, start_data_plane, eventually
):
    _, _, cp_port = await start_control_plane()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp_port}") as cp:
        assert (await _set(cp)).version == 1
        dp = await start_data_plane(control_plane=_link(cp_port))
        await _at_version(dp, 1, eventually)

        # v1 = the start-up flags: a roomy pool, nothing to evict.
        await _workload(dp)
        stats = await dp.stats()
        assert stats.num_expert_evictions == 0
        assert list(stats.num_experts_resident) == [32] * 4

        # v2: the paper's rule with a shrink threshold above the free pages -> one eviction
        # per step, down to expert_offload_limit (4) experts offloaded per layer. (The cost
        # rule would evict nothing: no request waits, so pages buy nothing.)
        paper = cpb.ELASTIC_RULE_PAPER
        v2 = await _set(cp, shrink_threshold=100_000, grow_threshold=100_001, elastic_rule=paper)
        assert v2.version == 2
        await _at_version(dp, 2, eventually)
        await _workload(dp)
        stats = await dp.stats()
        assert stats.num_expert_evictions == 16
        assert list(stats.num_experts_resident) == [28] * 4

        # v3: expert_offload_limit 0 and the default thresholds -> evictions stop, the
        # offloaded experts are loaded back (at most max_grow_per_round a step). A copy
        # budget travels along (nothing left to offload for it to limit).
        assert (await _set(cp, expert_offload_limit=0, copy_budget=1.5)).version == 3
        await _at_version(dp, 3, eventually)
        await _workload(dp)
        stats = await dp.stats()
        assert stats.num_expert_evictions == 16
        assert stats.num_expert_loads == 16
        assert list(stats.num_experts_resident) == [32] * 4

        # v4 changes the memory policy, which needs a restart: NACKed, v3 stays in force.
        assert (await _set(cp, mode=cpb.MODE_FIXED, expert_offload_limit=0)).version == 4

        async def nacked() -> bool:
            return (await _subscriber(cp)).last_nacked_version == 4

        await eventually(nacked, what="version 4 NACKed")
        sub = await _subscriber(cp)
        assert sub.applied_version == 3 and "restart" in sub.last_error
        await _workload(dp)
        stats = await dp.stats()
        assert (stats.policy_version, stats.policy_mode) == (3, "elastic")
        assert stats.num_expert_evictions == 16 and stats.num_expert_loads == 16
        tunables = await dp.engine(lambda e: e.tunables)
        assert (tunables.mode, tunables.expert_offload_limit, tunables.shrink_threshold) == (
            "elastic",
            0,
            2,
        )
        assert tunables.copy_budget == 1.5


async def test_keeps_serving_while_the_control_plane_restarts_and_reconnects(
    start_control_plane, start_data_plane, eventually
):
    plane, server, cp_port = await start_control_plane()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp_port}") as cp:
        await _set(cp, expert_offload_limit=2)
    dp = await start_data_plane(control_plane=_link(cp_port))
    await _at_version(dp, 1, eventually)
    watcher = dp.handle.follower.watcher

    # A stream in flight while the control plane goes away.
    stream = asyncio.create_task(dp.generate([5, 6, 7], max_tokens=60, ignore_eos=True))
    await server.stop(None)
    plane.close()

    async def disconnected() -> bool:
        return not watcher.connected

    await eventually(disconnected, what="the watch noticing the control plane is gone")
    tokens, final = await stream
    assert len(tokens) == 60 and final.finish_reason == 1  # FINISH_REASON_LENGTH
    tokens, _ = await dp.generate([8, 9], max_tokens=5, ignore_eos=True)
    assert len(tokens) == 5
    assert await dp.health() == 1  # SERVING
    assert (await dp.stats()).policy_version == 1  # the last policy stays in force

    # Same port, same data directory: the control plane resumes at version 1.
    plane, _, _ = await start_control_plane(port=cp_port)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp_port}") as cp:

        async def reconnected() -> bool:
            sub = await _subscriber(cp)
            return sub is not None and sub.connected and sub.applied_version == 1

        await eventually(reconnected, what="the data plane reconnecting")
        assert watcher.num_connects == 2
        assert (await _set(cp, expert_offload_limit=3)).version == 2
        await _at_version(dp, 2, eventually)
    assert await dp.engine(lambda e: e.tunables.expert_offload_limit) == 3

    # Routing reports resume too (the new control plane knows nothing of the old counts).
    await _workload(dp, max_tokens=3)

    async def reported() -> bool:
        return plane.hotness.counts(DEPLOYMENT, now=plane._clock()) is not None

    await eventually(reported, what="routing reports reaching the restarted control plane")


async def test_routing_reports_drive_online_hotness_into_the_engine(
    start_control_plane, start_data_plane, eventually
):
    hotness = HotnessConfig(
        half_life_s=60, drift_threshold=0.01, min_tokens_per_layer=1, min_interval_s=0
    )
    plane, _, cp_port = await start_control_plane(hotness=hotness)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp_port}") as cp:
        await _set(cp, online_hotness=True)
        dp = await start_data_plane(control_plane=_link(cp_port))
        await _at_version(dp, 1, eventually)
        await _workload(dp, max_tokens=6)

        async def ranked_online() -> bool:
            source = await dp.engine(lambda e: e.ranking.source)
            return source.startswith("control plane: online")

        await eventually(ranked_online, what="an online ranking applied")
        policy = await cpb_grpc.PolicyServiceStub(cp).GetPolicy(
            cpb.GetPolicyRequest(deployment=DEPLOYMENT)
        )
        assert policy.reason == "online-hotness"
        await _at_version(dp, policy.version, eventually)

        # Reports still in flight may make a newer version: the engine must end on the
        # control plane's latest ranking once they stop.
        async def on_latest_ranking() -> bool:
            ranking = plane.get_ranking(DEPLOYMENT)
            return await dp.engine(lambda e: e.ranking.order) == ranking.hotness.order

        await eventually(on_latest_ranking, what="the engine on the latest online ranking")
        # The counts the control plane folded in came from this engine's routing.
        routed = await dp.engine(lambda e: e.moe_backend.routing_counts.sum(dim=1).tolist())
        counts = plane.hotness.counts(DEPLOYMENT, now=plane._clock())
        assert all(0 < sum(row) <= total for row, total in zip(counts, routed, strict=True))


@pytest.mark.parametrize("bad", ["mode", "expert_offload_limit"])
async def test_pushes_the_engine_cannot_apply_are_nacked(
    bad, start_control_plane, start_data_plane, eventually
):
    _, _, cp_port = await start_control_plane()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp_port}") as cp:
        await _set(cp)
        dp = await start_data_plane(control_plane=_link(cp_port))
        await _at_version(dp, 1, eventually)
        # The engine's loading buffers hold 4 experts a layer (SMALL): 5 cannot be offloaded.
        change = {"mode": cpb.MODE_FIXED, "expert_offload_limit": 5}
        await _set(cp, **{"expert_offload_limit": 1, bad: change[bad]})

        async def nacked() -> bool:
            return (await _subscriber(cp)).last_nacked_version == 2

        await eventually(nacked, what="version 2 NACKed")
        assert await dp.engine(lambda e: e.tunables) == (
            await dp.engine(lambda e: e.config.tunables)
        )
        assert (await dp.stats()).policy_version == 1
        assert (await _subscriber(cp)).last_error


async def test_the_data_plane_reports_its_model_shape_and_wrong_rankings_are_refused(
    start_control_plane, start_data_plane, eventually
):
    plane, _, cp_port = await start_control_plane()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp_port}") as cp:
        await _set(cp)
        dp = await start_data_plane(control_plane=_link(cp_port))
        await _at_version(dp, 1, eventually)
        assert plane.model_shape(DEPLOYMENT) == (4, 32)  # tiny: 4 MoE layers x 32 experts
        stub = cpb_grpc.PolicyServiceStub(cp)
        wrong = [cpb.LayerRanking(layer=0, expert_ids=[1, 0], probabilities=[0.6, 0.4])]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.UploadRanking(
                cpb.UploadRankingRequest(deployment=DEPLOYMENT, ranking_id="x", layers=wrong)
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (await _subscriber(cp)).applied_version == 1


async def test_a_data_plane_follows_with_the_data_plane_token_only(
    start_control_plane, start_data_plane, eventually
):
    operator, dataplane = "operator-token", "dataplane-token"
    _, _, cp_port = await start_control_plane(token=operator, dataplane_token=dataplane)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp_port}") as cp:
        stub = cpb_grpc.PolicyServiceStub(cp)
        await stub.SetPolicy(
            cpb.SetPolicyRequest(deployment=DEPLOYMENT, tunables=cpb.Tunables(**BASE)),
            metadata=(("authorization", f"Bearer {operator}"),),
        )
        link = replace(_link(cp_port), token=dataplane)
        dp = await start_data_plane(control_plane=link)
        await _at_version(dp, 1, eventually)
        follower = dp.handle.follower
        await eventually(
            lambda: _reported(follower), what="a routing report accepted with the token"
        )


async def _reported(follower) -> bool:
    return follower.reporter.num_reports_sent > 0
