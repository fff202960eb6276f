"""What the API server fills in on the children the operator writes, and how to set it aside.

The operator owns a child's spec whole (apply.py): anything in it the operator did not
write is drift, except what the API server adds by itself when it stores the object.
Those defaults are listed here, per owned field, as a tree that mirrors the object:

    {key: default value}        the key, holding exactly this value, is a default
    {key: {...}}                a nested object; one left empty once its defaults are
                                removed was added whole by the server (securityContext: {})
    {"[]": {...}}               the tree for every item of a list
    {"()": function}            a default derived from a sibling (requests from limits)

`without_defaults(value, tree)` removes them from both the live and the desired object,
so the two compare exactly: `privileged: true`, `hostNetwork`, a service account, an
extra selector key or GPU limit added by hand is a difference, the server's
`dnsPolicy: ClusterFirst` is not. What must stay true: only a value the API server itself
would write belongs here; a field a person might set to harm the pods (host namespaces,
privileges, service accounts) never does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rimuru.sizes import size_value

ITEMS = "[]"
DERIVED = "()"
_NONE = object()  # a key with no default


def _requests_from_limits(resources: dict[str, Any]) -> dict[str, Any]:
    # A container's request left unset defaults to its limit.
    limits = resources.get("limits") or {}
    requests = {
        name: value
        for name, value in (resources.get("requests") or {}).items()
        if not (name in limits and same_scalar(value, limits[name]))
    }
    resources = {k: v for k, v in resources.items() if k != "requests"}
    if requests:
        resources["requests"] = requests
    return resources


def _deprecated_service_account(pod_spec: dict[str, Any]) -> dict[str, Any]:
    # The v1 API mirrors serviceAccountName into the deprecated serviceAccount field.
    if "serviceAccount" in pod_spec and pod_spec["serviceAccount"] == pod_spec.get(
        "serviceAccountName"
    ):
        return {k: v for k, v in pod_spec.items() if k != "serviceAccount"}
    return pod_spec


def _image_volume_pull_policy(source: dict[str, Any]) -> dict[str, Any]:
    # As for a container's image: Always for ":latest" (or no tag at all), else IfNotPresent.
    reference = str(source.get("reference", ""))
    name = reference.rsplit("/", 1)[-1]
    tag = "" if "@" in reference else (name.split(":", 1)[1] if ":" in name else "latest")
    default = "Always" if tag == "latest" else "IfNotPresent"
    if source.get("pullPolicy") == default:
        return {k: v for k, v in source.items() if k != "pullPolicy"}
    return source


_PROBE = {
    "timeoutSeconds": 1,
    "periodSeconds": 10,
    "successThreshold": 1,
    "failureThreshold": 3,
    "httpGet": {"scheme": "HTTP"},
    "grpc": {"service": ""},
}
_CONTAINER = {
    "terminationMessagePath": "/dev/termination-log",
    "terminationMessagePolicy": "File",
    "resources": {DERIVED: _requests_from_limits},
    "ports": {ITEMS: {"protocol": "TCP"}},
    "env": {ITEMS: {"valueFrom": {"fieldRef": {"apiVersion": "v1"}}}},
    "startupProbe": _PROBE,
    "readinessProbe": _PROBE,
    "livenessProbe": _PROBE,
}
_VOLUME = {
    "secret": {"defaultMode": 0o644},
    "configMap": {"defaultMode": 0o644},
    "projected": {"defaultMode": 0o644},
    "downwardAPI": {"defaultMode": 0o644},
    "image": {DERIVED: _image_volume_pull_policy},
}
_POD_SPEC = {
    DERIVED: _deprecated_service_account,
    "restartPolicy": "Always",
    "terminationGracePeriodSeconds": 30,
    "dnsPolicy": "ClusterFirst",
    "schedulerName": "default-scheduler",
    "securityContext": {},
    "containers": {ITEMS: _CONTAINER},
    "initContainers": {ITEMS: _CONTAINER},
    "volumes": {ITEMS: _VOLUME},
}
_DEPLOYMENT_SPEC = {
    "revisionHistoryLimit": 10,
    "progressDeadlineSeconds": 600,
    "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
    "template": {"metadata": {"creationTimestamp": None}, "spec": _POD_SPEC},
}
_HPA_SPEC = {
    "behavior": {
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
}
_SERVICE_PORT = {"protocol": "TCP"}

# (kind, owned JSON pointer) -> the defaults under it (apply.OWNED_PATHS lists the pointers)
DEFAULTS: dict[tuple[str, str], Mapping[str, Any]] = {
    ("Deployment", "/spec"): _DEPLOYMENT_SPEC,
    ("HorizontalPodAutoscaler", "/spec"): _HPA_SPEC,
    ("Service", "/spec/ports"): {ITEMS: _SERVICE_PORT},
}


def without_defaults(value: Any, tree: Mapping[str, Any] | None) -> Any:
    """`value` less the API server's defaults that `tree` lists (a new object)."""
    if not tree:
        return value
    if isinstance(value, list):
        items = tree.get(ITEMS)
        return [without_defaults(item, items) for item in value]
    if not isinstance(value, Mapping):
        return value
    derive: Callable[[dict[str, Any]], dict[str, Any]] | None = tree.get(DERIVED)
    value = derive(dict(value)) if derive is not None else value
    kept = {}
    for key, item in value.items():
        rule = tree.get(key, _NONE)
        if isinstance(rule, Mapping):
            item = without_defaults(item, rule)
            if item == {}:
                continue
        elif rule is not _NONE and same_value(item, rule):
            continue
        kept[key] = item
    return kept


def same_value(a: Any, b: Any) -> bool:
    """Equal objects, lists item by item, with quantities compared by value."""
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return (
            isinstance(a, Mapping)
            and isinstance(b, Mapping)
            and a.keys() == b.keys()
            and all(same_value(a[k], b[k]) for k in a)
        )
    if isinstance(a, list) or isinstance(b, list):
        return (
            isinstance(a, list)
            and isinstance(b, list)
            and len(a) == len(b)
            and all(same_value(x, y) for x, y in zip(a, b, strict=True))
        )
    return same_scalar(a, b)


def same_scalar(a: Any, b: Any) -> bool:
    """ "1Gi" and "1024Mi", "500m" and "0.5": the API server rewrites quantities in its
    canonical form, which must not count as drift."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if a == b:
        return True
    va = size_value(a, kubernetes=True)
    return va is not None and va == size_value(b, kubernetes=True)
