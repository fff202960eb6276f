"""A token Secret that changes rolls the pods that read it: the control plane and the data
planes read their token files once, at start, so the checksum of what they read is on
their pod templates. End to end: the generated token Secret is deleted, the operator makes
a new one, the control plane rolls onto it and accepts the next push."""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
import socket

from kubernetes_asyncio.client import Configuration

from rimuru.controlplane.client import ControlPlaneClient
from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.server import create_server
from rimuru.operator.builders import Tokens, build_children, with_token_checksums
from rimuru.operator.config import OperatorConfig
from rimuru.operator.kube import KubeClient
from rimuru.operator.naming import TOKEN_CHECKSUM_ANNOTATION
from rimuru.operator.spec import parse_spec
from tests.operator import operator_harness as harness

CONFIG = OperatorConfig(dataplane_image="reg/dp:1", controlplane_image="reg/cp:1")


async def test_a_verbose_operator_does_not_log_a_token_it_reads(kmock, caplog):
    # the client library logs response bodies at DEBUG; a Secret's must not reach the log
    caplog.set_level(logging.DEBUG)
    token = base64.b64encode(b"never-in-a-log").decode()
    secret = {"apiVersion": "v1", "kind": "Secret", "data": {"token": token}}
    secret["metadata"] = {"name": "tiny-token", "namespace": "default"}
    kube = KubeClient(Configuration(host=str(kmock.url).rstrip("/")))
    try:
        await kube.create(secret)
        assert (await kube.get("Secret", "default", "tiny-token"))["data"] == {"token": token}
    finally:
        await kube.close()
    assert token not in caplog.text


def _checksums(children: list[dict]) -> dict[str, str]:
    return {
        c["metadata"]["name"]: c["spec"]["template"]["metadata"]["annotations"][
            TOKEN_CHECKSUM_ANNOTATION
        ]
        for c in children
        if c["kind"] == "Deployment"
    }


def test_each_template_changes_with_the_tokens_its_pods_read(tiny_rd):
    children = build_children(parse_spec(tiny_rd["metadata"], tiny_rd["spec"]), CONFIG)
    before = _checksums(with_token_checksums(children, Tokens("op-1", "dp-1")))
    operator_rotated = _checksums(with_token_checksums(children, Tokens("op-2", "dp-1")))
    dataplane_rotated = _checksums(with_token_checksums(children, Tokens("op-1", "dp-2")))
    assert operator_rotated["tiny-controlplane"] != before["tiny-controlplane"]
    assert operator_rotated["tiny-dataplane"] == before["tiny-dataplane"]  # not its token
    assert dataplane_rotated["tiny-controlplane"] != before["tiny-controlplane"]
    assert dataplane_rotated["tiny-dataplane"] != before["tiny-dataplane"]
    assert "annotations" not in children[1]["spec"]["template"]["metadata"]  # not mutated


def _token(kmock, name: str) -> str | None:
    secret = harness.obj(kmock, "v1/secrets", name)
    return None if secret is None else base64.b64decode(secret["data"]["token"]).decode()


class ControlPlanePod:
    """The control-plane Deployment's pod as the kubelet runs it: started with the tokens
    of the Secrets its template mounts, replaced only when the template changes."""

    def __init__(self, kmock, http, tmp_path) -> None:
        self._kmock, self._http, self._dir = kmock, http, tmp_path
        self._template = None
        self._server = self._plane = None
        self.port = 0
        self.num_starts = 0

    def reserve_port(self) -> None:
        # The operator dials one address for good: each pod of the rollout binds it.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]

    async def follow(self) -> bool:
        """Roll if the template changed; True once a pod of the current one runs."""
        deployment = harness.obj(self._kmock, harness.DEPLOYMENTS, "tiny-controlplane")
        token = _token(self._kmock, "tiny-operator-token")
        dataplane_token = _token(self._kmock, "tiny-dataplane-token")
        if deployment is None or token is None or dataplane_token is None:
            return False
        if deployment["spec"]["template"] == self._template:
            return True
        await self.stop()
        self._plane = ControlPlane.open(self._dir / "policy")  # the policy volume stays
        self._server, _ = await create_server(
            f"127.0.0.1:{self.port}", self._plane, token=token, dataplane_token=dataplane_token
        )
        await self._server.start()
        self._template = copy.deepcopy(deployment["spec"]["template"])
        self.num_starts += 1
        await harness.emulate_rollout(self._http, "tiny-controlplane", 1)
        return True

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._plane.close()
            self._server = None


async def _policy_limit(port: int, token: str) -> int:
    def blocking() -> int:
        with ControlPlaneClient(f"127.0.0.1:{port}", token) as cp:
            return cp.get_policy("tiny").tunables.expert_offload_limit

    return await asyncio.to_thread(blocking)


async def test_a_deleted_token_secret_rolls_the_control_plane_onto_the_new_token(
    kmock, env, tiny_rd, tmp_path, monkeypatch
):
    http = env
    pod = ControlPlanePod(kmock, http, tmp_path)
    pod.reserve_port()
    monkeypatch.setenv("RIMURU_OPERATOR_CONTROLPLANE_TARGET", f"127.0.0.1:{pod.port}")

    async def follow_until(check, what: str) -> None:
        async def poll():
            while not (await pod.follow() and check()):
                await asyncio.sleep(0.05)

        try:
            await asyncio.wait_for(poll(), timeout=20)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}") from None

    def status() -> dict:
        return harness.obj(kmock, harness.RD, "tiny").get("status") or {}

    try:
        async with harness.operator_running() as runner:
            # No authSecretRef: the operator generates tiny-operator-token.
            await harness._call(http, "POST", harness.RD_PATH, copy.deepcopy(tiny_rd))
            await follow_until(
                lambda: (status().get("policy") or {}).get("desiredVersion") == 1, "first push"
            )
            old_token = _token(kmock, "tiny-operator-token")

            secret_path = f"/api/v1/namespaces/{harness.NS}/secrets/tiny-operator-token"
            await harness._call(http, "DELETE", secret_path)
            # The next spec change reads the Secret again, finds it gone, makes a new one.
            tune = {"spec": {"policy": {"expertOffloadLimit": 3}}}
            path = f"{harness.RD_PATH}/tiny"
            await harness._call(http, "PATCH", path, tune, "application/merge-patch+json")
            await follow_until(
                lambda: (status().get("policy") or {}).get("desiredVersion") == 2,
                "the push after the rotation",
            )
            new_token = _token(kmock, "tiny-operator-token")
            assert new_token not in (None, old_token)
            assert pod.num_starts == 2  # rolled once, onto the new Secret
            assert await _policy_limit(pod.port, new_token) == 3
            progressing = harness.condition(harness.obj(kmock, harness.RD, "tiny"), "Progressing")
            assert progressing["reason"] != "ControlPlaneUnauthenticated"
            await harness.deleted(kmock, http)
        assert runner.exception is None
    finally:
        await pod.stop()
