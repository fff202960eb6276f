"""Protos <-> the control plane's dataclasses; the only module that knows both.

Reading a proto validates it: a message that converts is one the domain accepts, and a
bad field raises InvalidPolicy (a tunables or ranking rule) or InvalidArgument naming it.
The tunables and ranking themselves convert in rimuru.policy_proto, which the data plane
uses too.
"""

from __future__ import annotations

from rimuru.controlplane.errors import InvalidArgument
from rimuru.controlplane.policy import Policy, RankingRef
from rimuru.controlplane.ranking import Ranking
from rimuru.controlplane.subscribers import Subscriber
from rimuru.policy import HotnessRanking, Tunables
from rimuru.policy_proto import (
    layers_to_proto,
    ranking_from_layers,
    tunables_from_proto,
    tunables_to_proto,
)
from rimuru.v1 import control_pb2 as pb


def ranking_ref_to_proto(ref: RankingRef) -> pb.RankingRef:
    return pb.RankingRef(id=ref.id, version=ref.version, digest=ref.digest)


def ranking_ref_from_proto(msg: pb.RankingRef) -> RankingRef:
    return RankingRef(id=msg.id, version=msg.version, digest=msg.digest)


def policy_to_proto(p: Policy) -> pb.Policy:
    msg = pb.Policy(
        deployment=p.deployment,
        version=p.version,
        tunables=tunables_to_proto(p.tunables),
        created_unix_seconds=p.created_unix_seconds,
        reason=p.reason,
    )
    if p.ranking is not None:
        msg.ranking.CopyFrom(ranking_ref_to_proto(p.ranking))
    return msg


def policy_from_proto(msg: pb.Policy) -> Policy:
    return Policy(
        deployment=msg.deployment,
        version=msg.version,
        tunables=tunables_from_proto(msg.tunables),
        ranking=ranking_ref_from_proto(msg.ranking) if msg.HasField("ranking") else None,
        created_unix_seconds=msg.created_unix_seconds,
        reason=msg.reason,
    )


def ranking_to_proto(r: Ranking) -> pb.Ranking:
    return pb.Ranking(
        ref=ranking_ref_to_proto(r.ref),
        deployment=r.deployment,
        layers=layers_to_proto(r.hotness),
    )


def ranking_from_proto(msg: pb.Ranking) -> Ranking:
    return Ranking(
        ref=ranking_ref_from_proto(msg.ref),
        deployment=msg.deployment,
        hotness=ranking_from_layers(msg.layers),
    )


def subscriber_to_proto(s: Subscriber) -> pb.Subscriber:
    return pb.Subscriber(
        node_id=s.node_id,
        deployment=s.deployment,
        applied_version=s.applied_version,
        pushed_version=s.pushed_version,
        last_error=s.last_error,
        last_nacked_version=s.last_nacked_version,
        connected=s.connected,
        last_seen_unix_seconds=s.last_seen_unix_seconds,
    )


def subscriber_from_proto(msg: pb.Subscriber) -> Subscriber:
    return Subscriber(
        node_id=msg.node_id,
        deployment=msg.deployment,
        applied_version=msg.applied_version,
        pushed_version=msg.pushed_version,
        last_error=msg.last_error,
        last_nacked_version=msg.last_nacked_version,
        connected=msg.connected,
        last_seen_unix_seconds=msg.last_seen_unix_seconds,
    )


def check_push_fits(
    deployment: str,
    tunables: Tunables,
    ranking: HotnessRanking | None,
    max_bytes: int,
    field_name: str,
) -> None:
    """InvalidArgument unless a push of this policy and ranking fits `max_bytes` (a data
    plane's receive limit). Measured with the largest version numbers, a 64-character
    nonce and reason: exact for everything but those, and never an underestimate."""
    largest = 2**64 - 1
    text = "x" * 64
    ref = RankingRef(text, largest, text)
    policy = Policy(deployment, largest, tunables, ref if ranking else None, largest, text)
    update = pb.PolicyUpdate(version=largest, nonce=text, policy=policy_to_proto(policy))
    if ranking is not None:
        update.ranking.CopyFrom(ranking_to_proto(Ranking(ref, deployment, ranking)))
    size = update.ByteSize()
    if size > max_bytes:
        raise InvalidArgument(
            field_name,
            f"its push to the data planes would be {size} bytes, over the {max_bytes}-byte "
            "message limit both planes share (rimuru.rpc.MAX_MESSAGE_BYTES); nothing stored",
        )
