"""resident: every expert lives in the pool; KV gets the rest (what vLLM does)."""

from __future__ import annotations

from rimuru.dataplane.adjust.order import ExpertKey
from rimuru.policy import HotnessRanking, Tunables


class Resident:
    name = "resident"
    moves_boundary = False
    offloads = False
    prices_copies = False

    def start_residency(
        self, tunables: Tunables, ranking: HotnessRanking, num_free_expert_pages: int,
        fixed_share: float,
    ) -> list[ExpertKey]:  # fmt: skip
        return [(layer, e) for layer in range(ranking.num_layers) for e in ranking.order[layer]]

    def least_kept(self, num_experts: int, tunables: Tunables) -> int | None:
        return num_experts

    def loading_slots(self, num_experts: int, tunables: Tunables) -> int:
        return 1  # never used: nothing is ever copied in

    def free_pages_at_start(self, tunables: Tunables) -> int:
        return 0

    def graphs_with_host_copies(self) -> bool:
        return True
