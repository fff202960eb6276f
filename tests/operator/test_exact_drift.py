"""The owned fields of a child are put back exactly: a key added by hand is drift (and the
patch removes it), the API server's own defaults are not. Pure checks of `drifted`, then
the operator against the emulated API server undoing three hand edits."""

from __future__ import annotations

import asyncio
import copy

import pytest

from rimuru.operator.apply import drifted, patch_operations, with_applied_hash
from rimuru.operator.autoscaling import Autoscaling
from rimuru.operator.builders import (
    build_controlplane_service,
    build_dataplane_autoscaler,
    build_dataplane_deployment,
)
from rimuru.operator.config import OperatorConfig
from rimuru.operator.spec import parse_spec
from tests.operator import operator_harness as harness
from tests.operator.test_polling_load import operator_requests

CONFIG = OperatorConfig(dataplane_image="reg/dp:1", controlplane_image="reg/cp:1")


def _stored_deployment(desired: dict) -> dict:
    """The Deployment as a real API server hands it back: every default it fills in."""
    live = copy.deepcopy(desired)
    spec = live["spec"]
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    template = spec["template"]
    template["metadata"]["creationTimestamp"] = None
    pod = template["spec"]
    pod.update(restartPolicy="Always", dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
    for container in pod["containers"]:
        container.update(
            terminationMessagePath="/dev/termination-log",
        )
        container.setdefault("terminationMessagePolicy", "File")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            container[probe]["successThreshold"] = 1
            container[probe].get("grpc", {}).setdefault("service", "")
        for var in container["env"]:
            if "valueFrom" in var:
                var["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
        limits = container["resources"].get("limits", {})
        container["resources"]["requests"] = {
            **limits,
            **container["resources"].get("requests", {}),
        }
    return live


@pytest.fixture
def dataplane(tiny_rd) -> dict:
    rd = copy.deepcopy(tiny_rd)
    rd["spec"]["dataPlane"]["resources"] = {"limits": {"cpu": "2", "memory": "2048Mi"}}
    return with_applied_hash(
        build_dataplane_deployment(parse_spec(rd["metadata"], rd["spec"]), CONFIG)
    )


def test_the_servers_defaults_and_canonical_quantities_are_not_drift(dataplane):
    live = _stored_deployment(dataplane)
    live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "2Gi"
    assert not drifted(live, dataplane)


@pytest.mark.parametrize(
    "reference,policy",
    [("reg/qwen:v1", "IfNotPresent"), ("reg/qwen:latest", "Always"), ("reg/qwen", "Always"),
     ("reg:5000/qwen@sha256:ab", "IfNotPresent")],
)  # fmt: skip
def test_an_image_volumes_defaulted_pull_policy_is_not_drift(gpu_rd, reference, policy):
    rd = copy.deepcopy(gpu_rd)
    rd["spec"]["model"]["volume"] = {"image": {"reference": reference}}
    desired = with_applied_hash(
        build_dataplane_deployment(parse_spec(rd["metadata"], rd["spec"]), CONFIG)
    )
    live = _stored_deployment(desired)
    (volume,) = [v for v in _pod(live)["volumes"] if "image" in v]
    volume["image"]["pullPolicy"] = policy  # what the API server fills in
    assert not drifted(live, desired)
    volume["image"]["pullPolicy"] = "Never"  # a hand edit
    assert drifted(live, desired)


def _pod(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def _container(obj: dict) -> dict:
    return _pod(obj)["containers"][0]


# Hand edits that the old containment check let stand: each adds a key the operator never
# sets, none of them an API-server default.
HAND_EDITS = {
    "privileged": lambda d: _container(d)["securityContext"].update(privileged=True),
    "hostNetwork": lambda d: _pod(d).update(hostNetwork=True),
    "hostPID": lambda d: _pod(d).update(hostPID=True),
    "serviceAccountName": lambda d: _pod(d).update(serviceAccountName="admin"),
    "nodeSelector key": lambda d: _pod(d).setdefault("nodeSelector", {}).update(pool="other"),
    "GPU limit": lambda d: _container(d)["resources"]["limits"].update({"nvidia.com/gpu": 1}),
    "extra volume": lambda d: _pod(d)["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
}


@pytest.mark.parametrize("edit", HAND_EDITS.values(), ids=HAND_EDITS.keys())
def test_a_key_added_by_hand_is_drift_and_the_patch_replaces_the_whole_spec(dataplane, edit):
    live = _stored_deployment(dataplane)
    edit(live)
    assert drifted(live, dataplane)
    assert {"op": "add", "path": "/spec", "value": dataplane["spec"]} in patch_operations(
        live, dataplane
    )


def test_a_service_selector_is_atomic(tiny_rd):
    desired = with_applied_hash(
        build_controlplane_service(parse_spec(tiny_rd["metadata"], tiny_rd["spec"]))
    )
    live = copy.deepcopy(desired)
    live["spec"].update(clusterIP="10.0.0.9", sessionAffinity="None")  # not owned
    assert not drifted(live, desired)
    live["spec"]["selector"]["extra"] = "x"  # now it selects no pod
    assert drifted(live, desired)
    assert {"op": "add", "path": "/spec/selector", "value": desired["spec"]["selector"]} in (
        patch_operations(live, desired)
    )


def test_an_autoscalers_defaulted_behaviour_is_not_drift_but_a_changed_one_is(tiny_rd):
    spec = parse_spec(tiny_rd["metadata"], tiny_rd["spec"])
    desired = with_applied_hash(build_dataplane_autoscaler(spec, Autoscaling(1, 4, 4)))
    live = copy.deepcopy(desired)
    live["spec"]["behavior"] = {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": 15},
                {"type": "Pods", "value": 4, "periodSeconds": 15},
            ],
        },
        "scaleDown": {
            "selectPolicy": "Max",
            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
        },
    }
    assert not drifted(live, desired)
    live["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] = 0
    assert drifted(live, desired)


def _path(kind: str, name: str) -> str:
    prefix = "/apis/apps/v1" if kind == "deployments" else "/api/v1"
    return f"{prefix}/namespaces/{harness.NS}/{kind}/{name}"


async def test_hand_edits_of_owned_fields_are_undone(kmock, env, tiny_rd, monkeypatch):
    # A period far longer than the test: the watch of the children alone brings the fix.
    monkeypatch.setenv("RIMURU_OPERATOR_STATUS_INTERVAL_SECONDS", "3600")
    http = env
    merge = "application/merge-patch+json"

    def dataplane():
        return harness.obj(kmock, harness.DEPLOYMENTS, "tiny-dataplane")

    def selector():
        return harness.obj(kmock, "v1/services", "tiny-controlplane")["spec"]["selector"]

    async with harness.operator_running() as runner:
        await harness.create_tiny(http, tiny_rd)
        await harness.eventually(lambda: dataplane() and selector(), what="children")
        wanted_selector = dict(selector())
        wanted_pod = copy.deepcopy(_pod(dataplane()))

        privileged = {"spec": {"template": {"spec": {
            "containers": [{"name": "dataplane", "securityContext": {"privileged": True}}],
            "nodeSelector": {"pool": "someone-elses"},
        }}}}  # fmt: skip
        await harness._call(
            http, "PATCH", _path("deployments", "tiny-dataplane"), privileged, merge
        )
        await harness._call(
            http, "PATCH", _path("services", "tiny-controlplane"),
            {"spec": {"selector": {"extra": "key"}}}, merge,
        )  # fmt: skip
        await harness.eventually(
            lambda: selector() == wanted_selector, timeout=5, what="selector restored"
        )
        await harness.eventually(
            lambda: _pod(dataplane()) == wanted_pod, timeout=5, what="pod template restored"
        )
        assert "privileged" not in _container(dataplane())["securityContext"]
        assert "nodeSelector" not in _pod(dataplane())
        await harness.deleted(kmock, http)
    assert runner.exception is None


async def test_a_default_the_operator_does_not_know_is_not_patched_back(kmock, env, tiny_rd):
    """A newer API server may fill in a field server_defaults.py does not list: what it
    stored for the operator's own write is not drift (else every pass would patch it away
    and the server add it back), while a hand edit still is."""
    http = env
    kmock.unlisted_pod_default = ("setHostnameAsFQDN", False)

    def dataplane():
        return harness.obj(kmock, harness.DEPLOYMENTS, "tiny-dataplane")

    async with harness.operator_running() as runner:
        await harness.rolled_out_tiny(kmock, http, tiny_rd)
        since = len(list(kmock))
        await asyncio.sleep(2.0)  # ten status intervals
        assert operator_requests(kmock, since)["UPDATE", "deployments"] == 0
        assert _pod(dataplane())["setHostnameAsFQDN"] is False

        edit = {"spec": {"template": {"spec": {"hostPID": True}}}}
        await harness._call(
            http, "PATCH", _path("deployments", "tiny-dataplane"), edit,
            "application/merge-patch+json",
        )  # fmt: skip
        await harness.eventually(
            lambda: "hostPID" not in _pod(dataplane()), timeout=5, what="hand edit undone"
        )
        await harness.deleted(kmock, http)
    assert runner.exception is None


def test_only_kubernetes_spellings_compare_as_quantities():
    from rimuru.operator.server_defaults import same_scalar

    assert same_scalar("1Gi", "1024Mi") and same_scalar("500m", "0.5")
    # an env value edited by hand is drift even where the engine would read the same number
    assert not same_scalar("1000", "1e3") and not same_scalar("2GB", "2G")
