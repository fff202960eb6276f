"""Data planes keep serving through rollouts and node drains: the rolling-update strategy
follows the replica count (or the spec), a PodDisruptionBudget covers several replicas,
and the pods spread over nodes unless the spec says otherwise."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from rimuru.operator.builders import build_children, build_dataplane_deployment
from rimuru.operator.config import OperatorConfig
from rimuru.operator.spec import SpecError, parse_spec

CONFIG = OperatorConfig(dataplane_image="reg/dp:1", controlplane_image="reg/cp:1")
SELECTOR = {"app.kubernetes.io/instance": "tiny", "app.kubernetes.io/component": "dataplane"}


def _with(rd, **data_plane):
    rd = copy.deepcopy(rd)
    rd["spec"]["dataPlane"].update(data_plane)
    return rd


def _parse(rd):
    return parse_spec(rd["metadata"], rd["spec"])


def _strategy(rd):
    return build_dataplane_deployment(_parse(rd), CONFIG)["spec"]["strategy"]["rollingUpdate"]


def _budgets(rd):
    return [c for c in build_children(_parse(rd), CONFIG) if c["kind"] == "PodDisruptionBudget"]


@pytest.mark.parametrize(
    "replicas,rolling,expected",
    [
        # one replica: the old pod serves until the new one is ready (needs a spare GPU)
        (1, None, {"maxSurge": 1, "maxUnavailable": 0}),
        # several: one at a time, no surge pod waiting for a GPU
        (3, None, {"maxSurge": 0, "maxUnavailable": 1}),
        (3, {"maxSurge": "25%", "maxUnavailable": 0}, {"maxSurge": "25%", "maxUnavailable": 0}),
        (1, {"maxUnavailable": 1}, {"maxSurge": 0, "maxUnavailable": 1}),
        (3, {"maxSurge": 2}, {"maxSurge": 2, "maxUnavailable": 0}),
    ],
)
def test_rolling_update_keeps_one_replica_serving(tiny_rd, api, replicas, rolling, expected):
    fields = {"replicas": replicas} | ({"rollingUpdate": rolling} if rolling else {})
    rd, errors = api.admit(_with(tiny_rd, **fields))
    assert errors == []
    assert _strategy(rd) == expected
    kubernetes_validate.validate(
        build_dataplane_deployment(_parse(rd), CONFIG), api.kube_version, strict=True
    )


def test_a_rollout_that_could_never_move_is_refused(tiny_rd, api):
    stuck = _with(tiny_rd, rollingUpdate={"maxSurge": 0, "maxUnavailable": "0%"})
    _, errors = api.admit(stuck)
    assert errors == ["spec.dataPlane.rollingUpdate: maxSurge and maxUnavailable cannot both be 0"]
    with pytest.raises(SpecError) as info:
        _parse(stuck)
    assert info.value.field == "spec.dataPlane.rollingUpdate"
    _, errors = api.admit(_with(tiny_rd, rollingUpdate={"maxSurge": "lots"}))
    assert errors == ["must be a count >= 0 or a percentage such as 25%"]


def test_several_replicas_get_a_disruption_budget(tiny_rd, api):
    assert _budgets(tiny_rd) == []  # one replica: a budget could only block drains
    rd, _ = api.admit(_with(tiny_rd, replicas=2))
    (budget,) = _budgets(rd)
    assert budget["metadata"]["name"] == "tiny-dataplane"
    assert budget["metadata"]["ownerReferences"][0]["uid"] == "uid-tiny-1"
    assert budget["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": SELECTOR},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    kubernetes_validate.validate(budget, api.kube_version, strict=True)
    rd, _ = api.admit(_with(tiny_rd, replicas=4, podDisruptionBudget={"maxUnavailable": "50%"}))
    assert _budgets(rd)[0]["spec"]["maxUnavailable"] == "50%"
    rd, _ = api.admit(_with(tiny_rd, replicas=4, podDisruptionBudget={"enabled": False}))
    assert _budgets(rd) == []


def _spread(rd):
    pod = build_dataplane_deployment(_parse(rd), CONFIG)["spec"]["template"]["spec"]
    return pod.get("topologySpreadConstraints")


def test_pods_spread_over_nodes_unless_the_spec_says_otherwise(tiny_rd, api):
    assert _spread(tiny_rd) == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": SELECTOR},
        }
    ]
    zones = {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone",
             "whenUnsatisfiable": "DoNotSchedule"}  # fmt: skip
    rd, errors = api.admit(_with(tiny_rd, topologySpreadConstraints=[zones]))
    assert errors == []
    assert _spread(rd) == [{**zones, "labelSelector": {"matchLabels": SELECTOR}}]
    kubernetes_validate.validate(
        build_dataplane_deployment(_parse(rd), CONFIG), api.kube_version, strict=True
    )
    rd, _ = api.admit(_with(tiny_rd, topologySpreadConstraints=[]))
    assert _spread(rd) is None
