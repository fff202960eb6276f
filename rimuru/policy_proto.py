"""rimuru.policy <-> the rimuru.v1 control messages: the one converter both planes use.

Reading a message validates it: what converts is a valid Tunables or HotnessRanking, and
a bad field raises InvalidPolicy naming it as the proto spells it (the control plane
answers INVALID_ARGUMENT with it, the data plane NACKs the version with it).
"""

from __future__ import annotations

from collections.abc import Sequence

from rimuru.policy import (
    EXPERT_MATRICES,
    HotnessRanking,
    InvalidPolicy,
    Tunables,
    check_pages_per_expert,
)
from rimuru.v1 import control_pb2 as pb

MODE_TO_PROTO = {"resident": pb.MODE_RESIDENT, "fixed": pb.MODE_FIXED, "elastic": pb.MODE_ELASTIC}
MODE_FROM_PROTO = {v: k for k, v in MODE_TO_PROTO.items()}
RULE_TO_PROTO = {"cost": pb.ELASTIC_RULE_COST, "paper": pb.ELASTIC_RULE_PAPER}
RULE_FROM_PROTO = {v: k for k, v in RULE_TO_PROTO.items()}


def tunables_to_proto(t: Tunables) -> pb.Tunables:
    return pb.Tunables(
        mode=MODE_TO_PROTO[t.mode],
        expert_offload_limit=t.expert_offload_limit,
        shrink_threshold=t.shrink_threshold,
        grow_threshold=t.grow_threshold,
        max_grow_per_round=t.max_grow_per_round,
        # Retired (field 6), but data planes older than that refuse 0: send the one value.
        pages_per_expert=EXPERT_MATRICES,
        online_hotness=t.online_hotness,
        copy_budget=t.copy_budget,
        elastic_rule=RULE_TO_PROTO[t.elastic_rule],
        tpot_slo_ms=t.tpot_slo_ms,
    )


def tunables_from_proto(msg: pb.Tunables) -> Tunables:
    if msg.mode not in MODE_FROM_PROTO:
        raise InvalidPolicy(
            "tunables.mode",
            "must be MODE_RESIDENT, MODE_FIXED or MODE_ELASTIC; got "
            f"{pb.Mode.Name(msg.mode) if msg.mode in pb.Mode.values() else msg.mode}",
        )
    if msg.elastic_rule not in RULE_FROM_PROTO:
        raise InvalidPolicy(
            "tunables.elastic_rule",
            f"must be ELASTIC_RULE_COST or ELASTIC_RULE_PAPER; got {msg.elastic_rule}",
        )
    if msg.pages_per_expert:  # 0 = unset: a client that leaves the retired field out
        check_pages_per_expert(msg.pages_per_expert)
    return Tunables(
        mode=MODE_FROM_PROTO[msg.mode],
        expert_offload_limit=msg.expert_offload_limit,
        shrink_threshold=msg.shrink_threshold,
        grow_threshold=msg.grow_threshold,
        max_grow_per_round=msg.max_grow_per_round,
        online_hotness=msg.online_hotness,
        copy_budget=msg.copy_budget,
        elastic_rule=RULE_FROM_PROTO[msg.elastic_rule],
        tpot_slo_ms=msg.tpot_slo_ms,
    )


def layers_to_proto(ranking: HotnessRanking) -> list[pb.LayerRanking]:
    return [
        pb.LayerRanking(layer=layer, expert_ids=list(order), probabilities=list(prob))
        for layer, (order, prob) in enumerate(zip(ranking.order, ranking.prob, strict=True))
    ]


def ranking_from_layers(layers: Sequence[pb.LayerRanking], source: str = "") -> HotnessRanking:
    """The wire numbers each layer; any order of them converts, each number once."""
    ordered = sorted(layers, key=lambda r: r.layer)
    if [r.layer for r in ordered] != list(range(len(ordered))):
        raise InvalidPolicy(
            "layers.layer", f"layers must be 0..{len(ordered) - 1}, each exactly once"
        )
    return HotnessRanking(
        tuple(tuple(int(e) for e in r.expert_ids) for r in ordered),
        tuple(tuple(float(p) for p in r.probabilities) for r in ordered),
        source,
    )
