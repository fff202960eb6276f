"""Make the control plane hold the RimuruDeployment's policy, and see who applied it.

Blocking (the control-plane client is synchronous gRPC): the handlers run these in a
worker thread so kopf's event loop never waits on the network.

The RimuruDeployment is the source of truth for the tunables: a version set by hand
(`rimuru policy set`) with other tunables is replaced at the next sync. Rankings are
different: with online hotness the control plane replaces the ranking itself, so the
ConfigMap's ranking is uploaded only when its content changed since the last upload
(or when the control plane has no ranking at all).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rimuru.controlplane.client import ControlPlaneClient
from rimuru.controlplane.errors import NotFound, VersionConflict
from rimuru.controlplane.policy import Policy
from rimuru.policy import HotnessRanking, Tunables

# Compare-and-set attempts when online hotness adds versions between our read and write.
MAX_CAS_ATTEMPTS = 3


@dataclass(frozen=True)
class RankingUpload:
    ranking_id: str
    hotness: HotnessRanking
    digest: str


@dataclass(frozen=True)
class PolicyState:
    """What the control plane says about one deployment, for the status."""

    desired_version: int  # the control plane's current version
    applied_version: int  # lowest version ACKed by the connected data planes; 0 = none
    num_subscribers: int  # connected data planes
    num_synced: int  # connected data planes that applied desired_version
    last_error: str  # a connected data plane's NACK of desired_version, if any
    ranking_digest: str  # digest of the ranking this operator last uploaded ("" = none)
    # The control plane holds spec.policy's tunables. False while a spec change is not
    # pushed yet (the control plane was down when it came; the periodic check never
    # overwrites): the versions above are then an older policy's, not the spec's.
    spec_pushed: bool


def parse_ranking(config_map_name: str, key: str, text: str) -> RankingUpload:
    """A ranking file (format rimuru.hotness/v1) from a ConfigMap; ValueError if invalid."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"ConfigMap {config_map_name} key {key}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"ConfigMap {config_map_name} key {key}: want a JSON object")
    try:
        hotness = HotnessRanking.from_json(data)
    except ValueError as exc:
        raise ValueError(f"ConfigMap {config_map_name} key {key}: {exc}") from exc
    return RankingUpload(f"configmap/{config_map_name}/{key}", hotness, hotness.digest())


def _current(client: ControlPlaneClient, deployment: str) -> Policy | None:
    try:
        return client.get_policy(deployment)
    except NotFound:
        return None


def sync_policy(
    client: ControlPlaneClient,
    deployment: str,
    tunables: Tunables,
    ranking: RankingUpload | None,
    uploaded_digest: str,
    *,
    overwrite: bool,
) -> tuple[Policy, str]:
    """Push what differs; returns (current policy, digest of the uploaded ranking).

    overwrite=True (a spec change): the tunables replace whatever the control plane has.
    overwrite=False (the periodic check): only a policy the control plane lost is
    restored, with compare-and-set on "no policy yet"; a periodic check that read an
    older spec must never undo a change that a spec-change handler has just pushed.
    """
    current = _current(client, deployment)
    for attempt in range(MAX_CAS_ATTEMPTS):
        if current is not None and (current.tunables == tunables or not overwrite):
            break
        expected = 0 if current is None else current.version
        try:
            current = client.set_policy(deployment, tunables, expected_version=expected)
        except VersionConflict:
            current = _current(client, deployment)
            if attempt == MAX_CAS_ATTEMPTS - 1 or current is None:
                raise
    if current is None:
        raise VersionConflict(f"{deployment}: policy kept changing while being set")
    if ranking is not None and (current.ranking is None or ranking.digest != uploaded_digest):
        current = client.upload_ranking(deployment, ranking.ranking_id, ranking.hotness)
        uploaded_digest = ranking.digest
    return current, uploaded_digest


def observe_policy(
    client: ControlPlaneClient, deployment: str, tunables: Tunables, uploaded_digest: str
) -> PolicyState:
    """What the control plane holds and who applied it; `tunables` are the spec's."""
    policy = _current(client, deployment)
    desired = 0 if policy is None else policy.version
    connected = [s for s in client.list_subscribers(deployment) if s.connected]
    synced = [s for s in connected if s.applied_version == desired]
    errors = [s.last_error for s in connected if s.last_error and s.last_nacked_version == desired]
    return PolicyState(
        desired_version=desired,
        applied_version=min((s.applied_version for s in connected), default=0),
        num_subscribers=len(connected),
        num_synced=len(synced),
        last_error=errors[0] if errors else "",
        ranking_digest=uploaded_digest,
        spec_pushed=policy is not None and policy.tunables == tunables,
    )
