"""Where a spec makes the data-plane pods break the restricted Pod Security profile.

Every pod the operator writes meets the restricted profile (non-root, no privilege
escalation, every capability dropped, RuntimeDefault seccomp) except where the spec asks
for what the profile forbids: today only a hostPath model volume. A namespace that
enforces the profile (pod-security.kubernetes.io/enforce: restricted) then refuses the
pods, while the Deployment itself is accepted with no more than a warning, so the
operator says so in status and in an event.
"""

from __future__ import annotations

from dataclasses import dataclass

from rimuru.operator.spec import DeploymentSpec


@dataclass(frozen=True)
class Finding:
    reason: str  # CamelCase, for the condition and the event
    message: str


def restricted_profile_findings(spec: DeploymentSpec) -> tuple[Finding, ...]:
    volume = spec.model.volume or {}
    if "hostPath" not in volume:
        return ()
    path = volume["hostPath"].get("path", "")
    return (
        Finding(
            "HostPathVolume",
            f"spec.model.volume.hostPath ({path}) breaks the restricted Pod Security "
            "profile: in a namespace that enforces it (pod-security.kubernetes.io/enforce: "
            "restricted) the data-plane pods are refused. Use a persistentVolumeClaim or an "
            "image volume, or a namespace at the baseline level or below",
        ),
    )
