"""The RimuruDeployment's status as a pure function of what the operator observed.

    Observation (children + control plane + last error)  ->  status patch

Conditions follow the Kubernetes convention: a transition time changes only when the
condition's status changes, so re-computing an unchanged status writes the same object.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rimuru.operator.pod_security import Finding
from rimuru.operator.policy_sync import PolicyState


class Blocker(enum.Enum):
    """Why a reconcile could not finish; `permanent` ones wait for a spec change."""

    INVALID_SPEC = ("InvalidSpec", True)
    SECRET_MISSING = ("AuthSecretNotFound", False)
    # The Secret exists but its token is unusable (not UTF-8, empty): someone must edit it.
    SECRET_INVALID = ("AuthSecretInvalid", False)
    RANKING_MISSING = ("RankingNotFound", False)
    RANKING_INVALID = ("RankingInvalid", False)
    CONTROL_PLANE_UNAVAILABLE = ("ControlPlaneUnavailable", False)
    CONTROL_PLANE_UNAUTHENTICATED = ("ControlPlaneUnauthenticated", False)
    POLICY_REJECTED = ("PolicyRejected", True)
    # The API server refused a child as invalid (HTTP 422): the same manifest is refused
    # again, so nothing is retried until the spec changes.
    CHILD_REJECTED = ("ChildRejected", True)
    # A child's name is taken by an object another controller (or a person) owns: it is
    # left alone, and the pass retries until that object is gone or renamed.
    CHILD_NOT_OURS = ("ChildOwnedElsewhere", False)
    # The spec uses what this cluster's Kubernetes version lacks (cluster.py).
    UNSUPPORTED_BY_CLUSTER = ("UnsupportedByCluster", True)
    API_ERROR = ("KubernetesAPIError", False)

    def __init__(self, reason: str, permanent: bool) -> None:
        self.reason = reason
        self.permanent = permanent


class ChildSpec(enum.Enum):
    """Where a child Deployment stands with its latest spec (kubectl rollout status's first
    check): observed (status.observedGeneration >= metadata.generation), so its replica
    counts describe it; not yet, so they describe the previous template; or no Deployment.
    The value is what the Progressing condition says of it."""

    OBSERVED = "observed"
    STALE = "latest spec not observed yet"
    MISSING = "not created yet"


@dataclass(frozen=True)
class Problem:
    blocker: Blocker
    message: str


@dataclass(frozen=True)
class Observation:
    generation: int
    desired_replicas: int  # spec.dataPlane.replicas
    current_replicas: int  # data-plane pods that exist (Deployment status)
    ready_replicas: int  # data-plane pods ready (Deployment status)
    updated_replicas: int  # data-plane pods on the current template
    controlplane_ready: bool
    dataplane_spec: ChildSpec  # until OBSERVED, the counts above are the old template's
    controlplane_spec: ChildSpec
    policy: PolicyState | None  # None = control plane not asked / unreachable
    problem: Problem | None = None
    # where the data-plane pods break the restricted Pod Security profile (pod_security.py)
    pod_security: tuple[Finding, ...] = ()
    # why a data-plane pod cannot serve (pod_failures.py); None = none is failing
    dataplane_failure: str | None = None
    # why the control-plane pod cannot serve, e.g. CrashLoopBackOff (pod_failures.py)
    controlplane_failure: str | None = None
    # why a data-plane pod waits unscheduled, e.g. no free GPU (pod_failures.py)
    dataplane_unschedulable: str | None = None


def _condition(type_: str, status: bool | None, reason: str, message: str) -> dict[str, Any]:
    value = "Unknown" if status is None else ("True" if status else "False")
    return {"type": type_, "status": value, "reason": reason, "message": message}


def _available(obs: Observation) -> dict[str, Any]:
    if obs.desired_replicas == 0:
        return _condition("Available", False, "ScaledToZero", "spec.dataPlane.replicas is 0")
    if obs.ready_replicas >= 1 and obs.controlplane_ready:
        return _condition(
            "Available",
            True,
            "ReplicasReady",
            f"{obs.ready_replicas}/{obs.desired_replicas} data planes ready",
        )
    if not obs.controlplane_ready:
        return _condition("Available", False, "ControlPlaneNotReady", "control plane not ready")
    return _condition("Available", False, "NoReplicasReady", "no data plane is ready yet")


# The control plane holds a policy other than spec.policy: whatever its subscribers
# applied, it is not the spec's, so neither PolicySynced nor a finished rollout is claimed.
SPEC_NOT_PUSHED = "SpecNotPushed"


def _not_pushed_message(p: PolicyState) -> str:
    return f"spec.policy not pushed yet; the control plane holds v{p.desired_version} with other tunables"


def _policy_synced(obs: Observation) -> dict[str, Any]:
    p = obs.policy
    if p is None:
        return _condition(
            "PolicySynced", None, "ControlPlaneUnavailable", "control plane not reached"
        )
    if not p.spec_pushed:
        return _condition("PolicySynced", False, SPEC_NOT_PUSHED, _not_pushed_message(p))
    if p.last_error:
        return _condition(
            "PolicySynced",
            False,
            "Rejected",
            f"a data plane rejected v{p.desired_version}: {p.last_error}",
        )
    if obs.ready_replicas == 0 and p.num_subscribers == 0:
        # Nobody to apply it yet; the control plane holds the version for when they come.
        return _condition(
            "PolicySynced",
            False,
            "NoSubscribers",
            f"v{p.desired_version} stored; no data plane connected",
        )
    if p.num_synced == p.num_subscribers and p.num_subscribers >= obs.ready_replicas:
        return _condition(
            "PolicySynced",
            True,
            "Applied",
            f"v{p.desired_version} applied by {p.num_synced} data plane(s)",
        )
    return _condition(
        "PolicySynced",
        False,
        "Pending",
        f"v{p.desired_version} applied by {p.num_synced}/{max(p.num_subscribers, obs.ready_replicas)}",
    )


def _progressing(obs: Observation) -> dict[str, Any]:
    if obs.problem is not None:
        # A permanent problem stops every step until the spec changes: nothing progresses.
        progressing = not obs.problem.blocker.permanent
        return _condition(
            "Progressing", progressing, obs.problem.blocker.reason, obs.problem.message
        )
    children = (("data-plane", obs.dataplane_spec), ("control-plane", obs.controlplane_spec))
    pending = [
        f"{' and '.join(name for name, spec in children if spec is state)} Deployment: "
        f"{state.value}"
        for state in (ChildSpec.MISSING, ChildSpec.STALE)
        if any(spec is state for _, spec in children)
    ]
    if pending:
        # The replica counts still describe the previous template (or no Deployment at
        # all): not complete, whatever they say (kubectl rollout status waits on the same
        # check).
        return _condition("Progressing", True, "RollingOut", "; ".join(pending))
    if obs.policy is not None and not obs.policy.spec_pushed:
        return _condition("Progressing", True, SPEC_NOT_PUSHED, _not_pushed_message(obs.policy))
    # kubectl rollout status's other checks: every pod on the new template, none of the
    # old ones left (status.replicas counts both while a rolling update surges).
    rolled = obs.current_replicas <= obs.updated_replicas >= obs.desired_replicas
    if rolled and obs.ready_replicas >= obs.desired_replicas and obs.controlplane_ready:
        return _condition("Progressing", False, "RolloutComplete", "all children are up to date")
    counts = f"{obs.updated_replicas} updated, {obs.ready_replicas} ready of {obs.desired_replicas}"
    if obs.dataplane_unschedulable is not None:
        # A surge pod without a free GPU waits here for good: say so, not only the counts.
        counts += f"; {obs.dataplane_unschedulable}"
    return _condition("Progressing", True, "RollingOut", counts)


def _degraded(obs: Observation, synced: Mapping[str, Any]) -> dict[str, Any]:
    if obs.problem is not None and obs.problem.blocker in (
        Blocker.INVALID_SPEC,
        Blocker.SECRET_INVALID,
        Blocker.RANKING_INVALID,
        Blocker.POLICY_REJECTED,
        Blocker.CHILD_REJECTED,
        Blocker.CHILD_NOT_OURS,
        Blocker.UNSUPPORTED_BY_CLUSTER,
    ):
        return _condition("Degraded", True, obs.problem.blocker.reason, obs.problem.message)
    if synced["reason"] == "Rejected":
        return _condition("Degraded", True, "PolicyRejected", synced["message"])
    if obs.controlplane_failure is not None:
        # Before the data planes': without the control plane no policy reaches any of them.
        return _condition("Degraded", True, "ControlPlaneFailing", obs.controlplane_failure)
    if obs.dataplane_failure is not None:
        return _condition("Degraded", True, "DataPlaneFailing", obs.dataplane_failure)
    return _condition("Degraded", False, "AsExpected", "")


def _ready(conditions: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The one condition to wait on (kubectl wait --for=condition=Ready): serving the
    current spec, rolled out, nothing wrong. False names the first condition in the way."""
    for type_, wanted in (("Degraded", "False"), ("Available", "True"), ("Progressing", "False")):
        c = conditions[type_]
        if c["status"] != wanted:
            return _condition(
                "Ready", False, c["reason"], c["message"] or f"{type_} is {c['status']}"
            )
    return _condition("Ready", True, "Ready", conditions["Available"]["message"])


def _restricted_pod_security(obs: Observation) -> dict[str, Any]:
    # A warning, not Degraded: where the profile is not enforced the pods run as asked.
    if obs.pod_security:
        reasons = ",".join(f.reason for f in obs.pod_security)
        message = "; ".join(f.message for f in obs.pod_security)
        return _condition("RestrictedPodSecurity", False, reasons, message)
    return _condition(
        "RestrictedPodSecurity",
        True,
        "MeetsRestricted",
        "the data-plane and control-plane pods meet the restricted Pod Security profile",
    )


def _phase(conditions: Mapping[str, Mapping[str, Any]], obs: Observation) -> str:
    if obs.problem is not None and obs.problem.blocker.permanent:
        return "Failed"
    if conditions["Degraded"]["status"] == "True":
        return "Degraded"
    if (
        conditions["Available"]["status"] == "True"
        and conditions["Progressing"]["status"] == "False"
    ):
        return "Available"
    if obs.desired_replicas == 0 and conditions["Progressing"]["status"] == "False":
        # Available is False by design at zero replicas: without this steady phase a
        # scaled-down resource would read "Progressing" for ever.
        return "ScaledToZero"
    if obs.ready_replicas == 0 and not obs.controlplane_ready and obs.policy is None:
        return "Pending"
    return "Progressing"


def _keep_transition_times(
    new: dict[str, Any], previous: Sequence[Mapping[str, Any]], generation: int, now: str
) -> dict[str, Any]:
    old = next((c for c in previous if c.get("type") == new["type"]), None)
    same = old is not None and old.get("status") == new["status"]
    new["lastTransitionTime"] = old["lastTransitionTime"] if same else now
    new["observedGeneration"] = generation
    return new


def compute_status(
    obs: Observation,
    previous_conditions: Sequence[Mapping[str, Any]],
    *,
    now: str,
    selector: str,
    controlplane_endpoint: str,
    endpoints: Mapping[str, str],
) -> dict[str, Any]:
    """The full status object; `now` is an RFC 3339 timestamp (injected for tests).
    `endpoints` are the data plane's ({"grpc": host:port, "http": base URL})."""
    synced = _policy_synced(obs)
    by_type = {
        c["type"]: c
        for c in (
            _available(obs),
            _progressing(obs),
            synced,
            _degraded(obs, synced),
            _restricted_pod_security(obs),
        )
    }
    by_type = {"Ready": _ready(by_type), **by_type}  # listed first: the one to wait on
    conditions = [
        _keep_transition_times(c, previous_conditions, obs.generation, now)
        for c in by_type.values()
    ]
    status: dict[str, Any] = {
        "phase": _phase(by_type, obs),
        "observedGeneration": obs.generation,
        "replicas": obs.current_replicas,
        "readyReplicas": obs.ready_replicas,
        "selector": selector,
        "controlPlaneEndpoint": controlplane_endpoint,
        "endpoints": dict(endpoints),
        "conditions": conditions,
    }
    if obs.policy is not None:
        status["policy"] = {
            "desiredVersion": obs.policy.desired_version,
            "appliedVersion": obs.policy.applied_version,
            "subscribers": obs.policy.num_subscribers,
            "lastError": obs.policy.last_error,
            "rankingDigest": obs.policy.ranking_digest,
        }
    return status


def invalid_spec_status(generation: int, message: str, *, now: str) -> dict[str, Any]:
    """The status of a spec that can never work: nothing else is observed for it."""
    degraded = _condition("Degraded", True, Blocker.INVALID_SPEC.reason, message)
    degraded.update(lastTransitionTime=now, observedGeneration=generation)
    return {"phase": "Failed", "observedGeneration": generation, "conditions": [degraded]}
