"""`rimuru operator` as the pod runs it: a process with flags, a liveness endpoint, the
images from its flags on the children, and a clean exit on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import aiohttp
import pytest

NS = "default"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def eventually(check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = await check()
        if result:
            return result
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out: {check}")


@pytest.mark.slow
async def test_cli_serves_liveness_and_uses_its_flags(kube_api, tiny_rd):
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rimuru",
        "operator",
        "--all-namespaces",
        f"--liveness-port={port}",
        "--dataplane-image=reg/dp:from-flag",
        "--controlplane-target=127.0.0.1:1",  # nothing there: the policy push waits
        "--retry-delay=0.2",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        async with aiohttp.ClientSession() as http:

            async def healthy():
                try:
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(healthy)
            rd = dict(tiny_rd, metadata={**tiny_rd["metadata"], "resourceVersion": "1"})
            api = str(kube_api.url).rstrip("/")
            url = f"{api}/apis/rimuru.dev/v1alpha1/namespaces/{NS}/rimurudeployments"
            async with http.post(url, json=rd) as response:
                assert response.status < 400

            async def dataplane_image():
                try:
                    stored = kube_api.objects["apps/v1/deployments", NS, "tiny-dataplane"]
                except KeyError:
                    return None
                return stored["spec"]["template"]["spec"]["containers"][0]["image"]

            assert await eventually(dataplane_image) == "reg/dp:from-flag"
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, output.decode()[-3000:]


SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


@pytest.mark.skipif(os.path.exists(SERVICE_ACCOUNT_TOKEN), reason="runs inside a pod")
@pytest.mark.parametrize(
    ("kubeconfig", "message"),
    [
        (None, "rimuru operator: No Kubernetes credentials: run in a pod with a service account"),
        ("absent", "rimuru operator: cannot read the Kubernetes credentials in "),
    ],
)
def test_cli_without_credentials_exits_at_once_saying_how_to_provide_them(
    tmp_path, kubeconfig, message
):
    # once, kopf logged a LoginError and retried every minute for ever
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(tmp_path / kubeconfig)
    done = subprocess.run(
        [sys.executable, "-m", "rimuru", "operator", "--liveness-port=0"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert message in done.stderr
    assert "KUBECONFIG (or ~/.kube/config)" in done.stderr
    assert "Traceback" not in done.stderr
