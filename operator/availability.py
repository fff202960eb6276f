"""How data planes stay up through rollouts, node drains and node failures.

    spec.dataPlane.rollingUpdate            -> the Deployment's rolling-update strategy
    spec.dataPlane.podDisruptionBudget      -> a PodDisruptionBudget (more than one replica)
    spec.dataPlane.topologySpreadConstraints -> the pods' spread over nodes

The defaults trade GPU capacity against serving: one replica surges (a new pod starts
beside the old one, which serves until the new one is ready, so the rollout needs one
spare GPU and waits, still serving, until there is one); several replicas are replaced one
at a time without a surge pod (one replica's capacity is missing during the rollout, but
it never waits for a GPU that is not there).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rimuru.operator.spec_error import SpecError

# An int-or-string of a rolling update or a PodDisruptionBudget: a count or a percentage.
_PERCENT = re.compile(r"^[0-9]{1,3}%$")
# Spread over nodes, softly: a second GPU on the same node is better than a pending pod.
HOSTNAME_TOPOLOGY_KEY = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Availability:
    # None = the default for the replica count (rolling_update below)
    max_surge: int | str | None = None
    max_unavailable: int | str | None = None
    disruption_budget: bool = True
    disruption_max_unavailable: int | str = 1
    # None = one soft spread over nodes; () = none at all
    topology_spread: tuple[Mapping[str, Any], ...] | None = None


def _count_or_percent(section: Mapping[str, Any], key: str, path: str) -> int | str | None:
    value = section.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and _PERCENT.match(value):
        return value
    raise SpecError(
        f"{path}.{key}", f"must be a count >= 0 or a percentage such as 25%; got {value!r}"
    )


def _is_zero(value: int | str | None) -> bool:
    return value in (0, "0%")


def parse_availability(dp: Mapping[str, Any], path: str) -> Availability:
    rolling = dp.get("rollingUpdate") or {}
    max_surge = _count_or_percent(rolling, "maxSurge", f"{path}.rollingUpdate")
    max_unavailable = _count_or_percent(rolling, "maxUnavailable", f"{path}.rollingUpdate")
    if _is_zero(max_surge) and _is_zero(max_unavailable):
        raise SpecError(
            f"{path}.rollingUpdate",
            "maxSurge and maxUnavailable cannot both be 0: nothing could roll",
        )
    budget = dp.get("podDisruptionBudget") or {}
    spread = dp.get("topologySpreadConstraints")
    return Availability(
        max_surge=max_surge,
        max_unavailable=max_unavailable,
        disruption_budget=budget.get("enabled", True),
        disruption_max_unavailable=_count_or_percent(
            {"maxUnavailable": 1, **budget}, "maxUnavailable", f"{path}.podDisruptionBudget"
        ),
        topology_spread=None if spread is None else tuple(dict(c) for c in spread),
    )


def rolling_update(replicas: int, availability: Availability) -> dict[str, Any]:
    """The data-plane Deployment's strategy. Unset, one replica surges (keeps serving,
    needs a spare GPU) and several are replaced one at a time (no spare GPU); with one of
    the two set, the other is what keeps the rollout moving without surplus."""
    surge, unavailable = availability.max_surge, availability.max_unavailable
    if surge is None and unavailable is None:
        surge, unavailable = (1, 0) if replicas <= 1 else (0, 1)
    elif surge is None:
        surge = 1 if _is_zero(unavailable) else 0
    elif unavailable is None:
        unavailable = 1 if _is_zero(surge) else 0
    return {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable},
    }


def topology_spread(
    availability: Availability, selector: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The pods' spread constraints; a constraint without a labelSelector counts this
    deployment's data-plane pods."""
    if availability.topology_spread is None:
        constraints: tuple[Mapping[str, Any], ...] = (
            {
                "maxSkew": 1,
                "topologyKey": HOSTNAME_TOPOLOGY_KEY,
                "whenUnsatisfiable": "ScheduleAnyway",
            },
        )
    else:
        constraints = availability.topology_spread
    return [
        {**c, "labelSelector": c.get("labelSelector") or {"matchLabels": dict(selector)}}
        for c in constraints
    ]


def wants_disruption_budget(replicas: int, availability: Availability) -> bool:
    # One replica: a budget could only block node drains (minAvailable 1) or protect
    # nothing (maxUnavailable 1), so there is none.
    return availability.disruption_budget and replicas > 1
