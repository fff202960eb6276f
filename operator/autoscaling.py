"""spec.autoscaling: the data plane scaled on its queue, by a HorizontalPodAutoscaler.

The HPA scales the RimuruDeployment through its scale subresource (the operator then
rolls the change out as any other replicas change), on the data-plane pods' Prometheus
gauge of requests waiting to be scheduled. A cluster serves such a metric through its own
adapter (prometheus-adapter, KEDA, ...) under a name it chooses: `metricName` says which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rimuru.operator.spec_error import SpecError

WAITING_REQUESTS_METRIC = "rimuru_num_requests_waiting"  # dataplane/serve/plane/telemetry.py


@dataclass(frozen=True)
class Autoscaling:
    min_replicas: int
    max_replicas: int
    target_waiting_requests: int  # average per data-plane pod
    metric_name: str = WAITING_REQUESTS_METRIC


def parse_autoscaling(section: Mapping[str, Any] | None, replicas: int) -> Autoscaling | None:
    """spec.autoscaling, given spec.dataPlane.replicas (which the HPA then sets)."""
    if section is None:
        return None
    path = "spec.autoscaling"
    if replicas == 0:
        # The HPA sets replicas from the pods' metric: with no pod there is none to read.
        raise SpecError(
            "spec.dataPlane.replicas",
            "must be at least 1 with spec.autoscaling (a HorizontalPodAutoscaler does not "
            "scale up from 0): set it to 1 or more, or remove spec.autoscaling to scale to zero",
        )
    low, high = section.get("minReplicas", 1), section.get("maxReplicas")
    if high is None:
        raise SpecError(f"{path}.maxReplicas", "is required")
    if not 1 <= low <= high:
        raise SpecError(path, f"needs 1 <= minReplicas <= maxReplicas; got {low} and {high}")
    return Autoscaling(
        min_replicas=low,
        max_replicas=high,
        target_waiting_requests=section.get("targetWaitingRequests", 4),
        metric_name=section.get("metricName", WAITING_REQUESTS_METRIC),
    )
