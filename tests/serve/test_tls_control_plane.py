"""The data plane follows a control plane that serves TLS (and sends its token with reports)."""

from __future__ import annotations

import grpc

from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.server import TlsFiles, create_server
from rimuru.dataplane.serve.grpc_front.control import ControlPlaneLink
from rimuru.dataplane.serve.grpc_front.policy_watch import Backoff
from rimuru.v1 import control_pb2 as cpb
from rimuru.v1 import control_pb2_grpc as cpb_grpc


async def test_data_plane_follows_a_tls_control_plane(self_signed, start_data_plane, eventually):
    cert, key = self_signed
    plane = ControlPlane.open(None)
    server, port = await create_server(
        "localhost:0", plane, token="tok", tls=TlsFiles.read(str(cert), str(key))
    )
    await server.start()
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
            tunables = cpb.Tunables(
                mode=cpb.MODE_ELASTIC, expert_offload_limit=3, shrink_threshold=2,
                grow_threshold=9, max_grow_per_round=5,
            )  # fmt: skip
            await cpb_grpc.PolicyServiceStub(channel).SetPolicy(
                cpb.SetPolicyRequest(deployment="tls", tunables=tunables),
                metadata=(("authorization", "Bearer tok"),),
            )
        link = ControlPlaneLink(
            f"localhost:{port}", "tls", "dp-tls", report_interval_s=0.1,
            backoff=Backoff(initial_s=0.05, max_s=0.2), token="tok",
            root_certificates=cert.read_bytes(),
        )  # fmt: skip
        dp = await start_data_plane(control_plane=link)

        async def applied() -> bool:
            return (await dp.stats()).policy_version == 1

        await eventually(applied, what="policy v1 applied over TLS")
        await dp.generate([5, 6, 7], max_tokens=4, ignore_eos=True)

        async def reported() -> bool:
            return plane.hotness.counts("tls", 1e12) is not None

        await eventually(reported, what="routing reports accepted (token + TLS)")
    finally:
        await server.stop(None)
        plane.close()
