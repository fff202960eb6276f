"""elastic (the Rimuru paper's policy) under the cost rule, its default: the adjuster moves
the expert/KV boundary every round, evicting an expert only while the batch its pages buy
is worth more than the copies it will cost (payoff.py)."""

from __future__ import annotations

from rimuru.dataplane.adjust.order import ExpertKey, hottest
from rimuru.policy import EXPERT_MATRICES, HotnessRanking, Tunables


class Elastic:
    name = "elastic"
    moves_boundary = True
    offloads = True
    prices_copies = True

    def start_residency(
        self, tunables: Tunables, ranking: HotnessRanking, num_free_expert_pages: int,
        fixed_share: float,
    ) -> list[ExpertKey]:  # fmt: skip
        """Every layer's hottest E - expert_offload_limit (the adjuster never offloads more),
        then the globally hottest of the rest while grow_threshold pages stay free; the
        adjuster moves the boundary from there."""
        num_layers, num_experts = ranking.num_layers, ranking.num_experts
        capacity = num_free_expert_pages // EXPERT_MATRICES
        spare = self.free_pages_at_start(tunables)
        n = max(0, (num_free_expert_pages - spare) // EXPERT_MATRICES)
        keep = self.least_kept(num_experts, tunables)
        chosen = [(layer, e) for layer in range(num_layers) for e in ranking.order[layer][:keep]]
        if len(chosen) > capacity:
            raise ValueError(
                f"the pool holds {capacity} experts but elastic mode keeps at least {keep} per "
                f"layer resident ({len(chosen)} in all, expert_offload_limit="
                f"{tunables.expert_offload_limit}): raise the memory budget or "
                f"expert_offload_limit"
            )
        partial = [frozenset(ranking.order[layer][:keep]) for layer in range(num_layers)]
        total = num_layers * num_experts
        return [*chosen, *hottest(max(0, min(n, total) - len(chosen)), ranking, partial)]

    def least_kept(self, num_experts: int, tunables: Tunables) -> int | None:
        return max(0, num_experts - tunables.expert_offload_limit)

    def loading_slots(self, num_experts: int, tunables: Tunables) -> int:
        return max(1, min(num_experts, tunables.expert_offload_limit))

    def free_pages_at_start(self, tunables: Tunables) -> int:
        return tunables.grow_threshold

    def graphs_with_host_copies(self) -> bool:
        return True  # while every expert is resident; graph_setup checks that it is
