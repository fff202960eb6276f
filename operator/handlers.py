"""kopf registration only: every decision lives in reconcile, builders and status.

    create / update / resume  -> children applied, policy pushed (authoritative), status
    daemon (every N s)        -> lost policy restored, ranking refreshed, status
    delete                    -> children deleted (the garbage collector would too)

A change to spec.policy reaches the pods through the control plane only: the update
handler re-applies the children (unchanged, so nothing is written) and pushes the new
tunables. `kopf.TemporaryError` retries while a dependency is not ready;
`kopf.PermanentError` stops until the spec changes.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import aiohttp
import kopf

from rimuru.operator import reconcile
from rimuru.operator.config import OperatorConfig
from rimuru.operator.kube import KubeClient, KubeError, connection_info
from rimuru.operator.naming import controlplane_endpoint, dataplane_endpoints, selector_string
from rimuru.operator.spec import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    DeploymentSpec,
    Owner,
    SpecError,
    parse_spec,
)
from rimuru.operator.status import (
    Blocker,
    Observation,
    Problem,
    compute_status,
    invalid_spec_status,
)

RESOURCE = (GROUP, VERSION, PLURAL)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Progress and diff-base in annotations: status keeps only our own schema's fields.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/cleanup"
    # The watched resource is fixed: no need to list CRDs or namespaces (nor RBAC for it).
    settings.scanning.disabled = True
    if "config" not in memo:  # `rimuru operator` passes it; other launchers use the env
        memo.config = OperatorConfig.from_env(os.environ)
    memo.kube = KubeClient(connection_info(settings))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.kube.close()


@kopf.on.login()
def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    return connection_info(settings)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(status: kopf.Status, spec: DeploymentSpec, obs: Observation) -> dict[str, Any]:
    return compute_status(
        obs,
        status.get("conditions") or [],
        now=_now(),
        selector=selector_string(spec.owner),
        controlplane_endpoint=controlplane_endpoint(spec.owner),
        endpoints=dataplane_endpoints(spec.owner, spec.data_plane.http_port),
    )


async def _pass(
    memo: kopf.Memo,
    spec: DeploymentSpec,
    status: kopf.Status,
    *,
    apply_children: bool,
    overwrite_policy: bool,
    prune_children: bool = False,
) -> tuple[Observation, Problem | None]:
    kube, config = memo.kube, memo.config
    problem, policy = None, None
    uploaded = (status.get("policy") or {}).get("rankingDigest", "")
    try:
        token = await reconcile.ensure_token(kube, spec)
        await reconcile.ensure_dataplane_token(kube, spec)
        if apply_children:
            await reconcile.require_cluster_support(kube, spec)
            await reconcile.apply_children(kube, spec, config)
        if prune_children:
            await reconcile.prune_children(kube, spec, config)
        ranking = await reconcile.read_ranking(kube, spec)
        await reconcile.require_controlplane_ready(kube, spec)
        policy = await reconcile.sync_policy(
            spec, config, token, ranking, uploaded, overwrite=overwrite_policy
        )
    except reconcile.Blocked as exc:
        problem = exc.problem
    except KubeError as exc:
        problem = Problem(Blocker.API_ERROR, str(exc))
    return await reconcile.observe(kube, spec, policy, problem), problem


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE)
async def reconcile_handler(
    body: kopf.Body,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    try:
        parsed = parse_spec(meta, spec)
    except SpecError as exc:
        patch.status.update(invalid_spec_status(meta.get("generation", 1), str(exc), now=_now()))
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    obs, problem = await _pass(
        memo, parsed, status, apply_children=True, overwrite_policy=True, prune_children=True
    )
    patch.status.update(_status(status, parsed, obs))
    for finding in obs.pod_security:  # on each spec change, beside the condition
        kopf.warn(body, reason=finding.reason, message=finding.message)
    if problem is not None:
        if problem.blocker.permanent:
            raise kopf.PermanentError(problem.message)
        delay = memo.config.retry_delay_seconds
        if problem.blocker in (Blocker.RANKING_INVALID, Blocker.SECRET_INVALID):
            delay *= 6  # someone must edit the ConfigMap or Secret; do not spin
        raise kopf.TemporaryError(problem.message, delay=delay)
    logger.info("reconciled; policy v%d", obs.policy.desired_version if obs.policy else 0)


def _failed_at(status: kopf.Status, generation: int) -> bool:
    return status.get("phase") == "Failed" and status.get("observedGeneration") == generation


@kopf.daemon(*RESOURCE, cancellation_timeout=5.0)
async def refresh(
    stopped: kopf.DaemonStopped,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    # meta/spec/status are live views: kopf updates them as watch events arrive.
    while not stopped:
        await stopped.wait(memo.config.status_interval_seconds)
        if stopped:
            break
        try:
            parsed = parse_spec(meta, spec)
        except SpecError:
            continue  # the change handler reported it; nothing runs until the spec changes
        if _failed_at(status, parsed.owner.generation):
            continue  # a permanent problem (a rejected child, ...): same, until the spec changes
        try:
            # children re-applied every period: a deleted one comes back, a hand edit of
            # what the operator owns is undone (apply.py), and an unchanged one is one GET
            obs, _ = await _pass(memo, parsed, status, apply_children=True, overwrite_policy=False)
            await memo.kube.patch_status(
                KIND, parsed.owner.namespace, parsed.owner.name, _status(status, parsed, obs)
            )
        except (KubeError, aiohttp.ClientError, OSError, RuntimeError) as exc:
            if stopped or memo.kube.closed:
                break  # shutting down: kopf runs the cleanup activity before it stops daemons
            logger.warning("status refresh failed, retrying next period: %s", exc)


@kopf.on.delete(*RESOURCE)
async def delete_children(meta: kopf.Meta, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    # Owner references let the garbage collector do this too; deleting explicitly frees
    # the GPUs at once and works where no garbage collector runs.
    owner = Owner(meta["name"], meta["namespace"], meta["uid"], meta.get("generation", 1))
    deleted = await reconcile.delete_children(memo.kube, owner)
    logger.info("deleted %s", ", ".join(f"{kind}/{name}" for kind, name in deleted) or "nothing")
