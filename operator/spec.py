"""A RimuruDeployment's spec as typed, immutable values.

The API server has already validated the object against the CRD schema and filled in
its defaults, so parsing here only reads. What the schema cannot say, and what would
make a deployment that can never work, raises `SpecError`; the handlers turn it into a
`kopf.PermanentError` and a `Degraded` condition naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rimuru.operator.autoscaling import Autoscaling, parse_autoscaling
from rimuru.operator.availability import Availability, parse_availability
from rimuru.operator.extras import parse_extra_args, parse_extra_env
from rimuru.operator.placement import Placement, parse_placement, parse_pull_secrets
from rimuru.operator.quantities import (
    GPU_RESOURCES,
    MIG_RESOURCE_PREFIX,
    count_gpus,
    quantity_bytes,
)
from rimuru.operator.spec_error import SpecError
from rimuru.policy import (
    InvalidPolicy,
    Tunables,
    check_pages_per_expert,
    check_pushable,
    mode_facts,
)

GROUP = "rimuru.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RimuruDeployment"
PLURAL = "rimurudeployments"

# Child names append at most "-controlplane" (13); Services need DNS-1035 labels <= 63.
MAX_NAME_LEN = 50
# The data plane's fixed ports (naming.py re-exports them): spec.dataPlane.httpPort must
# differ from both.
DATAPLANE_GRPC_PORT = 50051
DATAPLANE_METRICS_PORT = 9464  # the OpenTelemetry Prometheus exporter's usual port
# Pods run as a non-root user with every capability dropped: a port below 1024 would need
# NET_BIND_SERVICE.
MIN_HTTP_PORT = 1024
# The engine's BLOCK_SIZE (its kernels' page layout; dataplane/memory/geometry.py, which the
# operator does not import): spec.engine.blockSize is retired, but old objects still set it
# to this, the one value the CRD allows.
KV_BLOCK_SIZE = 16


@dataclass(frozen=True)
class Owner:
    """Identity of the RimuruDeployment that owns every child."""

    name: str
    namespace: str
    uid: str
    generation: int


@dataclass(frozen=True)
class ModelSpec:
    preset: str | None
    path: str | None
    # Kubernetes volume source ({"persistentVolumeClaim": ...} etc.); None for a preset.
    volume: Mapping[str, Any] | None
    dtype: str


@dataclass(frozen=True)
class EngineSpec:
    memory_budget_bytes: int | None  # from a Kubernetes quantity, e.g. "60Gi"
    gpu_memory_utilization: float | None
    max_num_seqs: int
    max_num_batched_tokens: int
    loading_buffer_slots: int | None = None  # None = the engine's default (start-up limit)
    evict_to_admit: bool | None = None  # None = the engine's default (on)
    enforce_eager: bool | None = None  # None = the engine's default (CUDA graphs on)
    expert_copy: str | None = None  # "host" | "device"; None = the engine's default (device)
    # "full_and_piecewise" | "full_decode_only"; None = the engine's default (full_and_piecewise)
    cudagraph_mode: str | None = None
    async_scheduling: bool | None = None  # None = the engine's auto (on with one CUDA GPU)
    max_model_len: int | None = None  # None = the model's context length
    max_waiting: int | None = None  # 0 = unbounded; None = the server's default (1024)
    fixed_expert_share: float | None = None  # `fixed` policy; None = the engine's (0.5)
    tensor_parallel_size: int = 1  # ranks, one per GPU of the pod


@dataclass(frozen=True)
class DataPlaneSpec:
    replicas: int
    image: str  # "" = the operator's default image
    image_pull_policy: str
    resources: Mapping[str, Any]
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    startup_timeout_seconds: int
    probe_period_seconds: int
    termination_grace_period_seconds: int
    http_port: int | None = None  # the OpenAI-compatible HTTP API; None = off
    num_gpus: int = 0  # GPUs (or MIG slices) in resources.limits; 0 = the engine runs on CPU
    availability: Availability = field(default_factory=Availability)  # rollout, budget, spread
    placement: Placement = field(default_factory=Placement)  # affinity, priority, ...
    extra_args: tuple[str, ...] = ()  # after the operator's `rimuru serve` flags (extras.py)
    extra_env: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class ControlPlaneSpec:
    image: str  # "" = the operator's default image
    image_pull_policy: str
    resources: Mapping[str, Any]
    storage_enabled: bool
    storage_size: str
    storage_class_name: str | None
    image_pull_secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class RankingSource:
    config_map_name: str
    key: str


@dataclass(frozen=True)
class PolicySpec:
    tunables: Tunables
    ranking: RankingSource | None


@dataclass(frozen=True)
class AuthSpec:
    secret_name: str
    key: str
    generated: bool  # True = the operator owns the Secret (no authSecretRef)


@dataclass(frozen=True)
class DeploymentSpec:
    owner: Owner
    model: ModelSpec
    engine: EngineSpec
    data_plane: DataPlaneSpec
    control_plane: ControlPlaneSpec
    policy: PolicySpec
    auth: AuthSpec
    autoscaling: Autoscaling | None = None  # None = replicas as spec.dataPlane.replicas says


def _require(obj: Mapping[str, Any], key: str, path: str) -> Any:
    # A missing defaulted field means the CRD in the cluster predates this operator.
    if key not in obj:
        raise SpecError(
            f"{path}.{key}",
            "is missing; the cluster's RimuruDeployment CRD is older than this operator: "
            "upgrade the rimuru-operator chart (it installs the CRD)",
        )
    return obj[key]


def parse_policy(policy: Mapping[str, Any]) -> PolicySpec:
    """spec.policy (camelCase) -> the Tunables both planes share (snake_case)."""
    path = "spec.policy"
    try:
        if "pagesPerExpert" in policy:  # retired: old objects set it to its one value
            check_pages_per_expert(policy["pagesPerExpert"])
        tunables = check_pushable(
            Tunables(
                mode=_require(policy, "mode", path),
                expert_offload_limit=_require(policy, "expertOffloadLimit", path),
                shrink_threshold=_require(policy, "shrinkThreshold", path),
                grow_threshold=_require(policy, "growThreshold", path),
                max_grow_per_round=_require(policy, "maxGrowPerRound", path),
                online_hotness=_require(policy, "onlineHotness", path),
                # optional: newer than the other tunables (a CRD without it means none)
                copy_budget=policy.get("copyBudget", 0.0),
                elastic_rule=policy.get("elasticRule", "cost"),
                tpot_slo_ms=policy.get("tpotSloMs", 0.0),
            )
        )
    except InvalidPolicy as exc:
        # The policy vocabulary names the proto field (tunables.grow_threshold); say where the
        # user fixes it (spec.policy.growThreshold).
        field = _camel(exc.field.removeprefix("tunables."))
        raise SpecError(f"{path}.{field}", str(exc).split(": ", 1)[-1]) from exc
    ranking = policy.get("ranking")
    source = None
    if ranking is not None:
        path = "spec.policy.ranking"
        source = RankingSource(
            _require(ranking, "configMapName", path), _require(ranking, "key", path)
        )
    return PolicySpec(tunables=tunables, ranking=source)


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(word.capitalize() for word in rest)


def _parse_model(model: Mapping[str, Any]) -> ModelSpec:
    preset, path = model.get("preset"), model.get("path")
    if (preset is None) == (path is None):
        raise SpecError("spec.model", "set exactly one of preset or path")
    volume = model.get("volume")
    if path is not None and not volume:
        raise SpecError("spec.model.volume", "spec.model.path needs a volume to read from")
    if volume is not None and len(volume) != 1:
        raise SpecError(
            "spec.model.volume", "set exactly one of persistentVolumeClaim, hostPath, image"
        )
    return ModelSpec(preset, path, volume, _require(model, "dtype", "spec.model"))


def _parse_engine(
    engine: Mapping[str, Any], data_plane: DataPlaneSpec, tensor_parallel_size: int
) -> EngineSpec:
    budget, utilization = engine.get("memoryBudget"), engine.get("gpuMemoryUtilization")
    if (budget is None) == (utilization is None):
        raise SpecError("spec.engine", "set exactly one of memoryBudget or gpuMemoryUtilization")
    if utilization is not None and data_plane.num_gpus == 0:
        raise SpecError(
            "spec.engine.gpuMemoryUtilization",
            f"needs a GPU: set spec.dataPlane.resources.limits['{GPU_RESOURCES[0]}'] "
            f"(or {GPU_RESOURCES[1]}, {MIG_RESOURCE_PREFIX}*) or use spec.engine.memoryBudget",
        )
    path = "spec.engine"
    if engine.get("blockSize", KV_BLOCK_SIZE) != KV_BLOCK_SIZE:  # retired, as pagesPerExpert
        raise SpecError(
            f"{path}.blockSize",
            f"must be {KV_BLOCK_SIZE} (the kernels' page layout), or left out; got "
            f"{engine['blockSize']!r}",
        )
    return EngineSpec(
        memory_budget_bytes=None
        if budget is None
        else quantity_bytes(budget, f"{path}.memoryBudget"),
        gpu_memory_utilization=None if utilization is None else float(utilization),
        max_num_seqs=_require(engine, "maxNumSeqs", path),
        max_num_batched_tokens=_require(engine, "maxNumBatchedTokens", path),
        loading_buffer_slots=engine.get("loadingBufferSlots"),
        evict_to_admit=_optional_bool(engine, "evictToAdmit", path),
        enforce_eager=_optional_bool(engine, "enforceEager", path),
        expert_copy=_optional_choice(engine, "expertCopy", ("device", "host"), path),
        cudagraph_mode=_optional_choice(
            engine, "cudagraphMode", ("full_and_piecewise", "full_decode_only"), path
        ),
        async_scheduling=_optional_bool(engine, "asyncScheduling", path),
        max_model_len=_optional_number(engine, "maxModelLen", int, 1, None, path),
        max_waiting=_optional_number(engine, "maxWaiting", int, 0, None, path),
        fixed_expert_share=_optional_number(engine, "fixedExpertShare", float, 0.0, 1.0, path),
        tensor_parallel_size=tensor_parallel_size,
    )


def _check_async_scheduling(engine: EngineSpec, policy: PolicySpec) -> None:
    """asyncScheduling true where the engine would refuse it at start-up (config.py): the
    pods would only crash-loop."""
    if not engine.async_scheduling:
        return
    if engine.tensor_parallel_size > 1:
        raise SpecError(
            "spec.engine.asyncScheduling",
            "runs on one GPU: unset it (or false) with tensorParallelSize > 1",
        )
    if engine.expert_copy == "host" and mode_facts(policy.tunables.mode).offloads:
        raise SpecError(
            "spec.engine.asyncScheduling",
            f"needs expertCopy device under mode {policy.tunables.mode}: host copies read "
            f"each layer's routing mid-step; unset it or set expertCopy device",
        )


def _optional_bool(section: Mapping[str, Any], key: str, path: str) -> bool | None:
    value = section.get(key)
    if value is not None and not isinstance(value, bool):
        raise SpecError(f"{path}.{key}", f"must be true or false; got {value!r}")
    return value


def _optional_number(
    section: Mapping[str, Any],
    key: str,
    kind: type[int] | type[float],
    low: float,
    high: float | None,
    path: str,
) -> Any:
    value = section.get(key)
    if value is None:
        return None
    # An integer is a fine float; a float is not an int, and a bool is neither.
    allowed = (int,) if kind is int else (int, float)
    in_range = isinstance(value, allowed) and low <= value and (high is None or value <= high)
    if isinstance(value, bool) or not in_range:
        bounds = f"from {low} to {high}" if high is not None else f">= {low}"
        raise SpecError(f"{path}.{key}", f"must be a {kind.__name__} {bounds}; got {value!r}")
    return kind(value)


def _optional_choice(
    section: Mapping[str, Any], key: str, choices: tuple[str, ...], path: str
) -> str | None:
    value = section.get(key)
    if value is not None and value not in choices:
        raise SpecError(f"{path}.{key}", f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def _with_rank_gpus(data_plane: DataPlaneSpec, tensor_parallel_size: int) -> DataPlaneSpec:
    """spec.engine.tensorParallelSize asks for one GPU per rank: set as the pod's GPU limit
    when resources name none, else they must agree (a pod with more GPUs than ranks would
    leave some idle; with fewer, ranks would share one)."""
    if tensor_parallel_size == 1:
        if data_plane.num_gpus > 1:
            idle = data_plane.num_gpus - 1
            raise SpecError(
                "spec.engine.tensorParallelSize",
                f"is 1, but spec.dataPlane.resources.limits ask for {data_plane.num_gpus} "
                f"GPUs: {idle} would sit idle; set tensorParallelSize to "
                f"{data_plane.num_gpus} (one rank per GPU), or ask for one GPU",
            )
        return data_plane
    if data_plane.num_gpus == 0:
        resources = dict(data_plane.resources)
        limits = {**(resources.get("limits") or {}), GPU_RESOURCES[0]: tensor_parallel_size}
        return replace(data_plane, resources={**resources, "limits": limits},
                       num_gpus=tensor_parallel_size)  # fmt: skip
    if data_plane.num_gpus != tensor_parallel_size:
        raise SpecError(
            "spec.engine.tensorParallelSize",
            f"needs one GPU per rank ({tensor_parallel_size}); spec.dataPlane.resources.limits "
            f"ask for {data_plane.num_gpus}: make them agree, or leave the GPU limit out",
        )
    return data_plane


def _parse_data_plane(dp: Mapping[str, Any]) -> DataPlaneSpec:
    path = "spec.dataPlane"
    resources = dict(dp.get("resources") or {})
    return DataPlaneSpec(
        replicas=_require(dp, "replicas", path),
        image=dp.get("image", ""),
        image_pull_policy=_require(dp, "imagePullPolicy", path),
        resources=resources,
        node_selector=dict(dp.get("nodeSelector") or {}),
        tolerations=tuple(dp.get("tolerations") or ()),
        startup_timeout_seconds=_require(dp, "startupTimeoutSeconds", path),
        probe_period_seconds=_require(dp, "probePeriodSeconds", path),
        termination_grace_period_seconds=_require(dp, "terminationGracePeriodSeconds", path),
        http_port=_parse_http_port(dp, path),
        num_gpus=count_gpus(resources.get("limits") or {}, f"{path}.resources.limits"),
        availability=parse_availability(dp, path),
        placement=parse_placement(dp, path),
        extra_args=parse_extra_args(dp),
        extra_env=parse_extra_env(dp, path),
    )


def _parse_http_port(dp: Mapping[str, Any], path: str) -> int | None:
    # Absent (a CRD older than the field) means off; 0 turns it off.
    value = dp.get("httpPort", 0)
    if isinstance(value, int) and not isinstance(value, bool):
        if value == 0:
            return None
        if MIN_HTTP_PORT <= value <= 65535 and value not in (
            DATAPLANE_GRPC_PORT,
            DATAPLANE_METRICS_PORT,
        ):
            return value
    raise SpecError(
        f"{path}.httpPort",
        f"must be 0 (off) or a port from {MIN_HTTP_PORT} to 65535 other than "
        f"{DATAPLANE_GRPC_PORT} (gRPC) and {DATAPLANE_METRICS_PORT} (metrics); got {value!r}",
    )


def _parse_control_plane(cp: Mapping[str, Any]) -> ControlPlaneSpec:
    storage = _require(cp, "storage", "spec.controlPlane")
    return ControlPlaneSpec(
        image=cp.get("image", ""),
        image_pull_policy=_require(cp, "imagePullPolicy", "spec.controlPlane"),
        resources=dict(cp.get("resources") or {}),
        storage_enabled=_require(storage, "enabled", "spec.controlPlane.storage"),
        storage_size=str(_require(storage, "size", "spec.controlPlane.storage")),
        storage_class_name=storage.get("storageClassName"),
        image_pull_secrets=parse_pull_secrets(cp),
    )


def generated_secret_name(owner: Owner) -> str:
    # Not NAME-token: that is also the data-plane token Secret of the RimuruDeployment
    # named NAME minus "-dataplane" (x-dataplane-token for both "x" and "x-dataplane").
    # What must stay true: no child's name suffix ends another child's of the same kind.
    return f"{owner.name}-operator-token"


def parse_owner(meta: Mapping[str, Any]) -> Owner:
    name = meta["name"]
    if len(name) > MAX_NAME_LEN:
        raise SpecError(
            "metadata.name", f"must be at most {MAX_NAME_LEN} characters; got {len(name)}"
        )
    return Owner(name, meta["namespace"], meta["uid"], int(meta.get("generation", 1)))


def parse_spec(meta: Mapping[str, Any], spec: Mapping[str, Any]) -> DeploymentSpec:
    """Read a RimuruDeployment; raises SpecError for a spec that can never work."""
    owner = parse_owner(meta)
    engine = _require(spec, "engine", "spec")
    ranks = _optional_number(engine, "tensorParallelSize", int, 1, 8, "spec.engine") or 1
    data_plane = _with_rank_gpus(_parse_data_plane(_require(spec, "dataPlane", "spec")), ranks)
    ref = spec.get("authSecretRef")
    if ref is None:
        auth = AuthSpec(secret_name=generated_secret_name(owner), key="token", generated=True)
    else:
        name = _require(ref, "name", "spec.authSecretRef")
        key = _require(ref, "key", "spec.authSecretRef")
        auth = AuthSpec(secret_name=name, key=key, generated=False)
    engine_spec = _parse_engine(engine, data_plane, ranks)
    policy = parse_policy(_require(spec, "policy", "spec"))
    _check_async_scheduling(engine_spec, policy)
    return DeploymentSpec(
        owner=owner,
        model=_parse_model(_require(spec, "model", "spec")),
        engine=engine_spec,
        data_plane=data_plane,
        control_plane=_parse_control_plane(_require(spec, "controlPlane", "spec")),
        policy=policy,
        auth=auth,
        autoscaling=parse_autoscaling(spec.get("autoscaling"), data_plane.replicas),
    )
