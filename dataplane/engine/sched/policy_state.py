"""The memory policy in force: tunables and hotness ranking.

One mutable object that the parts which act on the policy are given (the boundary, the
engine's checks) and that only a live push (live_policy.py) replaces, both halves at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from rimuru.policy import HotnessRanking, Tunables


@dataclass
class PolicyState:
    tunables: Tunables
    ranking: HotnessRanking
