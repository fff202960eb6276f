"""Where and as what the data-plane pods run: the Pod fields a platform sets per
deployment (affinity, priority, pull secrets, service account, runtime class, extra labels
and annotations). Each is passed to the pod template as written, so changing one rolls
the pods; the operator's own labels and annotations cannot be overridden (the selector
and the engine-config hash depend on them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rimuru.operator.spec_error import SpecError

# Labels every child pod carries (naming.labels): a pod label may not replace them.
RESERVED_LABEL_PREFIX = "app.kubernetes.io/"


@dataclass(frozen=True)
class Placement:
    affinity: Mapping[str, Any] | None = None
    priority_class_name: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    service_account_name: str | None = None
    runtime_class_name: str | None = None
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)


def parse_pull_secrets(section: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(ref["name"] for ref in section.get("imagePullSecrets") or ())


def pull_secret_refs(names: tuple[str, ...]) -> list[dict[str, str]]:
    return [{"name": name} for name in names]


def parse_placement(dp: Mapping[str, Any], path: str) -> Placement:
    labels = dict(dp.get("podLabels") or {})
    reserved = sorted(k for k in labels if k.startswith(RESERVED_LABEL_PREFIX))
    if reserved:
        raise SpecError(
            f"{path}.podLabels",
            f"{', '.join(reserved)}: labels under {RESERVED_LABEL_PREFIX} are the operator's "
            "(the Deployment's selector uses them); choose another key",
        )
    return Placement(
        affinity=dp.get("affinity"),
        priority_class_name=dp.get("priorityClassName"),
        image_pull_secrets=parse_pull_secrets(dp),
        service_account_name=dp.get("serviceAccountName"),
        runtime_class_name=dp.get("runtimeClassName"),
        pod_labels=labels,
        pod_annotations=dict(dp.get("podAnnotations") or {}),
    )


def place(pod_spec: dict[str, Any], placement: Placement) -> None:
    """Set the placement's Pod fields that the spec names on `pod_spec`."""
    if placement.affinity:
        pod_spec["affinity"] = dict(placement.affinity)
    if placement.priority_class_name:
        pod_spec["priorityClassName"] = placement.priority_class_name
    if placement.image_pull_secrets:
        pod_spec["imagePullSecrets"] = pull_secret_refs(placement.image_pull_secrets)
    if placement.service_account_name:
        # Still no API token in the pod (automountServiceAccountToken: false): the account
        # is for what keys on it (image pulls, workload identity, admission policies).
        pod_spec["serviceAccountName"] = placement.service_account_name
    if placement.runtime_class_name:
        pod_spec["runtimeClassName"] = placement.runtime_class_name
