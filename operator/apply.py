"""Idempotent apply of one child manifest: create it, patch it, or leave it alone.

Each child carries the hash of the manifest it was last applied from. Re-applying the
same desired manifest to an object that still holds it costs one GET and writes nothing;
a changed manifest, or a live object that drifted from it (a hand edit of a field the
operator owns, a label removed), is written with a JSON patch that replaces only the
fields the operator owns (per kind), so fields other controllers own (a Service's
clusterIP, a Deployment's revision annotation, status) are never touched. A deleted
child is created again.

Drift is judged per part. Labels and annotations by containment: others may add their own.
The owned fields exactly, as a controller's own fields are: once the API server's
defaults are set aside (server_defaults.py), a live value must equal the operator's, so a
key added by hand (`privileged: true`, `hostNetwork`, a service account, a nodeSelector
or selector key, a GPU limit) is drift and the patch removes it. Maps such as a Service's
selector are atomic in Kubernetes: one extra key changes what they select.
"""

from __future__ import annotations

import copy
import enum
import hashlib
import json
from collections.abc import Mapping, MutableMapping
from typing import Any

from rimuru.operator.kube import Conflict, KubeClient
from rimuru.operator.naming import APPLIED_HASH_ANNOTATION, is_owned_by
from rimuru.operator.server_defaults import DEFAULTS, same_value, without_defaults

# kind -> JSON pointers the operator owns below the top level; None = create only
# (a generated token must never be rotated by a re-apply; a PVC's spec is immutable).
OWNED_PATHS: dict[str, tuple[str, ...] | None] = {
    "Deployment": ("/spec",),
    "PodDisruptionBudget": ("/spec",),
    "HorizontalPodAutoscaler": ("/spec",),
    "Service": ("/spec/type", "/spec/selector", "/spec/ports"),
    "ConfigMap": ("/data",),
    "Secret": None,
    "PersistentVolumeClaim": None,
}


class ForeignObject(Exception):
    """The child's name is taken by an object this RimuruDeployment does not own: another
    controller's, or one made by hand. It is never adopted, written or deleted."""

    def __init__(self, kind: str, name: str, holder: str) -> None:
        super().__init__(
            f"{kind} {name} exists and is not this RimuruDeployment's ({holder}); nothing was "
            f"changed: delete or rename it, or give the RimuruDeployment another name"
        )
        self.kind = kind
        self.name = name


def holder(obj: Mapping[str, Any]) -> str:
    """Who an object belongs to, as a refusal names it."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    controller = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if controller is None:
        return "it has no owner"
    return f"owned by {controller.get('kind')} {controller.get('name')}"


class Applied(enum.Enum):
    CREATED = "created"
    PATCHED = "patched"
    UNCHANGED = "unchanged"


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _pointer_escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _get(obj: Mapping[str, Any], pointer: str) -> Any:
    for part in pointer.strip("/").split("/"):
        obj = obj[part]
    return obj


def _merge_map_ops(path: str, current: Mapping[str, str] | None, desired: Mapping[str, str]):
    # Add keys one by one: labels and annotations set by others stay.
    if current is None:
        return [{"op": "add", "path": path, "value": dict(desired)}]
    return [
        {"op": "add", "path": f"{path}/{_pointer_escape(k)}", "value": v}
        for k, v in desired.items()
        if current.get(k) != v
    ]


def patch_operations(current: Mapping[str, Any], desired: Mapping[str, Any]) -> list[dict]:
    """JSON patch that makes `current` carry everything the operator owns in `desired`."""
    owned = OWNED_PATHS[desired["kind"]] or ()
    meta, want = current.get("metadata", {}), desired["metadata"]
    ops = _merge_map_ops("/metadata/labels", meta.get("labels"), want.get("labels", {}))
    ops += _merge_map_ops(
        "/metadata/annotations", meta.get("annotations"), want.get("annotations", {})
    )
    ops.append({"op": "add", "path": "/metadata/ownerReferences", "value": want["ownerReferences"]})
    for pointer in owned:
        # "add" replaces an existing member and creates a missing one.
        ops.append({"op": "add", "path": pointer, "value": copy.deepcopy(_get(desired, pointer))})
    return ops


def owned_fields(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The fields the operator owns in `obj`, less the API server's known defaults; None if
    one is missing."""
    fields = {}
    for pointer in OWNED_PATHS[kind] or ():
        try:
            value = _get(obj, pointer)
        except (KeyError, TypeError):
            return None
        fields[pointer] = without_defaults(value, DEFAULTS.get((kind, pointer)))
    return fields


# (kind, namespace, name) -> (applied hash, owned_fields of the object as the API server
# stored the operator's last write of it)
StoredShapes = MutableMapping[tuple[str, str, str], tuple[str, dict[str, Any]]]


def drifted(
    current: Mapping[str, Any],
    desired: Mapping[str, Any],
    stored_shape: tuple[str, dict[str, Any]] | None = None,
) -> bool:
    """Whether the live object lacks or contradicts the operator's labels, annotations or
    owner references, or differs in an owned field by more than the server's defaults.
    `stored_shape`: what the server stored for the operator's last write of this object;
    a live object still equal to it is not drift, whatever defaults it holds that
    server_defaults.py does not list (a newer API server's): without this, one such
    default would be patched away and back on every pass."""
    meta, want = current.get("metadata", {}), desired["metadata"]
    if not (want.get("labels", {}).items() <= (meta.get("labels") or {}).items()):
        return True
    if not (want.get("annotations", {}).items() <= (meta.get("annotations") or {}).items()):
        return True
    if meta.get("ownerReferences") != want["ownerReferences"]:
        return True
    kind = desired["kind"]
    live = owned_fields(current, kind)
    if live is None:
        return True
    if same_value(live, owned_fields(desired, kind)):
        return False
    applied = want["annotations"][APPLIED_HASH_ANNOTATION]
    return stored_shape is None or stored_shape != (applied, live)


def with_applied_hash(manifest: Mapping[str, Any]) -> dict[str, Any]:
    stamped = copy.deepcopy(dict(manifest))
    annotations = stamped["metadata"].setdefault("annotations", {})
    annotations[APPLIED_HASH_ANNOTATION] = manifest_hash(manifest)
    return stamped


async def apply(
    client: KubeClient, manifest: Mapping[str, Any], stored_shapes: StoredShapes | None = None
) -> Applied:
    """Create, patch or leave one child. `stored_shapes`, kept across passes, records what
    the API server stored for each write (see drifted)."""
    kind = manifest["kind"]
    if kind not in OWNED_PATHS:
        raise ValueError(f"apply() does not manage kind {kind!r}; known: {', '.join(OWNED_PATHS)}")
    desired = with_applied_hash(manifest)
    meta = desired["metadata"]
    key = (kind, meta["namespace"], meta["name"])
    shapes: StoredShapes = {} if stored_shapes is None else stored_shapes
    current = await client.get(kind, meta["namespace"], meta["name"])
    if current is None:
        try:
            _remember(shapes, key, desired, await client.create(desired))
            return Applied.CREATED
        except Conflict:
            # It exists though the read said not: the watch it came from is behind, or the
            # child lost the label the watch selects on. Ask the server and compare.
            current = await client.get_from_server(kind, meta["namespace"], meta["name"])
            if current is None:
                return Applied.UNCHANGED  # deleted meanwhile: the next pass creates it
    # An object of the child's name without this owner's reference is someone else's,
    # whatever its labels say: refuse before any write, so it is neither changed nor,
    # with our owner reference on it, deleted with the RimuruDeployment.
    if not is_owned_by(current, desired["metadata"]["ownerReferences"][0]["uid"]):
        raise ForeignObject(kind, meta["name"], holder(current))
    if OWNED_PATHS[kind] is None or not drifted(current, desired, shapes.get(key)):
        return Applied.UNCHANGED
    stored = await client.json_patch(
        kind, meta["namespace"], meta["name"], patch_operations(current, desired)
    )
    _remember(shapes, key, desired, stored)
    return Applied.PATCHED


def _remember(shapes: StoredShapes, key, desired: Mapping[str, Any], stored: Mapping) -> None:
    fields = owned_fields(stored, desired["kind"]) if OWNED_PATHS[desired["kind"]] else None
    if fields is not None:
        shapes[key] = (desired["metadata"]["annotations"][APPLIED_HASH_ANNOTATION], fields)
