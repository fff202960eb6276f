"""One reconcile pass: children, token, ranking, policy, then the observed state.

Called by the kopf handlers (handlers.py). Every step is idempotent, so a pass that is
retried after a TemporaryError, or repeated on resume, changes nothing that is already
right. Each step that cannot finish raises `Blocked` with the status problem it means.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import secrets
from collections.abc import Callable
from typing import Any

from rimuru.controlplane.client import ControlPlaneClient
from rimuru.controlplane.errors import ControlPlaneError, InvalidArgument, Unauthenticated
from rimuru.operator import policy_sync
from rimuru.operator.apply import ForeignObject, apply, holder
from rimuru.operator.builders import (
    Tokens,
    build_children,
    build_dataplane_token_secret,
    build_token_secret,
    with_token_checksums,
)
from rimuru.operator.cluster import (
    depends_on_version,
    parse_server_version,
    unsupported_feature,
)
from rimuru.operator.config import OperatorConfig
from rimuru.operator.kube import KubeClient, KubeError
from rimuru.operator.naming import (
    CONTROLPLANE,
    CONTROLPLANE_GRPC_PORT,
    DATAPLANE,
    LAST_APPLIED_GENERATION_ANNOTATION,
    REVISION_HISTORY_LIMIT,
    TOKEN_KEY,
    child_name,
    child_refs,
    dataplane_secret_name,
    is_owned_by,
    optional_child_refs,
    selector_labels,
)
from rimuru.operator.pod_failures import dataplane_unschedulable, pod_failure
from rimuru.operator.pod_security import restricted_profile_findings
from rimuru.operator.policy_sync import PolicyState, RankingUpload
from rimuru.operator.spec import DeploymentSpec, Owner
from rimuru.operator.status import Blocker, ChildSpec, Observation, Problem

TOKEN_BYTES = 32
# The API server's answer to an object that fails validation (or an admission policy):
# retrying the same manifest gets it again.
HTTP_UNPROCESSABLE = 422


class Blocked(Exception):
    """A step cannot finish now (or, if permanent, until the spec changes)."""

    def __init__(self, blocker: Blocker, message: str) -> None:
        super().__init__(message)
        self.problem = Problem(blocker, message)


async def ensure_token(kube: KubeClient, spec: DeploymentSpec) -> str:
    """The control plane's bearer token, generating its Secret when none is referenced."""
    auth, ns = spec.auth, spec.owner.namespace
    secret = await kube.get("Secret", ns, auth.secret_name)
    if secret is None and auth.generated:
        await _apply_child(kube, build_token_secret(spec, secrets.token_urlsafe(TOKEN_BYTES)))
        secret = await kube.get("Secret", ns, auth.secret_name)
    if secret is not None and auth.generated:
        _require_owned(secret, spec)  # a token someone else left under our name: not ours
    if secret is None:
        raise Blocked(
            Blocker.SECRET_MISSING,
            f"Secret {auth.secret_name} (spec.authSecretRef) not found in namespace {ns}",
        )
    encoded = (secret.get("data") or {}).get(auth.key)
    if not encoded:
        raise Blocked(Blocker.SECRET_MISSING, f"Secret {auth.secret_name} has no key {auth.key!r}")
    return _token_text(auth.secret_name, auth.key, encoded)


def _token_text(secret_name: str, key: str, encoded: str) -> str:
    # A token travels in a gRPC header: printable text, so UTF-8 without surrounding space.
    try:
        token = base64.b64decode(encoded, validate=True).decode("utf-8").strip()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise Blocked(
            Blocker.SECRET_INVALID,
            f"Secret {secret_name} key {key!r} is not a UTF-8 text token ({exc}); "
            "store the token as text, e.g. kubectl create secret generic --from-literal",
        ) from exc
    if not token:
        raise Blocked(Blocker.SECRET_INVALID, f"Secret {secret_name} key {key!r} is blank")
    return token


async def ensure_dataplane_token(kube: KubeClient, spec: DeploymentSpec) -> str:
    """The data planes' token, generating its Secret when there is none (never used by
    the operator itself: its checksum rolls the pods that read it)."""
    name = dataplane_secret_name(spec.owner)
    secret = await kube.get("Secret", spec.owner.namespace, name)
    if secret is None:
        token = secrets.token_urlsafe(TOKEN_BYTES)
        await _apply_child(kube, build_dataplane_token_secret(spec, token))
        return token
    _require_owned(secret, spec)
    encoded = (secret.get("data") or {}).get(TOKEN_KEY)
    if not encoded:
        raise Blocked(Blocker.SECRET_INVALID, f"Secret {name} has no key {TOKEN_KEY!r}")
    return _token_text(name, TOKEN_KEY, encoded)


def _require_owned(secret: dict[str, Any], spec: DeploymentSpec) -> None:
    """A generated token Secret must be this RimuruDeployment's: one found under its name
    but owned elsewhere is neither used nor mounted (its holder knows the token)."""
    if not is_owned_by(secret, spec.owner.uid):
        name = secret.get("metadata", {}).get("name", "")
        refusal = ForeignObject("Secret", name, holder(secret))
        raise Blocked(Blocker.CHILD_NOT_OURS, str(refusal))


async def read_ranking(kube: KubeClient, spec: DeploymentSpec) -> RankingUpload | None:
    source = spec.policy.ranking
    if source is None:
        return None
    ns = spec.owner.namespace
    config_map = await kube.get("ConfigMap", ns, source.config_map_name)
    text = None if config_map is None else (config_map.get("data") or {}).get(source.key)
    if text is None:
        raise Blocked(
            Blocker.RANKING_MISSING,
            f"ConfigMap {source.config_map_name} with key {source.key!r} (spec.policy.ranking) "
            f"not found in namespace {ns}",
        )
    try:
        return policy_sync.parse_ranking(source.config_map_name, source.key, text)
    except ValueError as exc:
        raise Blocked(Blocker.RANKING_INVALID, str(exc)) from exc


async def require_cluster_support(kube: KubeClient, spec: DeploymentSpec) -> None:
    """Refuse a spec the cluster's Kubernetes version cannot run, before any child is
    written. The version is asked only for a spec that depends on it."""
    if not depends_on_version(spec):
        return
    message = unsupported_feature(spec, parse_server_version(await kube.server_version()))
    if message is not None:
        raise Blocked(Blocker.UNSUPPORTED_BY_CLUSTER, message)


async def apply_children(
    kube: KubeClient,
    spec: DeploymentSpec,
    config: OperatorConfig,
    tokens: Tokens,
    current: Callable[[], bool] = lambda: True,
) -> bool:
    """Apply every child of `spec`, the pods' templates stamped with the checksums of
    `tokens`; False if `current` said the spec was replaced before one of the writes (the
    rest are left to the pass of the new spec: a periodic pass that wrote the old spec's
    children after the change handler wrote the new ones would roll the pods back, then
    forward again)."""
    for child in with_token_checksums(build_children(spec, config), tokens):
        if not current():
            return False
        await _apply_child(kube, child)
    return True


async def _apply_child(kube: KubeClient, child: dict[str, Any]) -> None:
    ref = f"{child['kind']} {child['metadata']['name']}"
    try:
        await apply(kube, child, kube.stored_shapes)
    except ForeignObject as exc:
        raise Blocked(Blocker.CHILD_NOT_OURS, str(exc)) from exc
    except KubeError as exc:
        if exc.status == HTTP_UNPROCESSABLE:
            raise Blocked(
                Blocker.CHILD_REJECTED, f"the API server rejected {ref}: {exc.message}"
            ) from exc
        raise Blocked(Blocker.API_ERROR, f"applying {ref}: {exc}") from exc


async def prune_children(kube: KubeClient, spec: DeploymentSpec, config: OperatorConfig) -> None:
    """Delete the optional children the spec no longer wants (a disruption budget once
    down to one replica), and the engine ConfigMaps of configs older than the data-plane
    Deployment's history keeps. Run on spec changes only: nothing else can change the set."""
    wanted = {(c["kind"], c["metadata"]["name"]) for c in build_children(spec, config)}
    for kind, name in optional_child_refs(spec.owner):
        if (kind, name) in wanted:
            continue
        obj = await kube.get(kind, spec.owner.namespace, name)
        if obj is not None and is_owned_by(obj, spec.owner.uid):
            await kube.delete(kind, spec.owner.namespace, name)
    kept = [
        c
        for c in await _engine_config_maps(kube, spec.owner)
        if ("ConfigMap", _name(c)) not in wanted
    ]
    kept.sort(key=_last_applied_generation, reverse=True)
    # Pods of the current config and of every ReplicaSet the Deployment keeps still need
    # theirs (rollout undo); at most REVISION_HISTORY_LIMIT earlier configs stay.
    for stale in kept[REVISION_HISTORY_LIMIT:]:
        await kube.delete("ConfigMap", spec.owner.namespace, _name(stale))


async def _engine_config_maps(kube: KubeClient, owner: Owner) -> list[dict[str, Any]]:
    labelled = await kube.list("ConfigMap", owner.namespace, selector_labels(owner, DATAPLANE))
    return [c for c in labelled if is_owned_by(c, owner.uid)]


def _name(obj: dict[str, Any]) -> str:
    return obj["metadata"]["name"]


def _last_applied_generation(config_map: dict[str, Any]) -> int:
    annotations = config_map["metadata"].get("annotations") or {}
    value = annotations.get(LAST_APPLIED_GENERATION_ANNOTATION, "0")
    return int(value) if value.isdigit() else 0


async def require_controlplane_ready(kube: KubeClient, spec: DeploymentSpec) -> None:
    """Block early, without a gRPC deadline to wait out, while no control-plane pod is ready."""
    name = child_name(spec.owner, CONTROLPLANE)
    deployment = await kube.get("Deployment", spec.owner.namespace, name)
    if _replicas(deployment, "readyReplicas") < 1:
        raise Blocked(
            Blocker.CONTROL_PLANE_UNAVAILABLE, f"waiting for Deployment {name} to be ready"
        )


async def sync_policy(
    spec: DeploymentSpec,
    config: OperatorConfig,
    token: str,
    ranking: RankingUpload | None,
    uploaded_digest: str,
    *,
    overwrite: bool,
) -> PolicyState:
    """Push the policy (off the event loop) and return what the control plane reports."""
    owner = spec.owner
    target = config.target_for(owner.name, owner.namespace, CONTROLPLANE_GRPC_PORT)

    def blocking() -> PolicyState:
        with ControlPlaneClient(target, token, timeout_s=config.rpc_timeout_seconds) as cp:
            _, digest = policy_sync.sync_policy(
                cp, owner.name, spec.policy.tunables, ranking, uploaded_digest, overwrite=overwrite
            )
            return policy_sync.observe_policy(cp, owner.name, spec.policy.tunables, digest)

    try:
        return await asyncio.to_thread(blocking)
    except InvalidArgument as exc:
        raise Blocked(Blocker.POLICY_REJECTED, f"control plane rejected the policy: {exc}") from exc
    except Unauthenticated as exc:
        raise Blocked(
            Blocker.CONTROL_PLANE_UNAUTHENTICATED,
            f"control plane at {target} refused the token in Secret {spec.auth.secret_name}: {exc}",
        ) from exc
    except ControlPlaneError as exc:
        raise Blocked(
            Blocker.CONTROL_PLANE_UNAVAILABLE, f"control plane at {target}: {exc}"
        ) from exc


def _replicas(deployment: dict[str, Any] | None, key: str) -> int:
    return int(((deployment or {}).get("status") or {}).get(key) or 0)


def _child_spec(deployment: dict[str, Any] | None) -> ChildSpec:
    """Whether the Deployment controller has seen the latest spec, so that the status
    counts describe it: kubectl rollout status's first check."""
    if deployment is None:
        return ChildSpec.MISSING
    generation = int((deployment.get("metadata") or {}).get("generation") or 0)
    observed = int((deployment.get("status") or {}).get("observedGeneration") or 0)
    return ChildSpec.OBSERVED if observed >= generation else ChildSpec.STALE


async def observe(
    kube: KubeClient, spec: DeploymentSpec, policy: PolicyState | None, problem: Problem | None
) -> Observation:
    ns = spec.owner.namespace
    dataplane = await kube.get("Deployment", ns, child_name(spec.owner, DATAPLANE))
    controlplane = await kube.get("Deployment", ns, child_name(spec.owner, CONTROLPLANE))
    pods = await kube.list("Pod", ns, selector_labels(spec.owner, DATAPLANE))
    controlplane_pods = await kube.list("Pod", ns, selector_labels(spec.owner, CONTROLPLANE))
    return Observation(
        generation=spec.owner.generation,
        desired_replicas=spec.data_plane.replicas,
        current_replicas=_replicas(dataplane, "replicas"),
        ready_replicas=_replicas(dataplane, "readyReplicas"),
        updated_replicas=_replicas(dataplane, "updatedReplicas"),
        controlplane_ready=_replicas(controlplane, "readyReplicas") >= 1,
        dataplane_spec=_child_spec(dataplane),
        controlplane_spec=_child_spec(controlplane),
        policy=policy,
        problem=problem,
        pod_security=restricted_profile_findings(spec),
        dataplane_failure=pod_failure(pods),
        controlplane_failure=pod_failure(controlplane_pods),
        dataplane_unschedulable=dataplane_unschedulable(pods),
    )


async def delete_children(kube: KubeClient, owner: Owner) -> list[tuple[str, str]]:
    """Delete the children this RimuruDeployment owns; returns what was deleted."""
    deleted = []
    refs = child_refs(owner) + [
        ("ConfigMap", _name(c)) for c in await _engine_config_maps(kube, owner)
    ]
    for kind, name in refs:
        obj = await kube.get(kind, owner.namespace, name)
        # Only our own: a Secret referenced by authSecretRef belongs to the user.
        if (
            obj is not None
            and is_owned_by(obj, owner.uid)
            and await kube.delete(kind, owner.namespace, name)
        ):
            deleted.append((kind, name))
    return deleted
