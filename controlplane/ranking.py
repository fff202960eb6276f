"""A stored hotness ranking: its reference (id, version, digest), its deployment and the
ranking itself (rimuru.policy.HotnessRanking, whose rules make a ranking the control plane
accepts one every data plane can apply)."""

from __future__ import annotations

from dataclasses import dataclass

from rimuru.controlplane.errors import InvalidArgument
from rimuru.controlplane.policy import RankingRef
from rimuru.policy import HotnessRanking

MAX_RANKING_ID_LEN = 128


@dataclass(frozen=True)
class Ranking:
    ref: RankingRef
    deployment: str
    hotness: HotnessRanking


def check_ranking_id(ranking_id: str) -> str:
    if not ranking_id or len(ranking_id) > MAX_RANKING_ID_LEN or not ranking_id.isprintable():
        raise InvalidArgument(
            "ranking_id",
            f"must be 1..{MAX_RANKING_ID_LEN} printable characters, e.g. 'offline-sharegpt'",
        )
    return ranking_id
