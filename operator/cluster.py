"""What the cluster's Kubernetes version allows a spec to use.

The chart installs on Kubernetes 1.30 and later, but one source of model weights, the
image volume (`spec.model.volume.image`), exists only from 1.31 (alpha; beta from 1.33,
on by default from 1.35, and before that only where the ImageVolume feature gate is
turned on). On an older API server the Pod field does not exist and the data-plane
Deployment would be refused, so the operator refuses the spec first, saying why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rimuru.operator.spec import DeploymentSpec

IMAGE_VOLUME_MIN_VERSION = (1, 31)
IMAGE_VOLUME_DEFAULT_ON_VERSION = (1, 35)


def parse_server_version(info: Mapping[str, Any]) -> tuple[int, int] | None:
    """(major, minor) from the API server's /version; None when it does not say (a
    provider's "1", "28+" is 1.28)."""
    major = re.match(r"\d+", str(info.get("major", "")))
    minor = re.match(r"\d+", str(info.get("minor", "")))
    if major is None or minor is None:
        return None
    return int(major.group()), int(minor.group())


def depends_on_version(spec: DeploymentSpec) -> bool:
    return "image" in (spec.model.volume or {})


def unsupported_feature(spec: DeploymentSpec, version: tuple[int, int] | None) -> str | None:
    """Why this cluster cannot run the spec, or None (also when the version is unknown:
    the API server then has the last word)."""
    if not depends_on_version(spec) or version is None or version >= IMAGE_VOLUME_MIN_VERSION:
        return None
    need = ".".join(map(str, IMAGE_VOLUME_MIN_VERSION))
    on = ".".join(map(str, IMAGE_VOLUME_DEFAULT_ON_VERSION))
    return (
        f"spec.model.volume.image needs Kubernetes {need} or later (the ImageVolume feature "
        f"gate, on by default from {on}); this cluster is {version[0]}.{version[1]}: put the "
        "weights on a persistentVolumeClaim instead"
    )
