"""Routing reports survive a control-plane restart (the stream closes under a write)."""

import asyncio
import contextlib

from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.server import create_server
from rimuru.dataplane.serve.grpc_front.policy_watch import Backoff, RoutingReporter


async def test_reporter_reconnects_after_the_control_plane_restarts():
    plane = ControlPlane.open(None)
    server, port = await create_server("127.0.0.1:0", plane)
    await server.start()
    reporter = RoutingReporter(
        f"127.0.0.1:{port}", "node", "d", lambda: {0: [1, 2]}, interval_s=0.1,
        backoff=Backoff(initial_s=0.05, max_s=0.2),
    )  # fmt: skip
    task = asyncio.create_task(reporter.run())
    try:
        await asyncio.sleep(0.6)
        assert reporter.num_reports_sent > 0
        await server.stop(None)
        await asyncio.sleep(0.6)
        assert not task.done()  # still retrying, not dead
        plane2 = ControlPlane.open(None)
        server2, _ = await create_server(f"127.0.0.1:{port}", plane2)
        await server2.start()
        before = reporter.num_reports_sent
        for _ in range(40):
            await asyncio.sleep(0.1)
            if reporter.num_reports_sent > before and plane2.hotness.counts("d", 1e12) is not None:
                break
        assert reporter.num_reports_sent > before
        assert plane2.hotness.counts("d", 1e12) is not None
        await server2.stop(None)
    finally:
        task.cancel()


async def test_routing_reports_need_the_token_when_one_is_set():
    import grpc

    from rimuru.v1 import control_pb2 as pb
    from rimuru.v1 import control_pb2_grpc as pb_grpc

    plane = ControlPlane.open(None)
    server, port = await create_server("127.0.0.1:0", plane, token="s3cret")
    await server.start()
    report = pb.RoutingReport(
        deployment="d", node_id="n", layers=[pb.LayerRoutingCounts(layer=0, counts=[1, 2])]
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.PolicyDiscoveryServiceStub(channel)
            for metadata, code in (
                (None, grpc.StatusCode.UNAUTHENTICATED),
                ((("authorization", "Bearer nope"),), grpc.StatusCode.UNAUTHENTICATED),
            ):
                call = stub.ReportRouting(metadata=metadata)
                with contextlib.suppress(Exception):
                    await call.write(report)
                    await call.done_writing()
                try:
                    await call
                    got = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as exc:
                    got = exc.code()
                assert got == code
            assert plane.hotness.counts("d", 1e12) is None  # nothing was counted
            call = stub.ReportRouting(metadata=(("authorization", "Bearer s3cret"),))
            await call.write(report)
            await call.done_writing()
            assert (await call).num_reports_accepted == 1
    finally:
        await server.stop(None)
