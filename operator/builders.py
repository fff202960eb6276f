"""Pure functions from a RimuruDeployment to the manifests of its children.

No I/O and no kopf: each `build_*` takes the typed spec (and the operator's settings)
and returns one plain Kubernetes object. The tests compare their output field by field.

Invariant that keeps live tuning restart-free: nothing in the data-plane pod template
depends on the live fields of spec.policy; they reach the pods only through the control
plane. (`mode` is the exception the engine imposes: it cannot switch it while running,
so it is engine config and a change rolls the pods.)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from rimuru.operator.autoscaling import Autoscaling
from rimuru.operator.availability import rolling_update, wants_disruption_budget
from rimuru.operator.config import OperatorConfig
from rimuru.operator.engine_config import engine_config, engine_config_hash
from rimuru.operator.naming import (
    CONTROLPLANE,
    CONTROLPLANE_GRPC_PORT,
    DATAPLANE,
    DATAPLANE_GRPC_PORT,
    DATAPLANE_METRICS_PORT,
    LAST_APPLIED_GENERATION_ANNOTATION,
    REVISION_HISTORY_LIMIT,
    TOKEN_CHECKSUM_ANNOTATION,
    TOKEN_KEY,
    child_metadata,
    child_name,
    config_map_name,
    dataplane_secret_name,
    prometheus_annotations,
    pvc_name,
    selector_labels,
)
from rimuru.operator.pods import controlplane_pod_template, dataplane_pod_template
from rimuru.operator.spec import API_VERSION, KIND, DeploymentSpec, Owner


def build_engine_config_map(spec: DeploymentSpec) -> dict[str, Any]:
    data = engine_config(spec)
    name = config_map_name(spec.owner, engine_config_hash(data))
    # The generation tells the newest apart when old ones are pruned (reconcile.py).
    generation = {LAST_APPLIED_GENERATION_ANNOTATION: str(spec.owner.generation)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(spec.owner, name, DATAPLANE, annotations=generation),
        "data": data,
    }


def build_token_secret(spec: DeploymentSpec, token: str) -> dict[str, Any]:
    """The generated bearer token (only when spec.authSecretRef is absent)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_metadata(spec.owner, spec.auth.secret_name, CONTROLPLANE),
        "type": "Opaque",
        "data": {spec.auth.key: base64.b64encode(token.encode()).decode()},
    }


def build_dataplane_token_secret(spec: DeploymentSpec, token: str) -> dict[str, Any]:
    """The data planes' token (WatchPolicy, ReportRouting): never the operator's, so a
    data-plane pod cannot write policy."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_metadata(spec.owner, dataplane_secret_name(spec.owner), DATAPLANE),
        "type": "Opaque",
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def build_policy_pvc(spec: DeploymentSpec) -> dict[str, Any]:
    cp = spec.control_plane
    pvc_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": cp.storage_size}},
    }
    if cp.storage_class_name is not None:
        pvc_spec["storageClassName"] = cp.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": child_metadata(spec.owner, pvc_name(spec.owner), CONTROLPLANE),
        "spec": pvc_spec,
    }


def _service(owner: Owner, component: str, ports: list[dict[str, Any]], **meta: Any) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(owner, child_name(owner, component), component, **meta),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner, component),
            "ports": ports,
        },
    }


def _port(name: str, port: int, app_protocol: str) -> dict[str, Any]:
    return {
        "name": name,
        "port": port,
        "targetPort": name,
        "protocol": "TCP",
        "appProtocol": app_protocol,
    }


def build_controlplane_service(spec: DeploymentSpec) -> dict[str, Any]:
    ports = [_port("grpc", CONTROLPLANE_GRPC_PORT, "grpc")]
    return _service(spec.owner, CONTROLPLANE, ports)


def build_dataplane_service(spec: DeploymentSpec) -> dict[str, Any]:
    ports = [
        _port("grpc", DATAPLANE_GRPC_PORT, "grpc"),
        _port("metrics", DATAPLANE_METRICS_PORT, "http"),
    ]
    if spec.data_plane.http_port is not None:
        ports.append(_port("http", spec.data_plane.http_port, "http"))
    return _service(spec.owner, DATAPLANE, ports, annotations=prometheus_annotations())


def _deployment(
    owner: Owner, component: str, replicas: int, strategy: dict, template: dict
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(owner, child_name(owner, component), component),
        "spec": {
            "replicas": replicas,
            # explicit: the engine ConfigMaps kept follow it (naming.py)
            "revisionHistoryLimit": REVISION_HISTORY_LIMIT,
            "strategy": strategy,
            "selector": {"matchLabels": selector_labels(owner, component)},
            "template": template,
        },
    }


def build_controlplane_deployment(spec: DeploymentSpec, config: OperatorConfig) -> dict:
    # One writer of the policy store; Recreate so the RWO volume is never wanted by two
    # pods at once.
    template = controlplane_pod_template(spec, config)
    return _deployment(spec.owner, CONTROLPLANE, 1, {"type": "Recreate"}, template)


def build_dataplane_deployment(spec: DeploymentSpec, config: OperatorConfig) -> dict:
    dp = spec.data_plane
    strategy = rolling_update(dp.replicas, dp.availability)
    template = dataplane_pod_template(spec, config)
    return _deployment(spec.owner, DATAPLANE, dp.replicas, strategy, template)


def build_dataplane_disruption_budget(spec: DeploymentSpec) -> dict[str, Any]:
    """Node drains and other voluntary evictions take data planes down one (or the
    spec's maxUnavailable) at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(spec.owner, child_name(spec.owner, DATAPLANE), DATAPLANE),
        "spec": {
            "maxUnavailable": spec.data_plane.availability.disruption_max_unavailable,
            "selector": {"matchLabels": selector_labels(spec.owner, DATAPLANE)},
            # A pod that is not ready serves nothing: evicting it costs nothing.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def build_dataplane_autoscaler(spec: DeploymentSpec, scaling: Autoscaling) -> dict[str, Any]:
    """An HPA on the RimuruDeployment's scale subresource (not the data-plane Deployment,
    whose replicas the operator sets), driven by the pods' waiting requests."""
    owner = spec.owner
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": child_metadata(owner, child_name(owner, DATAPLANE), DATAPLANE),
        "spec": {
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": owner.name},
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": scaling.metric_name},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": str(scaling.target_waiting_requests),
                        },
                    },
                }
            ],
        },
    }


def build_children(spec: DeploymentSpec, config: OperatorConfig) -> list[dict[str, Any]]:
    """Every child except the token Secrets, in the order they should be applied."""
    children = [build_engine_config_map(spec)]
    if spec.control_plane.storage_enabled:
        children.append(build_policy_pvc(spec))
    children += [
        build_controlplane_deployment(spec, config),
        build_controlplane_service(spec),
        build_dataplane_deployment(spec, config),
        build_dataplane_service(spec),
    ]
    if wants_disruption_budget(spec.data_plane.replicas, spec.data_plane.availability):
        children.append(build_dataplane_disruption_budget(spec))
    if spec.autoscaling is not None:
        children.append(build_dataplane_autoscaler(spec, spec.autoscaling))
    return children


@dataclass(frozen=True)
class Tokens:
    """The bearer tokens as their Secrets hold them now."""

    operator: str  # spec.authSecretRef's, or the generated one
    dataplane: str


def _checksum(key: str, *tokens: str) -> str:
    """Keyed by the data planes' token, which the operator generates at random and keeps in
    its Secret: the annotation is readable by whoever may read pods, and a plain hash of a
    token a user chose could be guessed offline."""
    message = "\0".join(("rimuru token checksum", *tokens)).encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()[:16]


def with_token_checksums(children: list[dict[str, Any]], tokens: Tokens) -> list[dict[str, Any]]:
    """`children` with a checksum of the tokens each Deployment's pods read stamped on its
    pod template. A pod reads its token files once, at start: without this, a rotated or
    re-generated token Secret leaves the control plane on the old token and every policy
    push is refused; with it, the new value changes the template and rolls the pods (as
    Helm charts roll on a Secret's checksum). The control plane reads both tokens, a data
    plane only its own."""
    read_by = {
        CONTROLPLANE: _checksum(tokens.dataplane, tokens.operator),
        DATAPLANE: _checksum(tokens.dataplane),
    }
    stamped = []
    for child in children:
        if child["kind"] == "Deployment":
            template = child["spec"]["template"]
            component = template["metadata"]["labels"]["app.kubernetes.io/component"]
            annotations = {**template["metadata"].get("annotations", {})}
            annotations[TOKEN_CHECKSUM_ANNOTATION] = read_by[component]
            metadata = {**template["metadata"], "annotations": annotations}
            child = {
                **child,
                "spec": {**child["spec"], "template": {**template, "metadata": metadata}},
            }
        stamped.append(child)
    return stamped
