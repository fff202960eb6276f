"""The data plane's watcher NACKs pushes the wire contract forbids, from any server."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from rimuru.dataplane.serve.grpc_front.convert import policy_change
from rimuru.dataplane.serve.grpc_front.policy_watch import Backoff, PolicyWatcher
from rimuru.v1 import control_pb2 as pb
from rimuru.v1 import control_pb2_grpc as pb_grpc
from tests.controlplane.test_policy_watch import running

TUNABLES = pb.Tunables(
    mode=pb.MODE_ELASTIC, shrink_threshold=2, grow_threshold=9, max_grow_per_round=5,
)  # fmt: skip


def push(version: int, **tunables) -> pb.PolicyUpdate:
    msg = pb.Tunables()
    msg.CopyFrom(TUNABLES)
    for name, value in tunables.items():
        setattr(msg, name, value)
    policy = pb.Policy(deployment="qwen", version=version, tunables=msg)
    return pb.PolicyUpdate(version=version, nonce=f"n{version}", policy=policy)


class ScriptedControlPlane(pb_grpc.PolicyDiscoveryServiceServicer):
    """Pushes a fixed list on the first stream, one at a time, and records the answers."""

    def __init__(self, updates: list[pb.PolicyUpdate]) -> None:
        self.updates = updates
        self.answers: list[pb.PolicyDiscoveryRequest] = []
        self.finished = asyncio.Event()

    async def WatchPolicy(self, request_iterator, context):
        requests = aiter(request_iterator)
        await anext(requests)  # the opening message
        for update in self.updates:
            yield update
            self.answers.append(await anext(requests))
        self.finished.set()
        await asyncio.Event().wait()


async def test_forbidden_pushes_are_nacked_and_the_old_version_stays():
    updates = [
        push(0),  # versions start at 1
        push(3),
        push(4, shrink_threshold=9),  # shrink == grow
        push(5, max_grow_per_round=0),
        push(2),  # a downgrade on the same stream
        push(3),  # a repeat
        push(6),
    ]
    servicer = ScriptedControlPlane(updates)
    server = grpc.aio.server()
    pb_grpc.add_PolicyDiscoveryServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    applied: list[int] = []

    def apply(update: pb.PolicyUpdate) -> None:  # the data plane's conversion, no engine
        applied.append(policy_change(update).version)

    watcher = PolicyWatcher(
        f"127.0.0.1:{port}", "pod", "qwen", apply, backoff=Backoff(initial_s=0.05)
    )
    try:
        async with running(watcher.run()):
            await asyncio.wait_for(servicer.finished.wait(), 5)
    finally:
        await server.stop(None)
    assert applied == [3, 6]
    nacked = [bool(a.error_detail) for a in servicer.answers]
    assert nacked == [True, False, True, True, True, True, False]
    assert [a.version_info for a in servicer.answers] == [0, 3, 3, 3, 3, 3, 6]
    assert servicer.answers[0].error_detail.startswith("version:")
    assert "shrink_threshold" in servicer.answers[2].error_detail


class RefusingControlPlane(pb_grpc.PolicyDiscoveryServiceServicer):
    """Ends every watch right after its opening with `code`, as a full registry does; a
    client that was still writing its opening sees CANCELLED or INTERNAL instead."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code
        self.num_watches = 0

    async def WatchPolicy(self, request_iterator, context):
        await anext(aiter(request_iterator))
        self.num_watches += 1
        await context.abort(self.code, "")
        yield  # an async generator, as a streaming handler is


@pytest.mark.parametrize("code", [grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL])
async def test_a_watch_ended_before_any_push_backs_off_whatever_its_code(code):
    servicer = RefusingControlPlane(code)
    server = grpc.aio.server()
    pb_grpc.add_PolicyDiscoveryServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    watcher = PolicyWatcher(
        f"127.0.0.1:{port}",
        "pod",
        "qwen",
        apply=lambda update: None,
        backoff=Backoff(initial_s=0.05, multiplier=2.0, jitter=0.0),
    )
    try:
        async with running(watcher.run()):
            await asyncio.sleep(1.5)
    finally:
        await server.stop(None)
    # Growing delays watch at about 0, 0.05, 0.15, 0.35, 0.75 and 1.55 s; restarting the
    # backoff after each connect would watch every 0.05 s (about 25 times).
    assert 2 <= servicer.num_watches <= 6
    assert watcher.num_pushes == 0
