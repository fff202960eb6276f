"""What the engine asks of a memory policy, in place of comparing its name.

Each answer is a pure function of the model's shapes and the tunables in force, so the
engine, `rimuru plan` and the graph planner ask the same object. A new policy is one new
file here and one line in `memory_policy`'s table.
"""

from __future__ import annotations

from typing import Protocol

from rimuru.dataplane.adjust.order import ExpertKey
from rimuru.policy import HotnessRanking, Tunables


class MemoryPolicy(Protocol):
    name: str  # the wire's Tunables.mode

    @property
    def moves_boundary(self) -> bool:
        """Whether the adjuster moves experts while serving (after every round, and inside
        one before a running request is preempted); the others keep start-up residency."""
        ...

    @property
    def offloads(self) -> bool:
        """Whether any expert may live on the host (copied in on the steps that route to it)."""
        ...

    @property
    def prices_copies(self) -> bool:
        """Whether evictions are priced by what their copies cost (the cost rule, payoff.py)."""
        ...

    def start_residency(
        self,
        tunables: Tunables,
        ranking: HotnessRanking,
        num_free_expert_pages: int,
        fixed_share: float,
    ) -> list[ExpertKey]:
        """The experts start-up puts in `num_free_expert_pages` pool pages, hottest first
        ("globally hottest": the adjuster's grow order, each layer nominating its hottest
        non-resident expert, the highest routing probability first). Raises ValueError
        when the policy cannot start in that many pages."""
        ...

    def least_kept(self, num_experts: int, tunables: Tunables) -> int | None:
        """The fewest experts a layer keeps resident while serving; None: whatever start-up
        chose (the residency never moves)."""
        ...

    def loading_slots(self, num_experts: int, tunables: Tunables) -> int:
        """Experts one loading buffer must hold: the most a layer may leave on the host."""
        ...

    def free_pages_at_start(self, tunables: Tunables) -> int:
        """Expert pages start-up residency leaves free (elastic keeps grow_threshold)."""
        ...

    def graphs_with_host_copies(self) -> bool:
        """Whether decode steps can be CUDA graphs when offloaded experts are copied by the
        host (resident never copies; elastic graphs only while every expert is resident;
        fixed never is)."""
        ...
