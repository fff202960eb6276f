"""What the engine asks of rank 0's tensor-parallel link, as a Protocol: dataplane/parallel/
implements it (StepLeader) and builds the engine with one, so the engine never imports the
layer above it. None on one device. (What loading asks of every rank's link is
startup/loaded_model.py's RankLink.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rimuru.dataplane.engine.experts.residency_table import ResidencyTable
    from rimuru.dataplane.engine.sched.round_moves import RoundMoves
    from rimuru.dataplane.engine.startup.budget import MemoryPlan
    from rimuru.dataplane.engine.step_forward import StepBatch


class StepLeader(Protocol):
    """Rank 0's: the plan every rank's pool agrees on, and each step sent to the others
    before its forward (their residency and batch follow rank 0's)."""

    def agree_plan(self, plan: MemoryPlan) -> MemoryPlan: ...

    def moved(self, moves: RoundMoves) -> None: ...

    def send_step(
        self, step: int, scheduled, batch: StepBatch, residency: ResidencyTable
    ) -> None: ...

    def forward_done(self) -> None: ...

    def close(self) -> None: ...
