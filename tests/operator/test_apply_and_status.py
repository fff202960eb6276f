"""Idempotent apply's patches, and the status as a pure function of observations."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from rimuru.operator.apply import drifted, manifest_hash, patch_operations, with_applied_hash
from rimuru.operator.builders import build_children, build_dataplane_service
from rimuru.operator.config import OperatorConfig
from rimuru.operator.naming import dataplane_endpoints
from rimuru.operator.policy_sync import PolicyState
from rimuru.operator.spec import parse_spec
from rimuru.operator.status import (
    Blocker,
    ChildSpec,
    Observation,
    Problem,
    compute_status,
    invalid_spec_status,
)

NOW = "2026-01-02T03:04:05Z"
ENDPOINTS = {"grpc": "dp:50051", "http": "http://dp:8000"}


def test_service_patch_keeps_what_others_own(tiny_rd):
    desired = with_applied_hash(
        build_dataplane_service(parse_spec(tiny_rd["metadata"], tiny_rd["spec"]))
    )
    current = {
        "metadata": {
            "labels": {"team": "ml"},
            "annotations": {"rimuru.dev/applied-hash": "old", "note": "kept"},
        },
        "spec": {"clusterIP": "10.0.0.7", "type": "ClusterIP", "ports": [], "selector": {}},
    }
    ops = patch_operations(current, desired)
    paths = [op["path"] for op in ops]
    # Labels and annotations one by one (others' keys stay), the owned spec fields whole.
    assert "/metadata/labels/app.kubernetes.io~1instance" in paths
    assert "/metadata/annotations/rimuru.dev~1applied-hash" in paths
    assert "/metadata/annotations/note" not in paths
    assert paths[-3:] == ["/spec/type", "/spec/selector", "/spec/ports"]
    assert not any(p.startswith("/spec/clusterIP") for p in paths)
    assert all(op["op"] == "add" for op in ops)


def test_applied_hash_is_stable_and_content_sensitive(tiny_rd):
    service = build_dataplane_service(parse_spec(tiny_rd["metadata"], tiny_rd["spec"]))
    assert manifest_hash(service) == manifest_hash(dict(reversed(list(service.items()))))
    changed = {**service, "spec": {**service["spec"], "type": "NodePort"}}
    assert manifest_hash(changed) != manifest_hash(service)


def _obs(**kw) -> Observation:
    base = dict(
        generation=4,
        desired_replicas=2,
        current_replicas=2,
        ready_replicas=2,
        updated_replicas=2,
        controlplane_ready=True,
        dataplane_spec=ChildSpec.OBSERVED,
        controlplane_spec=ChildSpec.OBSERVED,
        policy=PolicyState(
            desired_version=7,
            applied_version=7,
            num_subscribers=2,
            num_synced=2,
            last_error="",
            ranking_digest="",
            spec_pushed=True,
        ),
    )
    base.update(kw)
    return Observation(**base)


def _status(obs, previous=()):
    return compute_status(
        obs,
        list(previous),
        now=NOW,
        selector="sel",
        controlplane_endpoint="cp:50052",
        endpoints=ENDPOINTS,
    )


def _conditions(status):
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_a_policy_not_pushed_yet_is_neither_synced_nor_available():
    """After a control-plane outage every data plane still runs the old policy, fully
    acknowledged; the spec's new tunables are not pushed yet (test_policy_sync)."""
    old = PolicyState(1, 1, 2, 2, "", "", spec_pushed=False)
    status = _status(_obs(policy=old))
    conditions = _conditions(status)
    assert conditions["PolicySynced"] == ("False", "SpecNotPushed")
    assert conditions["Progressing"] == ("True", "SpecNotPushed")
    assert (status["phase"], status["observedGeneration"]) == ("Progressing", 4)
    assert _status(_obs(policy=replace(old, spec_pushed=True)))["phase"] == "Available"


def test_all_good_is_available_and_synced():
    status = _status(_obs())
    assert status["phase"] == "Available"
    assert _conditions(status) == {
        "Ready": ("True", "Ready"),
        "Available": ("True", "ReplicasReady"),
        "Progressing": ("False", "RolloutComplete"),
        "PolicySynced": ("True", "Applied"),
        "Degraded": ("False", "AsExpected"),
        "RestrictedPodSecurity": ("True", "MeetsRestricted"),
    }
    assert status["policy"] == {
        "desiredVersion": 7,
        "appliedVersion": 7,
        "subscribers": 2,
        "lastError": "",
        "rankingDigest": "",
    }
    assert (status["observedGeneration"], status["replicas"], status["readyReplicas"]) == (4, 2, 2)
    assert all(c["observedGeneration"] == 4 for c in status["conditions"])


def test_one_replica_behind_is_pending_not_synced():
    policy = PolicyState(7, 6, 2, 1, "", "", True)
    status = _status(_obs(policy=policy))
    assert _conditions(status)["PolicySynced"] == ("False", "Pending")
    assert status["policy"]["appliedVersion"] == 6


def test_a_nack_degrades():
    policy = PolicyState(7, 6, 2, 1, "mode change needs a restart", "", True)
    status = _status(_obs(policy=policy))
    assert status["phase"] == "Degraded"
    assert _conditions(status)["PolicySynced"] == ("False", "Rejected")
    assert _conditions(status)["Degraded"] == ("True", "PolicyRejected")


def test_rollout_in_progress():
    status = _status(_obs(updated_replicas=1, ready_replicas=1))
    assert status["phase"] == "Progressing"
    assert _conditions(status)["Progressing"] == ("True", "RollingOut")
    assert _conditions(status)["Available"] == ("True", "ReplicasReady")


def test_old_pods_left_over_are_still_a_rollout():
    # A surging rolling update: both new pods ready, one old pod not yet gone.
    status = _status(_obs(current_replicas=3))
    assert status["phase"] == "Progressing"
    assert _conditions(status)["Progressing"] == ("True", "RollingOut")


def test_waiting_on_the_control_plane():
    problem = Problem(Blocker.CONTROL_PLANE_UNAVAILABLE, "control plane at cp:50052: deadline")
    status = _status(_obs(policy=None, problem=problem, ready_replicas=0, controlplane_ready=False))
    assert status["phase"] == "Pending"
    assert _conditions(status)["Progressing"] == ("True", "ControlPlaneUnavailable")
    assert _conditions(status)["PolicySynced"] == ("Unknown", "ControlPlaneUnavailable")
    assert "policy" not in status  # the last known versions stay (merge patch)


def test_permanent_problem_fails():
    problem = Problem(Blocker.POLICY_REJECTED, "control plane rejected the policy")
    status = _status(_obs(problem=problem))
    assert status["phase"] == "Failed"
    assert _conditions(status)["Degraded"] == ("True", "PolicyRejected")
    assert _conditions(status)["Progressing"] == ("False", "PolicyRejected")


@pytest.mark.parametrize(
    ("stale", "message"),
    [
        ({"dataplane_spec": ChildSpec.STALE}, "data-plane Deployment"),
        ({"controlplane_spec": ChildSpec.STALE}, "control-plane Deployment"),
        (
            {"dataplane_spec": ChildSpec.STALE, "controlplane_spec": ChildSpec.STALE},
            "data-plane and control-plane Deployment",
        ),
    ],
)
def test_counts_of_an_unobserved_generation_are_not_a_complete_rollout(stale, message):
    # Just after a new template is applied, the counts still say "all updated and ready"
    # for the previous generation.
    status = _status(_obs(**stale))
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut")
    assert progressing["message"] == f"{message}: latest spec not observed yet"
    assert status["phase"] == "Progressing"
    assert _conditions(status)["Available"] == ("True", "ReplicasReady")  # old pods serve


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (
            (ChildSpec.MISSING, ChildSpec.MISSING),
            "data-plane and control-plane Deployment: not created yet",
        ),
        (
            (ChildSpec.STALE, ChildSpec.MISSING),
            "control-plane Deployment: not created yet; "
            "data-plane Deployment: latest spec not observed yet",
        ),
    ],
)
def test_a_missing_child_is_said_to_be_missing_not_unobserved(specs, message):
    obs = _obs(dataplane_spec=specs[0], controlplane_spec=specs[1])
    progressing = next(c for c in _status(obs)["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut")
    assert progressing["message"] == message


def _scaled_to_zero(**kw) -> Observation:
    policy = PolicyState(7, 0, 0, 0, "", "", True)
    return _obs(
        desired_replicas=0,
        current_replicas=0,
        ready_replicas=0,
        updated_replicas=0,
        policy=policy,
        **kw,
    )


def test_scaled_to_zero_settles():
    status = _status(_scaled_to_zero())
    assert status["phase"] == "ScaledToZero"
    assert _conditions(status) == {
        "Ready": ("False", "ScaledToZero"),
        "Available": ("False", "ScaledToZero"),
        "Progressing": ("False", "RolloutComplete"),
        "PolicySynced": ("False", "NoSubscribers"),
        "Degraded": ("False", "AsExpected"),
        "RestrictedPodSecurity": ("True", "MeetsRestricted"),
    }


@pytest.mark.parametrize(
    "kw",
    [
        {"dataplane_spec": ChildSpec.STALE},  # the scale-down not yet seen
        {"controlplane_spec": ChildSpec.STALE},
        {"controlplane_ready": False},
        {"problem": Problem(Blocker.RANKING_MISSING, "ConfigMap r not found")},
    ],
    ids=["dataplane-generation", "controlplane-generation", "controlplane-down", "blocked"],
)
def test_scaled_to_zero_is_not_steady_while_something_is_in_progress(kw):
    status = _status(_scaled_to_zero(**kw))
    assert status["phase"] == "Progressing"
    assert _conditions(status)["Progressing"][0] == "True"


def test_status_lists_the_data_plane_endpoints_beside_the_control_planes(tiny_rd):
    status = _status(_obs())
    assert (status["controlPlaneEndpoint"], status["endpoints"]) == ("cp:50052", ENDPOINTS)

    spec = parse_spec(tiny_rd["metadata"], tiny_rd["spec"])
    assert dataplane_endpoints(spec.owner, spec.data_plane.http_port) == {
        "grpc": "tiny-dataplane.default.svc:50051",
        "http": "http://tiny-dataplane.default.svc:8000",
    }
    # HTTP API off: no http endpoint is claimed.
    assert dataplane_endpoints(spec.owner, None) == {"grpc": "tiny-dataplane.default.svc:50051"}


def test_transition_time_moves_only_on_a_change():
    first = _status(_obs())
    later = compute_status(
        _obs(ready_replicas=1, updated_replicas=2),
        first["conditions"],
        now="2026-01-02T09:00:00Z",
        selector="sel",
        controlplane_endpoint="cp:50052",
        endpoints=ENDPOINTS,
    )
    times = {c["type"]: c["lastTransitionTime"] for c in later["conditions"]}
    assert times["Available"] == NOW  # still True
    assert times["Progressing"] == "2026-01-02T09:00:00Z"  # False -> True


def test_every_status_the_operator_writes_fits_the_crd(api, tiny_rd):
    # The API server prunes fields the schema lacks: a status field missing there would
    # be silently lost (and, for rankingDigest, re-upload the ranking every period).
    policy = PolicyState(7, 6, 2, 1, "mode change needs a restart", "ab12", True)
    problem = Problem(Blocker.SECRET_MISSING, "Secret x not found")
    for obs in (
        _obs(),
        _obs(policy=policy),
        _obs(policy=None, problem=problem),
        _scaled_to_zero(),  # its phase is in the CRD's enum
    ):
        rd = {**tiny_rd, "status": _status(obs)}
        _, errors = api.admit(rd)
        assert errors == []
    invalid = {**tiny_rd, "status": invalid_spec_status(3, "spec.engine: bad", now=NOW)}
    assert api.admit(invalid)[1] == []


def _live(desired: dict) -> dict:
    """What the API server hands back: the manifest plus defaults and canonical quantities."""
    live = copy.deepcopy(desired)
    spec = live["spec"]
    spec.setdefault("revisionHistoryLimit", 10)
    spec["progressDeadlineSeconds"] = 600
    container = spec["template"]["spec"]["containers"][0]
    container["terminationMessagePath"] = "/dev/termination-log"
    container["imagePullPolicy"] = "IfNotPresent"
    container.setdefault("resources", {}).setdefault("limits", {})["memory"] = "2Gi"
    return live


def test_defaults_and_canonical_quantities_are_not_drift_but_hand_edits_are(tiny_rd):
    spec = parse_spec(tiny_rd["metadata"], tiny_rd["spec"])
    config = OperatorConfig(dataplane_image="reg/dp:1", controlplane_image="reg/cp:1")
    desired = next(c for c in build_children(spec, config) if c["kind"] == "Deployment")
    container = desired["spec"]["template"]["spec"]["containers"][0]
    container.setdefault("resources", {}).setdefault("limits", {})["memory"] = "2048Mi"
    desired = with_applied_hash(desired)
    live = _live(desired)
    assert not drifted(live, desired)

    edited = copy.deepcopy(live)  # kubectl edit: another image, same applied-hash annotation
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:latest"
    assert drifted(edited, desired)
    ops = patch_operations(edited, desired)
    assert {"op": "add", "path": "/spec", "value": desired["spec"]} in ops

    unlabelled = copy.deepcopy(live)
    unlabelled["metadata"]["labels"].pop("app.kubernetes.io/instance")
    assert drifted(unlabelled, desired)
    scaled = copy.deepcopy(live)
    scaled["spec"]["replicas"] = desired["spec"]["replicas"] + 3
    assert drifted(scaled, desired)
