"""Placement fields reach the data-plane pods as written (and the control plane's pull
secrets reach its pod); the operator's own labels and annotations cannot be replaced."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from rimuru.operator.builders import build_controlplane_deployment, build_dataplane_deployment
from rimuru.operator.config import OperatorConfig
from rimuru.operator.spec import SpecError, parse_spec

CONFIG = OperatorConfig(dataplane_image="reg/dp:1", controlplane_image="reg/cp:1")
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h200"]}]}
            ]
        }
    }
}
PLACEMENT = {
    "affinity": AFFINITY,
    "priorityClassName": "inference-high",
    "imagePullSecrets": [{"name": "registry-creds"}],
    "serviceAccountName": "rimuru-dataplane",
    "runtimeClassName": "nvidia",
    "podLabels": {"team": "ml", "cost-center": "42"},
    "podAnnotations": {"example.com/owner": "ml", "prometheus.io/port": "1"},
}


def _placed(rd, api):
    rd = copy.deepcopy(rd)
    rd["spec"]["dataPlane"].update(PLACEMENT)
    rd["spec"]["controlPlane"]["imagePullSecrets"] = [{"name": "registry-creds"}]
    rd, errors = api.admit(rd)
    assert errors == []
    return parse_spec(rd["metadata"], rd["spec"])


def test_placement_reaches_the_data_plane_pods(tiny_rd, api):
    deployment = build_dataplane_deployment(_placed(tiny_rd, api), CONFIG)
    template = deployment["spec"]["template"]
    pod = template["spec"]
    assert pod["affinity"] == AFFINITY
    assert pod["priorityClassName"] == "inference-high"
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert pod["serviceAccountName"] == "rimuru-dataplane"
    assert pod["automountServiceAccountToken"] is False  # still no API token
    assert pod["runtimeClassName"] == "nvidia"
    labels, annotations = template["metadata"]["labels"], template["metadata"]["annotations"]
    assert {"team": "ml", "cost-center": "42"}.items() <= labels.items()
    assert labels["app.kubernetes.io/instance"] == "tiny"
    assert annotations["example.com/owner"] == "ml"
    assert annotations["prometheus.io/port"] == "9464"  # the operator's own wins
    kubernetes_validate.validate(deployment, api.kube_version, strict=True)


def test_the_control_planes_pull_secrets(tiny_rd, api):
    deployment = build_controlplane_deployment(_placed(tiny_rd, api), CONFIG)
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [
        {"name": "registry-creds"}
    ]
    kubernetes_validate.validate(deployment, api.kube_version, strict=True)


def test_unset_placement_adds_nothing(tiny_rd):
    pod = build_dataplane_deployment(parse_spec(tiny_rd["metadata"], tiny_rd["spec"]), CONFIG)
    absent = {"affinity", "priorityClassName", "imagePullSecrets", "serviceAccountName",
              "runtimeClassName"}  # fmt: skip
    assert absent.isdisjoint(pod["spec"]["template"]["spec"])


@pytest.mark.parametrize("key", ["app.kubernetes.io/instance", "app.kubernetes.io/name"])
def test_the_operators_labels_cannot_be_replaced(tiny_rd, api, key):
    rd = copy.deepcopy(tiny_rd)
    rd["spec"]["dataPlane"]["podLabels"] = {key: "other"}
    _, errors = api.admit(rd)
    assert errors == [
        "spec.dataPlane.podLabels: labels under app.kubernetes.io/ are the operator's "
        "(the Deployment's selector uses them)"
    ]
    with pytest.raises(SpecError) as info:
        parse_spec(rd["metadata"], rd["spec"])
    assert info.value.field == "spec.dataPlane.podLabels"
