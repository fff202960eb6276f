"""TLS from certificate files: the typed client talks to a TLS control plane."""

from __future__ import annotations

import asyncio

import pytest

from rimuru.controlplane import errors
from rimuru.controlplane.client import ControlPlaneClient
from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.server import TlsFiles, create_server
from rimuru.policy import Tunables


async def test_tls_round_trip_and_plaintext_refused(self_signed):
    cert, key = self_signed
    plane = ControlPlane.open(None)
    server, port = await create_server(
        "localhost:0", plane, token="t", tls=TlsFiles.read(str(cert), str(key))
    )
    await server.start()
    try:

        def use_clients() -> None:
            with ControlPlaneClient(
                f"localhost:{port}", token="t", root_certificates=cert.read_bytes()
            ) as client:
                assert client.set_policy("qwen", Tunables()).version == 1
                assert client.get_policy("qwen").version == 1
            with (
                ControlPlaneClient(f"localhost:{port}", timeout_s=0.5) as plaintext,
                pytest.raises(errors.Unavailable),
            ):
                plaintext.get_policy("qwen")

        await asyncio.to_thread(use_clients)
    finally:
        await server.stop(None)
        plane.close()
