"""Fuzzed SetPolicy requests get the status an independent oracle predicts, every time."""

from __future__ import annotations

import asyncio
import re
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.server import create_server
from rimuru.v1 import control_pb2 as pb
from rimuru.v1 import control_pb2_grpc as pb_grpc

INT32 = st.integers(-(2**31), 2**31 - 1)
SMALL = st.integers(-3, 12)
DEPLOYMENTS = st.one_of(
    st.sampled_from(["qwen", "mixtral-8x7b", "a.b", "x" * 253, "x" * 254, "", "-a", "a-"]),
    st.text(alphabet="ab9-./_ XÉ", max_size=8),
)


FIELDS = (
    "mode",
    "expert_offload_limit",
    "shrink_threshold",
    "grow_threshold",
    "max_grow_per_round",
    "pages_per_expert",
)


@st.composite
def set_policy_requests(draw) -> pb.SetPolicyRequest:
    """Mostly near-valid requests (one field off, or none), so both sides get exercised."""
    valid_name = st.sampled_from(["qwen", "mixtral-8x7b", "a.b"])
    request = pb.SetPolicyRequest(deployment=draw(st.one_of(valid_name, valid_name, DEPLOYMENTS)))
    if draw(st.integers(0, 9)) > 0:
        shrink = draw(st.integers(0, 5))
        mode = draw(st.sampled_from([pb.MODE_RESIDENT, pb.MODE_FIXED, pb.MODE_ELASTIC]))
        tunables = pb.Tunables(
            mode=mode,
            expert_offload_limit=0 if mode == pb.MODE_RESIDENT else draw(st.integers(0, 8)),
            shrink_threshold=shrink,
            grow_threshold=shrink + draw(st.integers(1, 10)),
            max_grow_per_round=draw(st.integers(1, 5)),
            pages_per_expert=draw(st.sampled_from([0, 3, 3, 4])),  # retired: 0 or 3
            online_hotness=draw(st.booleans()),
        )
        for name in draw(st.lists(st.sampled_from(FIELDS), max_size=2)):
            wild = st.integers(-5, 9) if name == "mode" else st.one_of(SMALL, INT32)
            setattr(tunables, name, draw(wild))
        request.tunables.CopyFrom(tunables)
    if draw(st.booleans()):
        request.expected_version = draw(st.integers(0, 6))
    return request


def is_valid(request: pb.SetPolicyRequest) -> bool:
    """The rules of control.proto, written out again, independent of the implementation."""
    name_ok = re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", request.deployment) is not None
    if not (name_ok and len(request.deployment) <= 253 and request.HasField("tunables")):
        return False
    t = request.tunables
    return (
        t.mode in (pb.MODE_RESIDENT, pb.MODE_FIXED, pb.MODE_ELASTIC)
        and t.expert_offload_limit >= 0
        and t.shrink_threshold >= 0
        and t.max_grow_per_round >= 1
        and t.pages_per_expert in (0, 3)
        and t.grow_threshold > t.shrink_threshold
        and (t.mode != pb.MODE_RESIDENT or t.expert_offload_limit == 0)
    )


@pytest.fixture(scope="module")
def threaded_control_plane():
    """A control plane on its own event loop thread, so hypothesis can drive it blocking."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict = {}

    async def serve() -> None:
        plane = ControlPlane.open(None)
        server, port = await create_server("127.0.0.1:0", plane)
        await server.start()
        holder.update(server=server, port=port, stop=asyncio.Event())
        started.set()
        await holder["stop"].wait()
        await server.stop(None)
        plane.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10), "control plane did not start"
    channel = grpc.insecure_channel(f"127.0.0.1:{holder['port']}")
    yield channel
    channel.close()
    loop.call_soon_threadsafe(holder["stop"].set)
    thread.join(10)
    loop.close()


def test_fuzzed_set_policy_gets_the_right_status(threaded_control_plane):
    stub = pb_grpc.PolicyServiceStub(threaded_control_plane)
    versions: dict[str, int] = {}
    seen: set[grpc.StatusCode] = set()

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(set_policy_requests())
    def check(request: pb.SetPolicyRequest) -> None:
        current = versions.get(request.deployment, 0)
        if not is_valid(request):
            expected = grpc.StatusCode.INVALID_ARGUMENT
        elif request.HasField("expected_version") and request.expected_version != current:
            expected = grpc.StatusCode.ABORTED
        else:
            expected = grpc.StatusCode.OK
        try:
            policy = stub.SetPolicy(request, timeout=5)
            got = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            got = exc.code()
            assert exc.details(), "every error says what is wrong"
        assert got == expected, request
        seen.add(got)
        if got == grpc.StatusCode.OK:
            versions[request.deployment] = current + 1
            assert policy.version == current + 1
            # The retired pages_per_expert is answered as its one value, whatever was sent.
            sent = pb.Tunables()
            sent.CopyFrom(request.tunables)
            sent.pages_per_expert = 3
            assert policy.tunables == sent

    check()
    ok, invalid, aborted = (
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.ABORTED,
    )
    assert seen == {ok, invalid, aborted}, "the fuzzer should reach every outcome"
    health = health_pb2_grpc.HealthStub(threaded_control_plane)
    status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    for deployment, version in versions.items():
        got = stub.GetPolicy(pb.GetPolicyRequest(deployment=deployment), timeout=5)
        assert got.version == version
