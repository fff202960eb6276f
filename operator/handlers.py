"""kopf registration only: every decision lives in reconcile, builders and status.

    create / update / resume  -> children applied, policy pushed (authoritative), status
    daemon (every N s, and    -> drift undone, lost policy restored, ranking refreshed,
      on a child's change)       status (written only when it changed)
    watches of the children   -> kopf indices the passes read instead of GETs (live.py)
    delete                    -> children deleted (the garbage collector would too)

A change to spec.policy reaches the pods through the control plane only: the update
handler re-applies the children (unchanged, so nothing is written) and pushes the new
tunables. `kopf.TemporaryError` retries while a dependency is not ready;
`kopf.PermanentError` stops until the spec changes.
"""

from __future__ import annotations

import asyncio
import datetime
import os
from collections.abc import Callable
from typing import Any

import aiohttp
import kopf

from rimuru.operator import reconcile
from rimuru.operator.builders import Tokens
from rimuru.operator.config import OperatorConfig
from rimuru.operator.crd import CRD_NAME, UPGRADE_HINT, crd_problem
from rimuru.operator.kube import KubeClient, KubeError, connection_info, load_configuration
from rimuru.operator.live import WATCHED, LiveKube, index_name
from rimuru.operator.naming import (
    INSTANCE_LABEL,
    MANAGED,
    controlplane_endpoint,
    dataplane_endpoints,
    dataplane_secret_name,
    selector_string,
)
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
async def startup(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    # Progress and diff-base in annotations: status keeps only our own schema's fields.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/cleanup"
    # The watched resource is fixed: no need to list CRDs or namespaces (nor RBAC for it).
    settings.scanning.disabled = True
    # The watches of the children bring only the operator's own objects: filtered by the
    # API server, not after every pod and Deployment of the cluster has been sent.
    managed = ",".join(f"{key}={value}" for key, value in MANAGED.items())
    for group_version_plural in WATCHED.values():
        settings.watching.label_selectors[group_version_plural] = managed
    if "config" not in memo:  # `rimuru operator` passes it; other launchers use the env
        memo.config = OperatorConfig.from_env(os.environ)
    try:
        memo.kube = KubeClient(await load_configuration())
    except kopf.LoginError as exc:
        # retrying will not make credentials readable that the client library cannot read
        raise kopf.PermanentError(str(exc)) from exc
    memo.secrets = {}  # (namespace, name) -> the Secret last read (live.py)
    memo.wakeups = {}  # (namespace, name) -> its refresh daemon's wake-up event
    await _require_crd(memo.kube, logger)


async def _require_crd(kube: KubeClient, logger: kopf.Logger) -> None:
    """Refuse to start on an older CRD than this operator's (crd.py): the operator exits
    with the upgrade command, rather than run with every status write refused."""
    try:
        crd = await kube.get_crd(CRD_NAME)
    except KubeError as exc:
        # Not allowed to read it (an older chart's RBAC): run, and let status writes say.
        logger.warning("cannot read the CRD %s to check its revision: %s", CRD_NAME, exc)
        return
    problem = crd_problem(crd)
    if problem is not None:
        await kube.close()
        raise kopf.PermanentError(problem)


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


def _live(memo: kopf.Memo, indices: dict[str, Any], *, on_change: bool) -> LiveKube:
    return LiveKube(
        memo.kube,
        {kind: indices[index_name(kind)] for kind in WATCHED},
        memo.secrets,
        fresh_secrets=on_change,
    )


async def _pass(
    kube: LiveKube,
    config: OperatorConfig,
    spec: DeploymentSpec,
    status: kopf.Status,
    *,
    on_change: bool,
    current: Callable[[], bool] = lambda: True,
) -> tuple[Observation, Problem | None]:
    """One reconcile pass. On a spec change (`on_change`) the policy is pushed even over
    one set by hand, children the spec no longer wants are deleted and the token Secret is
    read again; the periodic pass only restores what drifted."""
    problem, policy = None, None
    uploaded = (status.get("policy") or {}).get("rankingDigest", "")
    try:
        token = await reconcile.ensure_token(kube, spec)
        tokens = Tokens(token, await reconcile.ensure_dataplane_token(kube, spec))
        await reconcile.require_cluster_support(kube, spec)
        if not await reconcile.apply_children(kube, spec, config, tokens, current):
            return await reconcile.observe(kube, spec, None, None), None
        if on_change:
            await reconcile.prune_children(kube, spec, config)
        ranking = await reconcile.read_ranking(kube, spec)
        await reconcile.require_controlplane_ready(kube, spec)
        policy = await reconcile.sync_policy(
            spec, config, token, ranking, uploaded, overwrite=on_change
        )
    except reconcile.Blocked as exc:
        problem = exc.problem
        if problem.blocker in (
            Blocker.CONTROL_PLANE_UNAUTHENTICATED,
            Blocker.CONTROL_PLANE_UNAVAILABLE,
        ):
            # A token Secret rotated or deleted? Read both again: a new value changes the
            # pod templates' checksum and rolls the control plane onto it (builders.py);
            # a deleted one is generated again rather than left missing from its volume.
            kube.forget(spec.owner.namespace, spec.auth.secret_name)
            kube.forget(spec.owner.namespace, dataplane_secret_name(spec.owner))
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
    **kwargs: Any,
) -> None:
    try:
        parsed = parse_spec(meta, spec)
    except SpecError as exc:
        patch.status.update(invalid_spec_status(meta.get("generation", 1), str(exc), now=_now()))
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    kube = _live(memo, kwargs, on_change=True)
    obs, problem = await _pass(kube, memo.config, parsed, status, on_change=True)
    patch.status.update(_status(status, parsed, obs))
    for finding in obs.pod_security:  # on each spec change, beside the condition
        kopf.warn(body, reason=finding.reason, message=finding.message)
    if problem is not None:
        if problem.blocker.permanent:
            raise kopf.PermanentError(problem.message)
        delay = memo.config.retry_delay_seconds
        if problem.blocker in (
            Blocker.RANKING_INVALID,
            Blocker.SECRET_INVALID,
            Blocker.CHILD_NOT_OURS,
        ):
            delay *= 6  # someone must edit or remove an object; do not spin
        raise kopf.TemporaryError(problem.message, delay=delay)
    logger.info("reconciled; policy v%d", obs.policy.desired_version if obs.policy else 0)


def _failed_at(status: kopf.Status, generation: int) -> bool:
    return status.get("phase") == "Failed" and status.get("observedGeneration") == generation


async def _sleep(stopped: kopf.DaemonStopped, wake: asyncio.Event, seconds: float) -> None:
    """Until the period is over, a child of this deployment changed, or the daemon stops."""
    waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    wake.clear()


def _changed(status: kopf.Status, new: dict[str, Any]) -> bool:
    return any(status.get(key) != value for key, value in new.items())


@kopf.daemon(*RESOURCE, cancellation_timeout=5.0)
async def refresh(
    stopped: kopf.DaemonStopped,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    # meta/spec/status are live views: kopf updates them as watch events arrive.
    wake = memo.wakeups.setdefault((meta["namespace"], meta["name"]), asyncio.Event())
    try:
        while not stopped:
            await _sleep(stopped, wake, memo.config.status_interval_seconds)
            if stopped:
                break
            await _refresh_once(meta, spec, status, memo, logger, kwargs, stopped)
    finally:
        memo.wakeups.pop((meta["namespace"], meta["name"]), None)


async def _refresh_once(
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    memo: kopf.Memo,
    logger: kopf.Logger,
    indices: dict[str, Any],
    stopped: kopf.DaemonStopped,
) -> None:
    try:
        parsed = parse_spec(meta, spec)
    except SpecError:
        return  # the change handler reported it; nothing runs until the spec changes
    if status.get("observedGeneration") != parsed.owner.generation:
        return  # the change handler has not finished this generation (a child's event woke us)
    if _failed_at(status, parsed.owner.generation):
        return  # a permanent problem (a rejected child, ...): same, until the spec changes
    try:
        # Children re-applied every period and on every change to one of them: a deleted
        # one comes back, a hand edit of what the operator owns is undone (apply.py); the
        # live state comes from the watches, so an unchanged child costs no request.
        kube = _live(memo, indices, on_change=False)

        def current() -> bool:  # `meta` is live: kopf updates it as events arrive
            return meta.get("generation") == parsed.owner.generation

        obs, _ = await _pass(kube, memo.config, parsed, status, on_change=False, current=current)
        new = _status(status, parsed, obs)
        # the watch keeps `status` current: no write if equal, nor for a replaced spec
        if current() and _changed(status, new):
            await kube.patch_status(KIND, parsed.owner.namespace, parsed.owner.name, new)
    except (KubeError, aiohttp.ClientError, OSError, RuntimeError) as exc:
        if stopped or memo.kube.closed:
            return  # shutting down: kopf runs the cleanup activity before it stops daemons
        if isinstance(exc, KubeError) and exc.status == reconcile.HTTP_UNPROCESSABLE:
            # A status this operator writes, refused: the CRD was changed after the start.
            logger.error("the API server refused the status (%s); %s", exc, UPGRADE_HINT)
            return
        logger.warning("status refresh failed, retrying next period: %s", exc)


def _watch_children(kind: str) -> None:
    """Index the operator's children of `kind` (live.py reads them from there) and wake
    their owner's daemon when one changes or goes."""
    group, version, plural = WATCHED[kind]
    selector = {"group": group, "version": version, "plural": plural, "labels": MANAGED}

    # Both async: kopf runs sync handlers in threads, and asyncio.Event is not thread-safe.
    @kopf.index(id=index_name(kind), **selector)
    async def index(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict:
        return {(namespace, name): dict(body)}

    @kopf.on.event(id=f"wake_on_{plural}", **selector)
    async def wake(namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
        event = memo.wakeups.get((namespace, labels.get(INSTANCE_LABEL)))
        if event is not None:
            event.set()


for _kind in WATCHED:
    _watch_children(_kind)


@kopf.on.delete(*RESOURCE)
async def delete_children(
    meta: kopf.Meta, memo: kopf.Memo, logger: kopf.Logger, **kwargs: Any
) -> None:
    # Owner references let the garbage collector do this too; deleting explicitly frees
    # the GPUs at once and works where no garbage collector runs.
    owner = Owner(meta["name"], meta["namespace"], meta["uid"], meta.get("generation", 1))
    deleted = await reconcile.delete_children(_live(memo, kwargs, on_change=True), owner)
    logger.info("deleted %s", ", ".join(f"{kind}/{name}" for kind, name in deleted) or "nothing")
