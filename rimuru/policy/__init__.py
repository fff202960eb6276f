"""The policy vocabulary both planes speak: the adjuster's tunables and the hotness ranking.

A leaf: stdlib only (no torch, numpy or grpc), so the operator's slim image, the control
plane and the allocator/adjuster can all import it. rimuru.policy_proto translates it to
and from the rimuru.v1 messages; nothing here knows the wire.
"""

from rimuru.policy.errors import InvalidPolicy
from rimuru.policy.ranking import FORMAT, HotnessRanking
from rimuru.policy.tunables import (
    ELASTIC_RULES,
    EXPERT_MATRICES,
    MODES,
    Tunables,
    check_pages_per_expert,
    check_pushable,
    mode_facts,
    parse_modes,
)

__all__ = [
    "ELASTIC_RULES",
    "EXPERT_MATRICES",
    "FORMAT",
    "MODES",
    "HotnessRanking",
    "InvalidPolicy",
    "Tunables",
    "check_pages_per_expert",
    "check_pushable",
    "mode_facts",
    "parse_modes",
]
