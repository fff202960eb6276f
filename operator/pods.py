"""Pod templates of the data plane and the control plane.

The data-plane template is a function of the engine config, the image and the pod
placement only; the live policy fields never reach it (live tuning must not roll pods). The
engine config travels in a ConfigMap (envFrom), so its hash is stamped on the template:
an engine change rolls the pods, a policy change does not.
"""

from __future__ import annotations

import math
from typing import Any

from rimuru.operator.availability import topology_spread
from rimuru.operator.config import OperatorConfig
from rimuru.operator.engine_config import engine_config, engine_config_hash
from rimuru.operator.naming import (
    CONFIG_HASH_ANNOTATION,
    CONTROLPLANE,
    CONTROLPLANE_GRPC_PORT,
    DATAPLANE,
    DATAPLANE_GRPC_PORT,
    DATAPLANE_METRICS_PORT,
    DATAPLANE_TOKEN_FILE,
    MODEL_MOUNT,
    POLICY_DIR,
    RUN_AS_USER,
    TOKEN_DIR,
    TOKEN_KEY,
    child_name,
    config_map_name,
    dataplane_secret_name,
    labels,
    prometheus_annotations,
    pvc_name,
    selector_labels,
)
from rimuru.operator.placement import place, pull_secret_refs
from rimuru.operator.spec import DeploymentSpec

# Readiness flips quickly (drain, overload); liveness only after sustained failure.
READINESS_FAILURE_THRESHOLD = 3
LIVENESS_FAILURE_THRESHOLD = 6
# What must stay true: terminationGracePeriodSeconds = --drain-grace-seconds + this margin,
# so that the engine aborts what is left of its drain and exits before the kubelet's
# SIGKILL (stopping the servers, the control-plane link and the metrics exporter).
DRAIN_EXIT_MARGIN_SECONDS = 10


def drain_grace_seconds(termination_grace_period_seconds: int) -> int:
    """The data plane's drain after SIGTERM: the pod's grace period less the exit margin
    (none at all when the grace period is shorter than the margin)."""
    return max(0, termination_grace_period_seconds - DRAIN_EXIT_MARGIN_SECONDS)


def _grpc_probe(port: int, period_s: int, failure_threshold: int) -> dict[str, Any]:
    # Kubernetes' gRPC probe calls grpc.health.v1.Health/Check on the server (service "").
    # The servers report NOT_SERVING until ready (the data plane: model loaded and warm).
    return {
        "grpc": {"port": port},
        "periodSeconds": period_s,
        "timeoutSeconds": min(5, period_s),
        "failureThreshold": failure_threshold,
    }


def _http_probe(port_name: str, period_s: int, failure_threshold: int) -> dict[str, Any]:
    # The HTTP API's /health answers 503 while loading or draining, 200 while serving.
    return {
        "httpGet": {"path": "/health", "port": port_name},
        "periodSeconds": period_s,
        "timeoutSeconds": min(5, period_s),
        "failureThreshold": failure_threshold,
    }


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_security() -> dict[str, Any]:
    # fsGroup makes the policy volume writable by the non-root user.
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _dataplane_token_volume(spec: DeploymentSpec) -> dict[str, Any]:
    # Only the data planes' own token: the operator's never reaches a data-plane pod.
    return {
        "name": "token",
        "secret": {
            "secretName": dataplane_secret_name(spec.owner),
            "items": [{"key": TOKEN_KEY, "path": "token"}],
            "defaultMode": 0o440,
        },
    }


def _controlplane_token_volume(spec: DeploymentSpec) -> dict[str, Any]:
    # The control plane checks both tokens: the operator's and the data planes'.
    return {
        "name": "token",
        "projected": {
            "sources": [
                {
                    "secret": {
                        "name": spec.auth.secret_name,
                        "items": [{"key": spec.auth.key, "path": "token"}],
                    }
                },
                {
                    "secret": {
                        "name": dataplane_secret_name(spec.owner),
                        "items": [{"key": TOKEN_KEY, "path": DATAPLANE_TOKEN_FILE}],
                    }
                },
            ],
            "defaultMode": 0o440,
        },
    }


def _model_volume(spec: DeploymentSpec) -> dict[str, Any] | None:
    volume = spec.model.volume
    if volume is None:
        return None
    (kind, source), *_ = volume.items()
    source = dict(source)
    if kind == "persistentVolumeClaim":
        source["readOnly"] = True
    if kind == "hostPath":
        source["type"] = "Directory"
    return {"name": "model", kind: source}


def dataplane_pod_template(spec: DeploymentSpec, config: OperatorConfig) -> dict[str, Any]:
    owner, dp = spec.owner, spec.data_plane
    config_hash = engine_config_hash(engine_config(spec))
    period = dp.probe_period_seconds
    mounts = [
        {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [
        _dataplane_token_volume(spec),
        {"name": "tmp", "emptyDir": {}},
    ]
    model_volume = _model_volume(spec)
    if model_volume is not None:
        volumes.append(model_volume)
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    if dp.num_gpus > 1:
        # Tensor parallel: NCCL and torch's workers share memory through /dev/shm, which a
        # container gets only 64 MiB of. Memory-backed, so it counts against the memory limit.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    args = [
        "serve",
        "--port",
        str(DATAPLANE_GRPC_PORT),
        "--metrics-port",
        str(DATAPLANE_METRICS_PORT),
        "--control-plane",
        f"{child_name(owner, CONTROLPLANE)}:{CONTROLPLANE_GRPC_PORT}",
        "--deployment",
        owner.name,
        "--token-file",
        f"{TOKEN_DIR}/token",
        "--drain-grace-seconds",
        str(drain_grace_seconds(dp.termination_grace_period_seconds)),
    ]
    ports = [
        {"name": "grpc", "containerPort": DATAPLANE_GRPC_PORT, "protocol": "TCP"},
        {"name": "metrics", "containerPort": DATAPLANE_METRICS_PORT, "protocol": "TCP"},
    ]
    readiness = _grpc_probe(DATAPLANE_GRPC_PORT, period, READINESS_FAILURE_THRESHOLD)
    if dp.http_port is not None:
        args += ["--http-port", str(dp.http_port)]
        ports.append({"name": "http", "containerPort": dp.http_port, "protocol": "TCP"})
        # Ready means what HTTP clients (and gateways that probe the same path) see.
        readiness = _http_probe("http", period, READINESS_FAILURE_THRESHOLD)
    container = {
        "name": "dataplane",
        "image": dp.image or config.dataplane_image,
        "imagePullPolicy": dp.image_pull_policy,
        "args": [*args, *dp.extra_args],  # the spec's last: a flag given twice is the spec's
        "envFrom": [{"configMapRef": {"name": config_map_name(owner, config_hash)}}],
        "env": [
            # The node id the control plane lists this replica under (ListSubscribers).
            {"name": "RIMURU_NODE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            # Writable caches on a read-only root filesystem (Triton kernels, torch).
            {"name": "HOME", "value": "/tmp"},
            {"name": "TRITON_CACHE_DIR", "value": "/tmp/triton"},
            *(dict(var) for var in dp.extra_env),  # extras.OPERATOR_ENV names excluded
        ],
        "ports": ports,
        # Loading a large checkpoint takes minutes: the startup probe holds liveness and
        # readiness back for up to startupTimeoutSeconds instead of killing the pod.
        "startupProbe": _grpc_probe(
            DATAPLANE_GRPC_PORT, period, math.ceil(dp.startup_timeout_seconds / period)
        ),
        "readinessProbe": readiness,
        "livenessProbe": _grpc_probe(DATAPLANE_GRPC_PORT, period, LIVENESS_FAILURE_THRESHOLD),
        "resources": dict(dp.resources),
        "volumeMounts": mounts,
        "securityContext": _container_security(),
        # A failed model load's last log lines become the termination message, which the
        # operator reports in status (pod_failures.py).
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": dp.termination_grace_period_seconds,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": volumes,
    }
    if dp.node_selector:
        pod_spec["nodeSelector"] = dict(dp.node_selector)
    if dp.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in dp.tolerations]
    spread = topology_spread(dp.availability, selector_labels(owner, DATAPLANE))
    if spread:
        pod_spec["topologySpreadConstraints"] = spread
    place(pod_spec, dp.placement)
    # The spec's labels and annotations first: the operator's own win.
    annotations = {
        **dp.placement.pod_annotations,
        **prometheus_annotations(),
        CONFIG_HASH_ANNOTATION: config_hash,
    }
    pod_labels = {**dp.placement.pod_labels, **labels(owner, DATAPLANE)}
    return {
        "metadata": {"labels": pod_labels, "annotations": annotations},
        "spec": pod_spec,
    }


def controlplane_pod_template(spec: DeploymentSpec, config: OperatorConfig) -> dict[str, Any]:
    owner, cp = spec.owner, spec.control_plane
    if cp.storage_enabled:
        policy_volume = {"name": "policy", "persistentVolumeClaim": {"claimName": pvc_name(owner)}}
    else:
        policy_volume = {"name": "policy", "emptyDir": {}}
    container = {
        "name": "controlplane",
        "image": cp.image or config.controlplane_image,
        "imagePullPolicy": cp.image_pull_policy,
        "args": [
            "controlplane",
            "--port",
            str(CONTROLPLANE_GRPC_PORT),
            "--data-dir",
            POLICY_DIR,
            "--token-file",
            f"{TOKEN_DIR}/token",
            "--dataplane-token-file",
            f"{TOKEN_DIR}/{DATAPLANE_TOKEN_FILE}",
        ],
        "ports": [{"name": "grpc", "containerPort": CONTROLPLANE_GRPC_PORT, "protocol": "TCP"}],
        "readinessProbe": _grpc_probe(CONTROLPLANE_GRPC_PORT, 5, READINESS_FAILURE_THRESHOLD),
        "livenessProbe": _grpc_probe(CONTROLPLANE_GRPC_PORT, 10, LIVENESS_FAILURE_THRESHOLD),
        "resources": dict(cp.resources),
        "volumeMounts": [
            {"name": "policy", "mountPath": POLICY_DIR},
            {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True},
        ],
        "securityContext": _container_security(),
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": [policy_volume, _controlplane_token_volume(spec)],
    }
    if cp.image_pull_secrets:
        pod_spec["imagePullSecrets"] = pull_secret_refs(cp.image_pull_secrets)
    return {"metadata": {"labels": labels(owner, CONTROLPLANE)}, "spec": pod_spec}
