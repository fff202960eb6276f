"""Moving the boundary: the adjuster's decision, reserved in the allocator and applied to the
expert manager. The engine calls it after every scheduling round (the Rimuru paper's
adjuster) and, in elastic mode, inside a round before a running request would be preempted.

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
from rimuru.dataplane.adjust.hotness import HotnessRanking
from rimuru.dataplane.adjust.tunables import Tunables
from rimuru.dataplane.engine.expert_manager import ExpertManager
from rimuru.dataplane.engine.kv_cache import KVCacheManager
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import PageType


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
