"""Protos <-> the control plane's dataclasses; the only module that knows both.

Reading a proto validates it: a message that converts is one the domain accepts, and a
bad field raises InvalidArgument naming it.
"""

from __future__ import annotations

from rimuru.controlplane.errors import InvalidArgument
from rimuru.controlplane.policy import Policy, RankingRef, Tunables
from rimuru.controlplane.ranking import LayerRanking, Ranking
from rimuru.controlplane.subscribers import Subscriber
from rimuru.v1 import control_pb2 as pb

MODE_TO_PROTO = {"resident": pb.MODE_RESIDENT, "fixed": pb.MODE_FIXED, "elastic": pb.MODE_ELASTIC}
MODE_FROM_PROTO = {v: k for k, v in MODE_TO_PROTO.items()}


def tunables_to_proto(t: Tunables) -> pb.Tunables:
    return pb.Tunables(
        mode=MODE_TO_PROTO[t.mode],
        expert_offload_limit=t.expert_offload_limit,
        shrink_threshold=t.shrink_threshold,
        grow_threshold=t.grow_threshold,
        max_grow_per_round=t.max_grow_per_round,
        pages_per_expert=t.pages_per_expert,
        online_hotness=t.online_hotness,
        copy_budget=t.copy_budget,
    )


def tunables_from_proto(msg: pb.Tunables) -> Tunables:
    if msg.mode not in MODE_FROM_PROTO:
        raise InvalidArgument(
            "tunables.mode",
            "must be MODE_RESIDENT, MODE_FIXED or MODE_ELASTIC; got "
            f"{pb.Mode.Name(msg.mode) if msg.mode in pb.Mode.values() else msg.mode}",
        )
    return Tunables(
        mode=MODE_FROM_PROTO[msg.mode],
        expert_offload_limit=msg.expert_offload_limit,
        shrink_threshold=msg.shrink_threshold,
        grow_threshold=msg.grow_threshold,
        max_grow_per_round=msg.max_grow_per_round,
        pages_per_expert=msg.pages_per_expert,
        online_hotness=msg.online_hotness,
        copy_budget=msg.copy_budget,
    )


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


def layer_to_proto(r: LayerRanking) -> pb.LayerRanking:
    return pb.LayerRanking(
        layer=r.layer, expert_ids=list(r.expert_ids), probabilities=list(r.probabilities)
    )


def layer_from_proto(msg: pb.LayerRanking) -> LayerRanking:
    return LayerRanking(msg.layer, tuple(msg.expert_ids), tuple(msg.probabilities))


def ranking_to_proto(r: Ranking) -> pb.Ranking:
    return pb.Ranking(
        ref=ranking_ref_to_proto(r.ref),
        deployment=r.deployment,
        layers=[layer_to_proto(layer) for layer in r.layers],
    )


def ranking_from_proto(msg: pb.Ranking) -> Ranking:
    return Ranking(
        ref=ranking_ref_from_proto(msg.ref),
        deployment=msg.deployment,
        layers=tuple(layer_from_proto(layer) for layer in msg.layers),
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
