"""The operator's own settings: default images, how to reach control planes, timings.

Read once at start-up (from `rimuru operator` flags, or RIMURU_OPERATOR_* environment
variables when kopf is started another way, e.g. by tests) and never changed after.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rimuru import __version__

ENV_PREFIX = "RIMURU_OPERATOR_"


@dataclass(frozen=True)
class OperatorConfig:
    # Images used when a RimuruDeployment leaves spec.dataPlane/controlPlane.image empty;
    # the Helm chart sets them to the release's images.
    dataplane_image: str = f"ghcr.io/rimuru-dev/rimuru-dataplane:{__version__}"
    controlplane_image: str = f"ghcr.io/rimuru-dev/rimuru-controlplane:{__version__}"
    # Where the operator dials a deployment's control plane; {name}, {namespace} and
    # {port} are filled in. In-cluster the Service DNS name; out of cluster (development,
    # tests) e.g. "127.0.0.1:50052".
    controlplane_target: str = "{name}-controlplane.{namespace}.svc:{port}"
    # How often status is refreshed, drift undone and the policy re-checked against the
    # control plane. A change to a watched child (Deployment, Service, budget) triggers a
    # refresh at once, so the period bounds only what is not watched: the control plane's
    # policy and the engine ConfigMap.
    status_interval_seconds: float = 30.0
    # Delay before retrying when a child or the control plane is not ready yet.
    retry_delay_seconds: float = 10.0
    # Deadline of one gRPC call to a control plane.
    rpc_timeout_seconds: float = 5.0

    def __post_init__(self) -> None:
        for name in ("status_interval_seconds", "retry_delay_seconds", "rpc_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0; got {getattr(self, name)}")

    def target_for(self, name: str, namespace: str, port: int) -> str:
        return self.controlplane_target.format(name=name, namespace=namespace, port=port)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OperatorConfig:
        """Settings from RIMURU_OPERATOR_<FIELD> variables; unset ones keep defaults."""
        kwargs: dict[str, object] = {}
        for name, field_type in (
            ("dataplane_image", str),
            ("controlplane_image", str),
            ("controlplane_target", str),
            ("status_interval_seconds", float),
            ("retry_delay_seconds", float),
            ("rpc_timeout_seconds", float),
        ):
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is None or raw == "":
                continue
            try:
                kwargs[name] = field_type(raw)
            except ValueError as exc:
                raise ValueError(
                    f"{ENV_PREFIX + name.upper()}={raw!r} is not a valid {field_type.__name__}"
                ) from exc
        return cls(**kwargs)
