"""PolicyService over real gRPC: validation, auth, versions, rankings, health, reflection."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rimuru.controlplane import errors
from rimuru.controlplane.client import ControlPlaneClient
from rimuru.policy import HotnessRanking, Tunables
from rimuru.v1 import control_pb2 as pb

GOOD = pb.Tunables(
    mode=pb.MODE_ELASTIC,
    expert_offload_limit=4,
    shrink_threshold=2,
    grow_threshold=9,
    max_grow_per_round=5,
)


def tunables(**changes) -> pb.Tunables:
    msg = pb.Tunables()
    msg.CopyFrom(GOOD)
    for name, value in changes.items():
        setattr(msg, name, value)
    return msg


@pytest.mark.parametrize("pages", [3, 0])
async def test_the_retired_pages_per_expert_is_taken_unset_or_at_its_one_value(
    policy_stub, auth, pages
):
    # Field 6 was a tunable: old clients send 3. The answer carries 3 too, which data
    # planes that predate the retirement need.
    got = await policy_stub.SetPolicy(
        pb.SetPolicyRequest(deployment="qwen", tunables=tunables(pages_per_expert=pages)),
        metadata=auth,
    )
    assert (got.version, got.tunables.pages_per_expert) == (1, 3)


async def test_another_pages_per_expert_is_refused_naming_the_one_value(policy_stub, auth):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await policy_stub.SetPolicy(
            pb.SetPolicyRequest(deployment="qwen", tunables=tunables(pages_per_expert=4)),
            metadata=auth,
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "tunables.pages_per_expert: must be 3 (an expert takes one page for each of w1, w3, "
        "w2), or left out; got 4"
    )


async def test_set_then_get_counts_versions_from_one(policy_stub, auth):
    first = await policy_stub.SetPolicy(
        pb.SetPolicyRequest(deployment="qwen", tunables=GOOD), metadata=auth
    )
    second = await policy_stub.SetPolicy(
        pb.SetPolicyRequest(deployment="qwen", tunables=tunables(grow_threshold=20)),
        metadata=auth,
    )
    other = await policy_stub.SetPolicy(
        pb.SetPolicyRequest(deployment="mixtral", tunables=GOOD), metadata=auth
    )
    got = await policy_stub.GetPolicy(pb.GetPolicyRequest(deployment="qwen"))
    assert (first.version, second.version, other.version) == (1, 2, 1)
    assert got.version == 2 and got.tunables.grow_threshold == 20 and got.reason == "set"
    assert not got.HasField("ranking")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"mode": pb.MODE_UNSPECIFIED}, "tunables.mode"),
        ({"mode": 42}, "tunables.mode"),
        ({"expert_offload_limit": -1}, "tunables.expert_offload_limit"),
        ({"shrink_threshold": -3}, "tunables.shrink_threshold"),
        ({"grow_threshold": 2}, "tunables.grow_threshold"),  # == shrink_threshold
        ({"max_grow_per_round": 0}, "tunables.max_grow_per_round"),
        ({"pages_per_expert": 4}, "tunables.pages_per_expert"),
        ({"pages_per_expert": -3}, "tunables.pages_per_expert"),
        ({"mode": pb.MODE_RESIDENT}, "tunables.expert_offload_limit"),  # resident offloads 0
    ],
)
async def test_invalid_tunables_are_invalid_argument_naming_the_field(
    policy_stub, auth, changes, field
):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await policy_stub.SetPolicy(
            pb.SetPolicyRequest(deployment="qwen", tunables=tunables(**changes)), metadata=auth
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(field + ":")
    # Nothing was stored.
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await policy_stub.GetPolicy(pb.GetPolicyRequest(deployment="qwen"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("deployment", ["", "Qwen", "-x", "a" * 254, "a/b"])
async def test_bad_deployment_names_are_invalid_argument(policy_stub, auth, deployment):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await policy_stub.SetPolicy(
            pb.SetPolicyRequest(deployment=deployment, tunables=GOOD), metadata=auth
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("deployment:")


async def test_missing_tunables_is_invalid_argument(policy_stub, auth):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await policy_stub.SetPolicy(pb.SetPolicyRequest(deployment="qwen"), metadata=auth)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("tunables:")


async def test_compare_and_set(policy_stub, auth):
    request = pb.SetPolicyRequest(deployment="qwen", tunables=GOOD, expected_version=0)
    assert (await policy_stub.SetPolicy(request, metadata=auth)).version == 1
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await policy_stub.SetPolicy(request, metadata=auth)  # still expects 0
    assert info.value.code() == grpc.StatusCode.ABORTED
    request.expected_version = 1
    assert (await policy_stub.SetPolicy(request, metadata=auth)).version == 2


@pytest.mark.parametrize(
    ("metadata", "code"),
    [
        ((), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Bearer wrong"),), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "test-token-0123"),), grpc.StatusCode.UNAUTHENTICATED),  # no scheme
        ("right", grpc.StatusCode.OK),  # the auth fixture's
    ],
)
async def test_writes_need_the_token_reads_do_not(policy_stub, auth, metadata, code):
    if metadata == "right":
        metadata = auth
    calls = [  # made one after the other: an aio call starts when it is created
        lambda: policy_stub.SetPolicy(
            pb.SetPolicyRequest(deployment="qwen", tunables=GOOD), metadata=metadata
        ),
        lambda: policy_stub.UploadRanking(
            pb.UploadRankingRequest(
                deployment="qwen",
                ranking_id="offline",
                layers=[pb.LayerRanking(layer=0, expert_ids=[1, 0], probabilities=[0.7, 0.3])],
            ),
            metadata=metadata,
        ),
    ]
    for call in calls:
        try:
            await call()
            got = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            got = exc.code()
        assert got == code
    # Reads never need it.
    listed = await policy_stub.ListSubscribers(pb.ListSubscribersRequest())
    assert list(listed.subscribers) == []
    if code == grpc.StatusCode.OK:
        assert (await policy_stub.GetPolicy(pb.GetPolicyRequest(deployment="qwen"))).version == 2


async def test_upload_ranking_makes_a_version_and_get_ranking_returns_it(policy_stub, auth):
    await policy_stub.SetPolicy(
        pb.SetPolicyRequest(deployment="qwen", tunables=GOOD), metadata=auth
    )
    layers = [
        pb.LayerRanking(layer=1, expert_ids=[2, 0, 1], probabilities=[0.5, 0.3, 0.2]),
        pb.LayerRanking(layer=0, expert_ids=[0, 1, 2], probabilities=[0.6, 0.3, 0.1]),
    ]
    response = await policy_stub.UploadRanking(
        pb.UploadRankingRequest(deployment="qwen", ranking_id="offline-sharegpt", layers=layers),
        metadata=auth,
    )
    expected_digest = HotnessRanking(
        ((0, 1, 2), (2, 0, 1)), ((0.6, 0.3, 0.1), (0.5, 0.3, 0.2))
    ).digest()
    assert response.policy.version == 2 and response.policy.reason == "upload-ranking"
    assert response.policy.tunables == tunables(pages_per_expert=3)  # the retired field's value
    assert response.ranking == pb.RankingRef(
        id="offline-sharegpt", version=1, digest=expected_digest
    )
    assert response.policy.ranking == response.ranking
    ranking = await policy_stub.GetRanking(pb.GetRankingRequest(deployment="qwen"))
    assert [list(r.expert_ids) for r in ranking.layers] == [[0, 1, 2], [2, 0, 1]]
    # A later SetPolicy keeps the ranking.
    third = await policy_stub.SetPolicy(
        pb.SetPolicyRequest(deployment="qwen", tunables=tunables(expert_offload_limit=1)),
        metadata=auth,
    )
    assert third.version == 3 and third.ranking == response.ranking


@pytest.mark.parametrize(
    ("layers", "field"),
    [
        ([], "layers"),
        ([pb.LayerRanking(layer=1, expert_ids=[0], probabilities=[1.0])], "layers.layer"),
        (
            [pb.LayerRanking(layer=0, expert_ids=[0, 0], probabilities=[0.5, 0.5])],
            "layers[0].expert_ids",
        ),
        (
            [pb.LayerRanking(layer=0, expert_ids=[0, 1], probabilities=[0.2, 0.8])],
            "layers[0].probabilities",
        ),
        (
            [pb.LayerRanking(layer=0, expert_ids=[0, 1], probabilities=[1.5, 0.1])],
            "layers[0].probabilities",
        ),
        (
            [pb.LayerRanking(layer=0, expert_ids=[0, 1], probabilities=[0.9])],
            "layers[0].probabilities",
        ),
    ],
)
async def test_invalid_rankings_are_invalid_argument(policy_stub, auth, layers, field):
    await policy_stub.SetPolicy(
        pb.SetPolicyRequest(deployment="qwen", tunables=GOOD), metadata=auth
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await policy_stub.UploadRanking(
            pb.UploadRankingRequest(deployment="qwen", ranking_id="r", layers=layers), metadata=auth
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(field + ":")


async def test_ranking_before_any_policy_is_failed_precondition(policy_stub, auth):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await policy_stub.UploadRanking(
            pb.UploadRankingRequest(
                deployment="qwen",
                ranking_id="r",
                layers=[pb.LayerRanking(layer=0, expert_ids=[0], probabilities=[1.0])],
            ),
            metadata=auth,
        )
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_health_is_serving(channel):
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", "rimuru.v1.PolicyService", "rimuru.v1.PolicyDiscoveryService"):
        response = await stub.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING


async def test_reflection_lists_the_services(channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)

    async def one_request():
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    names = set()
    async for response in stub.ServerReflectionInfo(one_request()):
        names.update(s.name for s in response.list_services_response.service)
    assert {
        "rimuru.v1.PolicyService",
        "rimuru.v1.PolicyDiscoveryService",
        "grpc.health.v1.Health",
    } <= names


async def test_typed_client_round_trip_and_errors(cp):
    def use_client() -> None:
        with ControlPlaneClient(cp.target, token="test-token-0123") as client:
            policy = client.set_policy("qwen", Tunables(mode="fixed", expert_offload_limit=3))
            assert policy.version == 1 and policy.tunables.mode == "fixed"
            assert client.get_policy("qwen") == policy
            hotness = HotnessRanking(((1, 0),), ((0.9, 0.1),))
            ranked = client.upload_ranking("qwen", "offline", hotness)
            assert ranked.version == 2 and ranked.ranking.id == "offline"
            assert client.get_ranking("qwen").hotness == hotness
            assert client.list_subscribers("qwen") == []
            with pytest.raises(errors.VersionConflict):
                client.set_policy("qwen", Tunables(), expected_version=1)
            with pytest.raises(errors.NotFound):
                client.get_policy("nobody")
        with ControlPlaneClient(cp.target) as anonymous, pytest.raises(errors.Unauthenticated):
            anonymous.set_policy("qwen", Tunables())
        with (
            ControlPlaneClient("127.0.0.1:1", timeout_s=0.5) as nowhere,
            pytest.raises(errors.Unavailable),
        ):
            nowhere.get_policy("qwen")

    await asyncio.to_thread(use_client)


@pytest.mark.parametrize("version", [2**63, 2**64 - 1])
async def test_get_ranking_of_a_version_past_sqlite_is_not_found(policy_stub, auth, version):
    await policy_stub.SetPolicy(
        pb.SetPolicyRequest(deployment="qwen", tunables=GOOD), metadata=auth
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await policy_stub.GetRanking(pb.GetRankingRequest(deployment="qwen", version=version))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
