"""The data plane's PolicyWatcher and RoutingReporter against a real control plane."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from rimuru.dataplane.serve.grpc_front.policy_watch import Backoff, PolicyWatcher, RoutingReporter
from rimuru.policy import Tunables
from rimuru.v1 import control_pb2 as pb

FAST = Backoff(initial_s=0.05, multiplier=2.0, max_s=0.2, jitter=0.2)


class FakeEngine:
    """What the data plane's apply callback does: all tunables or none, refuse bad ones."""

    def __init__(self, max_offload: int) -> None:
        self.max_offload = max_offload
        self.applied: list[int] = []

    def apply(self, update: pb.PolicyUpdate) -> None:
        limit = update.policy.tunables.expert_offload_limit
        if limit > self.max_offload:
            raise ValueError(f"expert_offload_limit {limit} > {self.max_offload} experts")
        self.applied.append(update.version)


@contextlib.asynccontextmanager
async def running(task_coro):
    task = asyncio.create_task(task_coro)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(watcher: PolicyWatcher, predicate, timeout: float = 5.0) -> None:
    await asyncio.wait_for(watcher.wait_for(predicate), timeout)


async def test_apply_ack_nack_and_restart_of_the_control_plane(start_control_plane, tmp_path):
    data_dir = tmp_path / "cp-data"
    cp = await start_control_plane(data_dir)
    cp.plane.set_policy("qwen", Tunables(expert_offload_limit=2))
    engine = FakeEngine(max_offload=4)
    watcher = PolicyWatcher(
        cp.target, "pod-0", "qwen", engine.apply, backoff=FAST, rng=random.Random(0)
    )
    async with running(watcher.run()):
        await until(watcher, lambda w: w.applied_version == 1)
        assert engine.applied == [1]
        assert watcher.last_applied.policy.tunables.expert_offload_limit == 2

        # A policy the engine refuses: NACK, the old one stays, the error is visible.
        cp.plane.set_policy("qwen", Tunables(expert_offload_limit=6))

        def nacked() -> bool:
            subs = cp.plane.list_subscribers("qwen")
            return bool(subs and subs[0].last_error)

        await _poll(nacked)
        (sub,) = cp.plane.list_subscribers("qwen")
        assert (sub.applied_version, sub.last_nacked_version) == (1, 2)
        assert sub.last_error == "expert_offload_limit 6 > 4 experts"
        assert watcher.applied_version == 1 and engine.applied == [1]

        # Kill the control plane: the watcher keeps version 1 and retries.
        port = cp.port
        await cp.stop()
        await until(watcher, lambda w: not w.connected)
        await asyncio.sleep(0.3)  # a few failed attempts
        assert watcher.applied_version == 1 and watcher.num_connects == 1

        # Restart on the same data dir and port: it resumes at version 2 (persisted),
        # the node reconnects saying it runs 1, gets 2 pushed again and NACKs it again.
        cp = await start_control_plane(data_dir, port=port)
        assert cp.plane.get_policy("qwen").version == 2
        await until(watcher, lambda w: w.num_connects == 2 and w.connected)
        await _poll(nacked)
        # A good version after the restart is numbered 3 and applied.
        assert cp.plane.set_policy("qwen", Tunables(expert_offload_limit=3)).version == 3
        await until(watcher, lambda w: w.applied_version == 3)
        assert engine.applied == [1, 3]

        def acked() -> bool:
            (s,) = cp.plane.list_subscribers("qwen")
            return s.applied_version == 3 and s.last_error == "" and s.connected

        await _poll(acked)


async def test_watcher_started_before_the_control_plane(start_control_plane, tmp_path):
    cp = await start_control_plane(tmp_path / "d")
    cp.plane.set_policy("qwen", Tunables())
    port = cp.port
    await cp.stop()
    engine = FakeEngine(max_offload=64)
    # The node already runs version 1 (e.g. from its last life): nothing to push.
    watcher = PolicyWatcher(
        f"127.0.0.1:{port}", "pod-1", "qwen", engine.apply, applied_version=1, backoff=FAST
    )
    async with running(watcher.run()):
        await asyncio.sleep(0.3)
        assert not watcher.connected and watcher.num_connects == 0
        cp = await start_control_plane(tmp_path / "d", port=port)
        await until(watcher, lambda w: w.connected)
        await _poll(lambda: [s.applied_version for s in cp.plane.list_subscribers()] == [1])
        assert engine.applied == []
        cp.plane.set_policy("qwen", Tunables(mode="fixed"))
        await until(watcher, lambda w: w.applied_version == 2)
        assert watcher.last_applied.policy.tunables.mode == pb.MODE_FIXED


async def test_routing_reporter_feeds_the_aggregator(start_control_plane):
    cp = await start_control_plane(None)
    batches = iter([{0: [3, 1], 1: [0, 4]}, {0: [1, 1], 1: [2, 0]}])

    def counts() -> dict[int, list[int]]:
        return next(batches, {})

    reporter = RoutingReporter(cp.target, "pod-2", "qwen", counts, interval_s=0.02)
    async with running(reporter.run()):
        await _poll(lambda: reporter.num_reports_sent == 2)
        # Sent, but the server may not have folded in the last message yet.
        await _poll(lambda: cp.plane.hotness.counts("qwen", now=0.0) is not None)
        await _poll(lambda: sum(map(sum, cp.plane.hotness.counts("qwen", now=0.0))) > 11.9)
    # Half-life 300 s: the milliseconds between the two reports decay almost nothing.
    table = cp.plane.hotness.counts("qwen", now=0.0)
    assert [[round(c) for c in row] for row in table] == [[4, 2], [2, 4]]


def test_backoff_grows_caps_and_jitters():
    backoff = Backoff(initial_s=1.0, multiplier=2.0, max_s=5.0, jitter=0.1)
    rng = random.Random(7)
    delays = [backoff.delay(attempt, rng) for attempt in range(6)]
    for delay, base in zip(delays, [1, 2, 4, 5, 5, 5], strict=True):
        assert base * 0.9 <= delay <= base * 1.1
    assert len(set(delays)) == len(delays)  # jittered: no two alike


def test_reporter_rejects_a_zero_interval():
    with pytest.raises(ValueError, match="interval_s"):
        RoutingReporter("127.0.0.1:1", "n", "d", dict, interval_s=0)


async def _poll(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_a_crashing_apply_is_nacked_and_the_watch_goes_on(start_control_plane):
    cp = await start_control_plane(None)
    cp.plane.set_policy("qwen", Tunables(expert_offload_limit=1))

    async def apply(update: pb.PolicyUpdate) -> None:  # async callbacks are awaited
        if update.policy.tunables.expert_offload_limit == 1:
            raise RuntimeError("engine thread gone")

    watcher = PolicyWatcher(cp.target, "pod-3", "qwen", apply, backoff=FAST)
    async with running(watcher.run()):

        def nacked() -> bool:
            subs = cp.plane.list_subscribers("qwen")
            return bool(subs and subs[0].last_error)

        await _poll(nacked)
        (sub,) = cp.plane.list_subscribers("qwen")
        assert sub.last_error == "internal error: RuntimeError: engine thread gone"
        cp.plane.set_policy("qwen", Tunables(expert_offload_limit=2))
        await until(watcher, lambda w: w.applied_version == 2)
        assert watcher.num_connects == 1


async def test_a_second_watcher_with_the_same_node_id_backs_off_and_takes_nothing(
    start_control_plane,
):
    cp = await start_control_plane(None)
    cp.plane.set_policy("qwen", Tunables(expert_offload_limit=1))
    owner = PolicyWatcher(cp.target, "pod-4", "qwen", FakeEngine(8).apply, backoff=FAST)
    growing = Backoff(initial_s=0.02, multiplier=2.0, max_s=5.0, jitter=0.0)
    twin = PolicyWatcher(cp.target, "pod-4", "qwen", FakeEngine(8).apply, backoff=growing)
    async with running(owner.run()):
        await until(owner, lambda w: w.applied_version == 1)
        async with running(twin.run()):
            await asyncio.sleep(0.7)  # refusals after 0.02, 0.04, 0.08, 0.16, 0.32 s
        assert twin.applied_version == 0 and twin.num_connects <= 6
        cp.plane.set_policy("qwen", Tunables(expert_offload_limit=2))
        await until(owner, lambda w: w.applied_version == 2)
        assert owner.num_connects == 1
        await _poll(lambda: cp.plane.list_subscribers("qwen")[0].applied_version == 2)
        assert cp.plane.list_subscribers("qwen")[0].connected
