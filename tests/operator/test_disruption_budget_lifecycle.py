"""The data planes' PodDisruptionBudget follows the replica count against the emulated
API server: created on scaling to two, restored after a deletion, deleted (ours only)
on scaling back to one."""

from __future__ import annotations

import copy

import pytest
from kubernetes_asyncio.client import Configuration

from rimuru.operator import reconcile
from rimuru.operator.builders import Tokens
from rimuru.operator.config import OperatorConfig
from rimuru.operator.kube import KubeClient
from rimuru.operator.spec import parse_spec

CONFIG = OperatorConfig(dataplane_image="reg/dp:test", controlplane_image="reg/cp:test")
TOKENS = Tokens(operator="op-t0k3n", dataplane="dp-t0k3n")


@pytest.fixture
async def kube(kmock):
    kmock.resources["policy/v1/poddisruptionbudgets"] = kmock.ResourceInfo(
        kind="PodDisruptionBudget", namespaced=True
    )
    client = KubeClient(Configuration(host=str(kmock.url).rstrip("/")))
    yield client
    await client.close()


def _scaled(rd, replicas):
    rd = copy.deepcopy(rd)
    rd["spec"]["dataPlane"]["replicas"] = replicas
    return parse_spec(rd["metadata"], rd["spec"])


async def test_budget_follows_the_replica_count(kube, tiny_rd):
    async def budget():
        return await kube.get("PodDisruptionBudget", "default", "tiny-dataplane")

    one = _scaled(tiny_rd, 1)
    await reconcile.apply_children(kube, one, CONFIG, TOKENS)
    await reconcile.prune_children(kube, one, CONFIG)
    assert await budget() is None

    two = _scaled(tiny_rd, 2)
    await reconcile.apply_children(kube, two, CONFIG, TOKENS)
    assert (await budget())["spec"]["maxUnavailable"] == 1
    await kube.delete("PodDisruptionBudget", "default", "tiny-dataplane")
    await reconcile.apply_children(kube, two, CONFIG, TOKENS)  # the periodic pass restores it
    assert await budget() is not None

    await reconcile.apply_children(kube, one, CONFIG, TOKENS)
    await reconcile.prune_children(kube, one, CONFIG)
    assert await budget() is None

    # Someone else's budget of the same name is not the operator's to delete.
    theirs = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "tiny-dataplane", "namespace": "default"},
        "spec": {"maxUnavailable": 0},
    }
    await kube.create(theirs)
    await reconcile.prune_children(kube, one, CONFIG)
    assert await budget() is not None


async def test_a_pass_for_a_replaced_spec_stops_before_its_next_write(kube, tiny_rd):
    """The periodic pass checks before each child that its spec is still the current one:
    written after the change handler's, the old spec's children would roll the pods back."""
    spec = _scaled(tiny_rd, 2)
    calls = 0

    def current() -> bool:  # the spec changes while the first child is being written
        nonlocal calls
        calls += 1
        return calls == 1

    assert not await reconcile.apply_children(kube, spec, CONFIG, TOKENS, current)
    first, *rest = reconcile.build_children(spec, CONFIG)
    assert await kube.get(first["kind"], "default", first["metadata"]["name"]) is not None
    for child in rest:
        assert await kube.get(child["kind"], "default", child["metadata"]["name"]) is None
    assert await reconcile.apply_children(kube, spec, CONFIG, TOKENS)  # current: all of them
    for child in rest:
        assert await kube.get(child["kind"], "default", child["metadata"]["name"]) is not None
