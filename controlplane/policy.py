"""Policy = a numbered version of a deployment's adjuster tunables + a ranking reference.

Pure data, no gRPC: the servicers, the client and the store all speak these types
(convert.py translates to and from protos). Constructing a Tunables validates it, so an
invalid one never exists; the errors name the field as the proto spells it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from rimuru.controlplane.errors import InvalidArgument

MODES = ("resident", "fixed", "elastic")
INT32_MAX = 2**31 - 1
# A Kubernetes object name (DNS subdomain): the operator names deployments after CRs.
_DEPLOYMENT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def check_deployment(name: str, field_name: str = "deployment") -> str:
    if not isinstance(name, str) or not _DEPLOYMENT_NAME.match(name):
        raise InvalidArgument(
            field_name,
            f"{name!r} is not a deployment name: use lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit, at most 253 characters",
        )
    return name


def _check_int(field_name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"tunables.{field_name}", f"must be an integer; got {value!r}")
    if not low <= value <= INT32_MAX:
        raise InvalidArgument(
            f"tunables.{field_name}", f"must be in [{low}, {INT32_MAX}]; got {value}"
        )


@dataclass(frozen=True)
class Tunables:
    """The adjuster's knobs (names shared with rimuru.dataplane.adjust.tunables)."""

    mode: str = "elastic"
    expert_offload_limit: int = 8  # experts per layer that may live in host memory
    shrink_threshold: int = 2  # fewer free expert pages than this -> evict one expert
    grow_threshold: int = 9  # more free expert pages than this -> load experts back
    max_grow_per_round: int = 5
    pages_per_expert: int = 3  # w1, w3, w2
    online_hotness: bool = False  # the control plane may replace the ranking from traffic
    # elastic: expert copies per decode step the adjuster's evictions may cost (expected
    # from the ranking or measured, the larger; it stops evicting and caps admission
    # there); 0 = none
    copy_budget: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidArgument(
                "tunables.mode", f"must be one of {', '.join(MODES)}; got {self.mode!r}"
            )
        _check_int("expert_offload_limit", self.expert_offload_limit, 0)
        _check_int("shrink_threshold", self.shrink_threshold, 0)
        _check_int("grow_threshold", self.grow_threshold, 1)
        _check_int("max_grow_per_round", self.max_grow_per_round, 1)
        _check_int("pages_per_expert", self.pages_per_expert, 1)
        if not isinstance(self.online_hotness, bool):
            raise InvalidArgument("tunables.online_hotness", "must be true or false")
        if (
            not isinstance(self.copy_budget, int | float)
            or isinstance(self.copy_budget, bool)
            or not math.isfinite(self.copy_budget)
            or self.copy_budget < 0
        ):
            raise InvalidArgument(
                "tunables.copy_budget", f"must be a finite number >= 0; got {self.copy_budget!r}"
            )
        if self.copy_budget and self.mode != "elastic":
            raise InvalidArgument(
                "tunables.copy_budget",
                f"applies only to mode elastic; set it to 0 for mode {self.mode}",
            )
        # Equal thresholds would let one free-page count both shrink and grow the pool.
        if self.grow_threshold <= self.shrink_threshold:
            raise InvalidArgument(
                "tunables.grow_threshold",
                f"must exceed shrink_threshold ({self.shrink_threshold}); got "
                f"{self.grow_threshold}",
            )
        if self.mode == "resident" and self.expert_offload_limit != 0:
            raise InvalidArgument(
                "tunables.expert_offload_limit",
                "must be 0 in mode resident (all experts stay in the pool); "
                f"got {self.expert_offload_limit}",
            )


@dataclass(frozen=True)
class RankingRef:
    """Names a stored ranking; `digest` is the sha256 of its content (ranking.py)."""

    id: str
    version: int
    digest: str


@dataclass(frozen=True)
class Policy:
    deployment: str
    version: int  # 1, 2, ... per deployment; 0 is never a stored version
    tunables: Tunables
    ranking: RankingRef | None = None
    created_unix_seconds: float = 0.0
    reason: str = field(default="set")  # "set" | "upload-ranking" | "online-hotness"
