"""Moving the boundary: the adjuster's decision, reserved in the allocator and applied to the
expert manager. The engine calls it after every scheduling round (the Rimuru paper's
adjuster) and, in elastic mode, inside a round before a running request would be preempted
(`ElasticBoundary`: the batch the copy budget prices, and the scheduler's two hooks,
make_room and admit_limit).

Callers guarantee that the previous forward — the last that could read an evicted expert —
has completed, so evicted pages are free at once (`last_step` is that forward's step).
"""

from __future__ import annotations

from rimuru.dataplane.adjust.adjuster import (
    AdjusterDecision,
    ChangeList,
    Residency,
    StepShape,
    decide,
    reserve,
)
from rimuru.dataplane.engine.copy_budget import CopyControl
from rimuru.dataplane.engine.expert_manager import ExpertManager
from rimuru.dataplane.engine.kv_cache import KVCacheManager
from rimuru.dataplane.engine.policy_state import PolicyState
from rimuru.dataplane.engine.scheduler import RoundState
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import PageType
from rimuru.policy import HotnessRanking, Tunables


def move_boundary(
    kv_pages_short: int,
    allocator: PageAllocator,
    kv: KVCacheManager,
    experts: ExpertManager,
    ranking: HotnessRanking,
    tunables: Tunables,
    last_step: int,
    *,
    evict_only: bool = False,
    step: StepShape | None = None,  # for tunables.copy_budget
    counted: Residency | None = None,  # the experts the budget prices (adjuster.decide)
    measured: float = 0.0,  # copies per decode step lately (adjuster.decide)
) -> ChangeList:
    decision = decide(
        kv.shortfall_in_expert_pages(kv_pages_short),
        allocator.num_free(PageType.EXPERT),
        ranking,
        experts.resident_sets(),
        tunables,
        step,
        counted,
        measured,
    )
    if evict_only:
        decision = AdjusterDecision(evict=decision.evict)
    changes = reserve(decision, allocator, tunables)
    experts.apply(changes, last_step=last_step)
    return changes


class ElasticBoundary:
    """The engine's side of moving the boundary, under the policy in force (`policy`, which
    a live push replaces)."""

    def __init__(
        self,
        policy: PolicyState,
        allocator: PageAllocator,
        kv: KVCacheManager,
        experts: ExpertManager,
        copy_control: CopyControl,
        max_num_seqs: int,
        top_k: int,
    ):
        self.policy = policy
        self.allocator = allocator
        self.kv = kv
        self.experts = experts
        self.copy_control = copy_control
        self.max_num_seqs = max_num_seqs
        self.top_k = top_k

    def move(
        self,
        kv_pages_short: int,
        round: RoundState,
        evict_only: bool = False,
        apply_copy_budget: bool = True,
    ) -> ChangeList:
        """After (or, `evict_only`, inside) the scheduling round `round`: its previous step's
        forward, the last that could read an evicted expert, has completed."""
        # The copy budget's decode step: one token per running request, and one more after
        # a round that left requests waiting (the room is for the next of them, and the
        # admission cap must then let it in). Not applied with nothing running (else a
        # waiting request the budget keeps out would wait forever) nor when asked (a lone
        # request short of pages, scheduler.py).
        step = None
        if apply_copy_budget and round.num_running:
            admitting = not evict_only and round.num_waiting > 0
            batch = min(round.num_running + admitting, self.max_num_seqs)
            step = StepShape(batch, self.top_k)
        return move_boundary(
            kv_pages_short, self.allocator, self.kv, self.experts, self.policy.ranking,
            self.policy.tunables, round.step - 1, evict_only=evict_only, step=step,
            counted=self.copy_control.start_resident, measured=self.copy_control.measured,
        )  # fmt: skip

    def admit_limit(self, round: RoundState) -> int:
        """Elastic with a copy budget: the batch up to which the experts offloaded now stay
        within it (copy_budget.py); else max_num_seqs."""
        return self.copy_control.limit(
            self.policy.tunables, self.policy.ranking, self.experts, round.num_running
        )

    def make_room(self, kv_pages_lacking: int, round: RoundState) -> int:
        """Elastic, inside a scheduling round: evict experts now so that a running request
        is not preempted; returns the KV pages gained (0 once expert_offload_limit or the
        copy budget binds). A lone running request: the budget yields."""
        before = self.allocator.num_free(PageType.KV)
        lone = round.num_running == 1
        self.move(kv_pages_lacking, round, evict_only=True, apply_copy_budget=not lone)
        return self.allocator.num_free(PageType.KV) - before
