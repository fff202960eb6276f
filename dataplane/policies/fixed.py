"""fixed: the hottest experts filling `fixed_expert_share` of the pool, chosen at start-up
and never moved (classic fixed-ratio offloading); the rest are copied in when routed."""

from __future__ import annotations

from rimuru.dataplane.adjust.order import ExpertKey, hottest
from rimuru.policy import EXPERT_MATRICES, HotnessRanking, Tunables


class Fixed:
    name = "fixed"
    moves_boundary = False
    offloads = True
    prices_copies = False

    def start_residency(
        self, tunables: Tunables, ranking: HotnessRanking, num_free_expert_pages: int,
        fixed_share: float,
    ) -> list[ExpertKey]:  # fmt: skip
        """The globally hottest experts filling `fixed_share` of the free expert pages."""
        n = int(fixed_share * (num_free_expert_pages // EXPERT_MATRICES))
        total = ranking.num_layers * ranking.num_experts
        return list(hottest(min(n, total), ranking, [frozenset()] * ranking.num_layers))

    def least_kept(self, num_experts: int, tunables: Tunables) -> int | None:
        return None

    def loading_slots(self, num_experts: int, tunables: Tunables) -> int:
        return num_experts  # whatever the share leaves out of one layer

    def free_pages_at_start(self, tunables: Tunables) -> int:
        return 0

    def graphs_with_host_copies(self) -> bool:
        return False  # some expert is always offloaded: the host decides each step's copies
