"""Policy = a numbered version of a deployment's adjuster tunables + a ranking reference.

Pure data, no gRPC: the servicers, the client and the store all speak these types
(convert.py translates to and from protos). The tunables and the ranking themselves are
the vocabulary both planes share (rimuru.policy).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rimuru.controlplane.errors import InvalidArgument
from rimuru.policy import Tunables

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
