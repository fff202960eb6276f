"""Names, labels, ports and owner references shared by every child of a RimuruDeployment."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rimuru.operator.spec import (
    API_VERSION,
    DATAPLANE_GRPC_PORT,
    DATAPLANE_METRICS_PORT,
    KIND,
    Owner,
    generated_secret_name,
)

CONTROLPLANE_GRPC_PORT = 50052
MODEL_MOUNT = "/models"
POLICY_DIR = "/var/lib/rimuru"
# Token files: the control plane reads `token` (the operator's) and `dataplane-token`;
# a data-plane pod holds only its own token, as `token`.
TOKEN_DIR = "/var/run/secrets/rimuru"
TOKEN_KEY = "token"
DATAPLANE_TOKEN_FILE = "dataplane-token"
CONFIG_HASH_ANNOTATION = "rimuru.dev/engine-config-hash"
TOKEN_CHECKSUM_ANNOTATION = "rimuru.dev/token-checksum"
APPLIED_HASH_ANNOTATION = "rimuru.dev/applied-hash"
# The RimuruDeployment generation that last applied an engine ConfigMap: which are newest.
LAST_APPLIED_GENERATION_ANNOTATION = "rimuru.dev/last-applied-generation"
# Old ReplicaSets a child Deployment keeps (rollout undo's targets); the operator keeps the
# engine ConfigMaps of as many earlier configs beside the current one.
REVISION_HISTORY_LIMIT = 5
DATAPLANE = "dataplane"
CONTROLPLANE = "controlplane"

# Pods run as this non-root user; the images create it (helm/images/*.Dockerfile).
RUN_AS_USER = 10001


def child_name(owner: Owner, component: str) -> str:
    return f"{owner.name}-{component}"


def config_map_name(owner: Owner, config_hash: str) -> str:
    """The engine ConfigMap of one engine config, named by its hash. What must stay true: a
    change of engine config makes a new ConfigMap and never rewrites one a pod template
    names, so a pod of any kept revision (one restarting mid-rollout, or after `kubectl
    rollout undo`) starts with the config its template was made with."""
    return f"{owner.name}-engine-{config_hash[:10]}"


def dataplane_secret_name(owner: Owner) -> str:
    """The data planes' bearer token: always generated and owned by the operator."""
    return f"{owner.name}-dataplane-token"


def pvc_name(owner: Owner) -> str:
    return f"{owner.name}-policy"


INSTANCE_LABEL = "app.kubernetes.io/instance"  # the owning RimuruDeployment's name
# Every child carries it: the operator's watches of its children select on it.
MANAGED = {"app.kubernetes.io/managed-by": "rimuru-operator"}


def selector_labels(owner: Owner, component: str) -> dict[str, str]:
    # Deployment selectors are immutable: keep them to these two labels forever.
    return {INSTANCE_LABEL: owner.name, "app.kubernetes.io/component": component}


def labels(owner: Owner, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "rimuru",
        **selector_labels(owner, component),
        "app.kubernetes.io/part-of": "rimuru",
        **MANAGED,
    }


def selector_string(owner: Owner) -> str:
    """The data-plane pods' label selector as the scale subresource reports it."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(owner, DATAPLANE).items())


def owner_reference(owner: Owner) -> dict[str, Any]:
    # controller=True: the garbage collector deletes the child with the RimuruDeployment.
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(owner: Owner, name: str, component: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, component),
        "ownerReferences": [owner_reference(owner)],
        **extra,
    }


def _service_host(owner: Owner, component: str) -> str:
    return f"{child_name(owner, component)}.{owner.namespace}.svc"


def controlplane_endpoint(owner: Owner) -> str:
    return f"{_service_host(owner, CONTROLPLANE)}:{CONTROLPLANE_GRPC_PORT}"


def dataplane_endpoints(owner: Owner, http_port: int | None) -> dict[str, str]:
    """The data-plane Service's inference endpoints: gRPC `host:port` (as the control
    plane's), and with the HTTP API on, its base URL (OpenAI clients append /v1)."""
    host = _service_host(owner, DATAPLANE)
    endpoints = {"grpc": f"{host}:{DATAPLANE_GRPC_PORT}"}
    if http_port is not None:
        endpoints["http"] = f"http://{host}:{http_port}"
    return endpoints


def prometheus_annotations() -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(DATAPLANE_METRICS_PORT),
        "prometheus.io/path": "/metrics",
    }


def child_refs(owner: Owner) -> list[tuple[str, str]]:
    """(kind, name) of every child the operator may have created, data plane first, but
    the engine ConfigMaps: their names follow their content (listed by their labels)."""
    return [
        ("Deployment", child_name(owner, DATAPLANE)),
        ("Service", child_name(owner, DATAPLANE)),
        *optional_child_refs(owner),
        ("Deployment", child_name(owner, CONTROLPLANE)),
        ("Service", child_name(owner, CONTROLPLANE)),
        ("PersistentVolumeClaim", pvc_name(owner)),
        ("Secret", generated_secret_name(owner)),
        ("Secret", dataplane_secret_name(owner)),
    ]


def optional_child_refs(owner: Owner) -> list[tuple[str, str]]:
    """(kind, name) of the children only some specs want (build_children decides)."""
    return [
        ("PodDisruptionBudget", child_name(owner, DATAPLANE)),
        ("HorizontalPodAutoscaler", child_name(owner, DATAPLANE)),
    ]


def is_owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    """Whether `obj` carries an owner reference to the RimuruDeployment of `owner_uid`:
    the one mark of a child (labels can be copied, a uid is per object)."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner_uid for ref in refs)
