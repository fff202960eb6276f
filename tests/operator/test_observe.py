"""observe(): what the operator reads back from its children, against the emulated API
server (which starts metadata.generation at 1 and increments it on a spec change, as a
real one does). The test plays the Deployment controller by writing the status."""

from __future__ import annotations

import copy

import pytest
from kubernetes_asyncio.client import Configuration

from rimuru.operator import reconcile
from rimuru.operator.builders import Tokens
from rimuru.operator.config import OperatorConfig
from rimuru.operator.kube import KubeClient
from rimuru.operator.spec import parse_spec
from rimuru.operator.status import ChildSpec, compute_status

CONFIG = OperatorConfig(dataplane_image="reg/dp:test", controlplane_image="reg/cp:test")
TOKENS = Tokens(operator="op-t0k3n", dataplane="dp-t0k3n")


@pytest.fixture
async def kube(kmock):
    kmock.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", namespaced=True)
    client = KubeClient(Configuration(host=str(kmock.url).rstrip("/")))
    yield client
    await client.close()


async def controller_reports(kube: KubeClient, name: str, replicas: int) -> None:
    """The Deployment controller's status once it has acted on the current spec."""
    generation = (await kube.get("Deployment", "default", name))["metadata"]["generation"]
    status = {
        "observedGeneration": generation,
        "replicas": replicas,
        "readyReplicas": replicas,
        "updatedReplicas": replicas,
    }
    await kube.patch_status("Deployment", "default", name, status)


OBSERVED, STALE, MISSING = ChildSpec.OBSERVED, ChildSpec.STALE, ChildSpec.MISSING


def _observed(obs) -> tuple[ChildSpec, ChildSpec]:
    return obs.dataplane_spec, obs.controlplane_spec


async def test_a_deployment_is_rolled_only_once_it_observed_its_latest_spec(kube, tiny_rd):
    spec = parse_spec(tiny_rd["metadata"], tiny_rd["spec"])
    assert _observed(await reconcile.observe(kube, spec, None, None)) == (MISSING, MISSING)

    await reconcile.apply_children(kube, spec, CONFIG, TOKENS)
    # Created (generation 1), no controller has acted on it yet.
    assert _observed(await reconcile.observe(kube, spec, None, None)) == (STALE, STALE)

    await controller_reports(kube, "tiny-controlplane", 1)
    await controller_reports(kube, "tiny-dataplane", 1)
    obs = await reconcile.observe(kube, spec, None, None)
    assert _observed(obs) == (OBSERVED, OBSERVED)
    assert (obs.ready_replicas, obs.updated_replicas) == (1, 1)

    # A new data-plane template: the counts are the same, but they are the old pods'.
    rolled = copy.deepcopy(tiny_rd)
    rolled["spec"]["engine"]["maxNumSeqs"] = 8
    spec = parse_spec(rolled["metadata"], rolled["spec"])
    await reconcile.apply_children(kube, spec, CONFIG, TOKENS)
    obs = await reconcile.observe(kube, spec, None, None)
    assert _observed(obs) == (STALE, OBSERVED)
    assert (obs.ready_replicas, obs.updated_replicas) == (1, 1)
    status = compute_status(
        obs, [], now="2026-01-02T03:04:05Z", selector="", controlplane_endpoint="", endpoints={}
    )
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut")

    await controller_reports(kube, "tiny-dataplane", 1)
    assert _observed(await reconcile.observe(kube, spec, None, None)) == (OBSERVED, OBSERVED)
