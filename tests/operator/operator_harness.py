"""The operator end-to-end harness: kopf (KopfRunner) against the kmock Kubernetes emulator,
a real control plane (in-process gRPC, port 0) and a real CPU data plane that follows the pod
spec and ConfigMap the operator wrote; the helpers that play the Deployment controller and
read what the operator did. Its fixtures, `control_plane` and `env`, are in conftest.py."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import os
import tempfile
import time

from kopf.testing import KopfRunner

from rimuru.controlplane.client import ControlPlaneClient
from rimuru.dataplane.serve import cli as serve_cli
from rimuru.dataplane.serve.server import create_server as create_dataplane_server

TOKEN = "e2e-token-5f1c"
NS = "default"
RD = "rimuru.dev/v1alpha1/rimurudeployments"
RD_PATH = f"/apis/rimuru.dev/v1alpha1/namespaces/{NS}/rimurudeployments"
DEPLOYMENTS = "apps/v1/deployments"


async def eventually(check, timeout: float = 20.0, what: str = ""):
    """Poll `check()` until it returns a truthy value, without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except (KeyError, ValueError, TypeError):
            result = None  # not there yet
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.05)


# What a real API server fills in on a Deployment it stores, where the operator's leave
# them unset: the emulator (conftest.py) writes them too, so that the tests see the operator
# tell the server's defaults from drift.
_POD_DEFAULTS = {
    "restartPolicy": "Always",
    "dnsPolicy": "ClusterFirst",
    "schedulerName": "default-scheduler",
    "terminationGracePeriodSeconds": 30,
}


def with_deployment_defaults(deployment: dict) -> dict:
    """`deployment` as the API server stores it (a new object)."""
    deployment = copy.deepcopy(deployment)
    spec = deployment.setdefault("spec", {})
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    pod = spec.get("template", {}).get("spec")
    if not isinstance(pod, dict):
        return deployment
    for key, value in _POD_DEFAULTS.items():
        pod.setdefault(key, value)
    for container in pod.get("containers") or ():
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container:
                container[probe].setdefault("successThreshold", 1)
                if "grpc" in container[probe]:
                    container[probe]["grpc"].setdefault("service", "")
        for port in container.get("ports") or ():
            port.setdefault("protocol", "TCP")
    for volume in pod.get("volumes") or ():
        for source in ("secret", "configMap", "projected"):
            if source in volume:
                volume[source].setdefault("defaultMode", 0o644)
    return deployment


def obj(kmock, resource: str, name: str) -> dict | None:
    """The stored object as a GET would return it; None if never created or deleted."""
    try:
        stored = kmock.objects[resource, NS, name]
    except KeyError:
        return None
    return None if stored.deleted else stored.raw


def engine_config_map(kmock, deployment: str = "tiny-dataplane") -> dict | None:
    """The engine ConfigMap the data-plane Deployment's pods read (named by its content)."""
    template = obj(kmock, DEPLOYMENTS, deployment)["spec"]["template"]
    (source,) = template["spec"]["containers"][0]["envFrom"]
    return obj(kmock, "v1/configmaps", source["configMapRef"]["name"])


@contextlib.asynccontextmanager
async def operator_running():
    # KopfRunner joins its thread on exit; do that off this loop, which serves kmock
    # and the control plane the operator may still be talking to.
    runner = KopfRunner(
        ["run", "--verbose", "--standalone", "--all-namespaces", "-m", "rimuru.operator.handlers"],
        timeout=30,
    )
    runner.__enter__()
    try:
        yield runner
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)


class PodDataPlane:
    """`rimuru serve` as the operator's data-plane pod would run it: its container args
    and its ConfigMap environment go through the serve CLI's own parser, then the real
    gRPC data plane (engine thread, policy follower) starts on the CPU. Only the
    addresses change (port 0, the test's control plane instead of the Service), and the
    token file path (the Secret is not mounted here)."""

    def __init__(self, args: list[str], environment: dict[str, str], control_plane: str):
        parser = argparse.ArgumentParser()
        with _environ({**environment, "RIMURU_NODE_ID": "tiny-dataplane-0"}):
            serve_cli.add_arguments(parser)  # flag defaults are read from the environment
        parsed = parser.parse_args(args)
        parsed.control_plane, parsed.port, parsed.metrics_port = control_plane, 0, None
        if parsed.token_file:  # the mounted Secret: here a temp file with the same token
            with tempfile.NamedTemporaryFile("w", suffix=".token", delete=False) as f:
                f.write(TOKEN)
            parsed.token_file = f.name
        self.config = serve_cli.engine_config(parsed)
        self.link = serve_cli.control_plane_link(parsed)
        self.handle = None

    async def start(self) -> None:
        server, _, self.handle = await create_dataplane_server(
            self.config, "127.0.0.1:0", control_plane=self.link
        )
        await server.start()
        await self.handle.start()  # model loaded and warmed up, then follows the policy

    async def tunables(self):
        return await self.handle.call_engine(lambda engine: engine.tunables)

    async def stop(self) -> None:
        if self.handle is not None:
            await self.handle.shutdown(1.0)


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


async def _call(http, method: str, path: str, body=None, content_type="application/json"):
    headers = {"Content-Type": content_type}
    async with http.request(method, path, json=body, headers=headers) as response:
        assert response.status < 400, (method, path, response.status, await response.text())
        return await response.json(content_type=None)


async def emulate_rollout(http, name: str, replicas: int) -> None:
    """What the Deployment controller and kubelet report once the pods of the
    Deployment's current spec (its metadata.generation) are ready."""
    path = f"/apis/apps/v1/namespaces/{NS}/deployments/{name}"
    generation = (await _call(http, "GET", path))["metadata"]["generation"]
    status = {
        "observedGeneration": generation,
        "replicas": replicas,
        "readyReplicas": replicas,
        "updatedReplicas": replicas,
    }
    await _call(http, "PATCH", f"{path}/status", {"status": status}, "application/merge-patch+json")


async def get_policy(target: str, deployment: str):
    # The client blocks; this loop serves the control plane, so call it from a thread.
    def blocking():
        with ControlPlaneClient(target) as cp:
            return cp.get_policy(deployment)

    return await asyncio.to_thread(blocking)


def condition(rd: dict, type_: str) -> dict:
    return next(c for c in rd["status"]["conditions"] if c["type"] == type_)


def rollout_state(kmock, name: str = "tiny") -> tuple[str, str, str]:
    """(phase, Progressing status, Progressing reason) of a RimuruDeployment."""
    rd = obj(kmock, RD, name)
    progressing = condition(rd, "Progressing")
    return rd["status"]["phase"], progressing["status"], progressing["reason"]


_RBAC_VERB = {"FETCH": "get", "LIST": "list", "WATCH": "watch", "CREATE": "create",
              "DELETE": "delete", "PATCH": "patch", "PUT": "update"}  # fmt: skip


def operator_calls(kmock) -> dict[tuple[str, str], set[str]]:
    """(API group, resource[/subresource]) -> RBAC verbs of every call the operator made
    (with its kubeconfig's token: the test's own calls carry none)."""
    calls: dict[tuple[str, str], set[str]] = {}
    for request in kmock:
        if request.resource is None or "Authorization" not in request.headers:
            continue
        if request.resource.plural is None:
            continue  # API discovery: open to every authenticated client
        resource = request.resource.plural
        if request.subresource:
            resource += f"/{request.subresource}"
        action = request.action.value
        verb = _RBAC_VERB[request.method.value if action == "UPDATE" else action]
        calls.setdefault((request.resource.group or "", resource), set()).add(verb)
    return calls


async def deleted(kmock, http, name: str = "tiny") -> None:
    """kubectl delete rd NAME, and wait until the finalizer has let it go."""
    await _call(http, "DELETE", f"{RD_PATH}/{name}")
    await eventually(lambda: obj(kmock, RD, name) is None, what=f"{name} deleted")


async def recovered_then_deleted(kmock, http) -> None:
    """Wait until "tiny" is no longer Degraded, then delete it and wait until it is gone."""
    await eventually(
        lambda: condition(obj(kmock, RD, "tiny"), "Degraded")["status"] == "False",
        what="no longer Degraded",
    )
    await deleted(kmock, http)


async def create_tiny(http, tiny_rd: dict) -> dict:
    """kubectl apply of the tiny example with the user's token Secret (authSecretRef)."""
    rd = copy.deepcopy(tiny_rd)
    rd["spec"]["authSecretRef"] = await create_token_secret(http)
    await _call(http, "POST", RD_PATH, rd)
    return rd


async def rolled_out_tiny(kmock, http, tiny_rd: dict) -> None:
    """create_tiny, then play the Deployment controller for both planes until the
    RimuruDeployment reports the rollout complete."""
    await create_tiny(http, tiny_rd)
    for name in ("tiny-controlplane", "tiny-dataplane"):
        await eventually(lambda n=name: obj(kmock, DEPLOYMENTS, n), what=name)
        await emulate_rollout(http, name, 1)
    await eventually(lambda: rollout_state(kmock)[2] == "RolloutComplete", what="settled")


async def failed_with(kmock, name: str, reason: str) -> dict:
    """Wait for phase Failed; returns the Degraded condition, checked True for `reason`."""
    await eventually(
        lambda: obj(kmock, RD, name)["status"]["phase"] == "Failed", what=f"{name} Failed"
    )
    degraded = condition(obj(kmock, RD, name), "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", reason)
    return degraded


async def create_token_secret(http) -> dict:
    """The user's token Secret (authSecretRef); the control plane was started with it."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "tiny-auth", "namespace": NS},
        "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
    }
    await _call(http, "POST", f"/api/v1/namespaces/{NS}/secrets", secret)
    return {"name": "tiny-auth", "key": "token"}
