"""kopf registration only: every decision lives in reconcile, builders and status.

    create / update / resume  -> children applied, policy pushed (authoritative), status
    timer (every N s)         -> lost policy restored, ranking refreshed, status
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

import kopf
from rimuru.operator import reconcile
from rimuru.operator.config import OperatorConfig
from rimuru.operator.kube import KubeClient, KubeError, connection_info
from rimuru.operator.naming import controlplane_endpoint, selector_string
from rimuru.operator.spec import (
    GROUP,
    PLURAL,
    VERSION,
    DeploymentSpec,
    Owner,
    SpecError,
    parse_spec,
)
from rimuru.operator.status import Blocker, Problem, compute_status

# Read once at import: `rimuru operator` sets these variables from its flags first.
CONFIG = OperatorConfig.from_env(os.environ)
RESOURCE = (GROUP, VERSION, PLURAL)
ANNOTATION_PREFIX = GROUP


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Progress and diff-base in annotations: status keeps only our own schema's fields.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/cleanup"
    # The watched resource is fixed: no need to list CRDs or namespaces (nor RBAC for it).
    settings.scanning.disabled = True
    memo.kube = KubeClient(connection_info(settings))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.kube.close()


@kopf.on.login()
def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    return connection_info(settings)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _write_status(
    patch: kopf.Patch, status: kopf.Status, spec: DeploymentSpec, obs: reconcile.Observation
) -> None:
    patch.status.update(
        compute_status(
            obs,
            status.get("conditions") or [],
            now=_now(),
            selector=selector_string(spec.owner),
            controlplane_endpoint=controlplane_endpoint(spec.owner),
        )
    )


def _parse(meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status, patch: kopf.Patch):
    try:
        return parse_spec(meta, spec)
    except SpecError as exc:
        patch.status.update(
            {
                "phase": "Failed",
                "observedGeneration": meta.get("generation", 1),
                "conditions": [
                    {
                        "type": "Degraded",
                        "status": "True",
                        "reason": Blocker.INVALID_SPEC.reason,
                        "message": str(exc),
                        "lastTransitionTime": _now(),
                    }
                ],
            }
        )
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc


async def _pass(
    kube: KubeClient,
    spec: DeploymentSpec,
    status: kopf.Status,
    *,
    apply_children: bool,
    overwrite_policy: bool,
) -> tuple[reconcile.Observation, Problem | None]:
    problem, policy = None, None
    uploaded = (status.get("policy") or {}).get("rankingDigest", "")
    try:
        token = await reconcile.ensure_token(kube, spec)
        if apply_children:
            await reconcile.apply_children(kube, spec, CONFIG)
        ranking = await reconcile.read_ranking(kube, spec)
        policy = await reconcile.sync_policy(
            spec, CONFIG, token, ranking, uploaded, overwrite=overwrite_policy
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
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    parsed = _parse(meta, spec, status, patch)
    obs, problem = await _pass(
        memo.kube, parsed, status, apply_children=True, overwrite_policy=True
    )
    _write_status(patch, status, parsed, obs)
    if problem is not None:
        if problem.blocker.permanent:
            raise kopf.PermanentError(problem.message)
        delay = CONFIG.retry_delay_seconds
        if problem.blocker is Blocker.RANKING_INVALID:
            delay *= 6  # someone must edit the ConfigMap; do not spin
        raise kopf.TemporaryError(problem.message, delay=delay)
    logger.info("reconciled: policy v%s", obs.policy.desired_version if obs.policy else "?")


@kopf.timer(*RESOURCE, interval=CONFIG.status_interval_seconds, initial_delay=1.0)
async def refresh(
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    try:
        parsed = parse_spec(meta, spec)
    except SpecError:
        return  # the change handler has reported it; nothing runs until the spec changes
    obs, _problem = await _pass(
        memo.kube, parsed, status, apply_children=False, overwrite_policy=False
    )
    _write_status(patch, status, parsed, obs)


@kopf.on.delete(*RESOURCE)
async def delete_children(meta: kopf.Meta, memo: kopf.Memo, **_: Any) -> None:
    # Owner references let the garbage collector do this too; deleting explicitly frees
    # the GPUs at once and works where no garbage collector runs.
    owner = Owner(meta["name"], meta["namespace"], meta["uid"], meta.get("generation", 1))
    await reconcile.delete_children(memo.kube, owner)
