"""The engine ConfigMap is named by the config it holds: a change makes a new one and
leaves the one the running pods read as it was, so a pod restarting mid-rollout, or the
pods after `kubectl rollout undo`, start with their own template's config. The operator
keeps as many earlier configs as the Deployment keeps ReplicaSets, and deletes them all
with the RimuruDeployment. Against the emulated API server, through the reconcile steps."""

from __future__ import annotations

import copy

import pytest
from kubernetes_asyncio.client import Configuration

from rimuru.operator import reconcile
from rimuru.operator.builders import Tokens, build_engine_config_map
from rimuru.operator.config import OperatorConfig
from rimuru.operator.kube import KubeClient
from rimuru.operator.naming import REVISION_HISTORY_LIMIT
from rimuru.operator.spec import parse_spec

CONFIG = OperatorConfig(dataplane_image="reg/dp:test", controlplane_image="reg/cp:test")
TOKENS = Tokens(operator="op-t0k3n", dataplane="dp-t0k3n")


@pytest.fixture
async def kube(kube_api):
    client = KubeClient(Configuration(host=str(kube_api.url).rstrip("/")))
    yield client
    await client.close()


def _spec(tiny_rd, generation: int, *, max_num_seqs: int = 16, offload_limit: int = 2):
    rd = copy.deepcopy(tiny_rd)
    rd["metadata"]["generation"] = generation
    rd["spec"]["engine"]["maxNumSeqs"] = max_num_seqs
    rd["spec"]["policy"]["expertOffloadLimit"] = offload_limit
    return parse_spec(rd["metadata"], rd["spec"])


def _name(spec) -> str:
    return build_engine_config_map(spec)["metadata"]["name"]


async def _reconciled(kube, spec) -> None:
    await reconcile.apply_children(kube, spec, CONFIG, TOKENS)
    await reconcile.prune_children(kube, spec, CONFIG)


async def _read_by_pods(kube) -> str:
    deployment = await kube.get("Deployment", "default", "tiny-dataplane")
    (source,) = deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"]
    return source["configMapRef"]["name"]


def test_the_name_follows_the_engine_config_not_the_live_policy(tiny_rd):
    first = _spec(tiny_rd, 1)
    assert _name(_spec(tiny_rd, 2, max_num_seqs=8)) != _name(first)
    # a live tunable is pushed, not rolled out: same ConfigMap, its start-up value updated
    assert _name(_spec(tiny_rd, 2, offload_limit=3)) == _name(first)


async def test_a_change_leaves_the_old_config_and_an_undo_finds_it(kube, tiny_rd):
    first = _spec(tiny_rd, 1)
    await _reconciled(kube, first)
    old = await kube.get("ConfigMap", "default", _name(first))
    assert old["data"]["RIMURU_MAX_NUM_SEQS"] == "16"

    second = _spec(tiny_rd, 2, max_num_seqs=8)
    await _reconciled(kube, second)
    assert await _read_by_pods(kube) == _name(second)
    assert (await kube.get("ConfigMap", "default", _name(second)))["data"][
        "RIMURU_MAX_NUM_SEQS"
    ] == "8"
    # The old template's config is still there, unchanged: its pods restart with it.
    assert (await kube.get("ConfigMap", "default", _name(first)))["data"] == old["data"]

    back = _spec(tiny_rd, 3)  # the spec changed back: the same config, the same name
    await _reconciled(kube, back)
    assert await _read_by_pods(kube) == _name(first)


async def test_earlier_configs_beyond_the_history_are_pruned(kube, tiny_rd):
    specs = [_spec(tiny_rd, g, max_num_seqs=g) for g in range(1, REVISION_HISTORY_LIMIT + 4)]
    for spec in specs:
        await _reconciled(kube, spec)
    deployment = await kube.get("Deployment", "default", "tiny-dataplane")
    assert deployment["spec"]["revisionHistoryLimit"] == REVISION_HISTORY_LIMIT
    names = [_name(s) for s in specs]
    present = [await kube.get("ConfigMap", "default", n) is not None for n in names]
    # the current one and the REVISION_HISTORY_LIMIT before it; the oldest are gone
    assert present == [False] * 2 + [True] * (REVISION_HISTORY_LIMIT + 1)
    # what the server stored for each write is kept only while the object lives
    remembered = {k[2] for k in kube.stored_shapes if k[0] == "ConfigMap"}
    assert not remembered & set(names[:2])

    deleted = await reconcile.delete_children(kube, specs[-1].owner)
    assert {("ConfigMap", n) for n in names[2:]} <= set(deleted)
    assert [await kube.get("ConfigMap", "default", n) for n in names] == [None] * len(names)
    assert not any(k[1:] == ("default", n) for k in kube.stored_shapes for n in names)
