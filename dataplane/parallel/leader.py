"""Rank 0's side of tensor parallelism: one scheduler and one adjuster decide, and every
step that runs a forward first tells the other ranks what changed and what to run.

The engine calls `send_step` once the step's schedule and residency are final (after
make_room and the adjuster, before the forward); the forward's all-reduces then meet the
other ranks' in the same step. `close` ends the engine on every rank and checks their
reports: same number of forwards, same expert page table at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rimuru.dataplane.adjust.adjuster import ChangeList
from rimuru.dataplane.engine.experts.residency_table import ResidencyTable
from rimuru.dataplane.engine.sched.round_moves import RoundMoves, net_changes
from rimuru.dataplane.engine.step_forward import StepBatch
from rimuru.dataplane.parallel.block_tables import BlockTableSender
from rimuru.dataplane.parallel.groups import RankGroups
from rimuru.dataplane.parallel.messages import RankReport, StepMessage, StopEngine
from rimuru.dataplane.parallel.rank import RankLink
from rimuru.dataplane.parallel.residency import table_digest


class StepLeader(RankLink):
    def __init__(self, groups: RankGroups):
        super().__init__(groups)
        self._unsent: list[ChangeList] = []  # moves since the last step message, in order
        self._tables = BlockTableSender()
        self.num_steps = 0
        self.residency_digest = ""
        self.reports: list[RankReport] = []  # the followers', once closed
        self.closed = False
        self.after_close: Callable[[], None] | None = None  # an engine owning its workers
        # Kills the other ranks (their workers set it): for a close while they may be
        # inside a forward's collective, which rank 0 will never join now.
        self.abandon: Callable[[], None] | None = None
        self.in_forward = False  # a step was sent and rank 0's forward has not finished

    def moved(self, moves: RoundMoves) -> None:
        """Every round's moves, those of rounds that run no forward too: the next step
        message carries them all, netted."""
        self._unsent += moves.changes

    def send_step(self, step: int, scheduled, batch: StepBatch, residency: ResidencyTable) -> None:
        """scheduled: the scheduler's ScheduledRequests, in `batch`'s slice order."""
        if self.closed:
            raise RuntimeError("this engine was closed: its other ranks are gone")
        changes, self._unsent = net_changes(self._unsent), []
        self.residency_digest = table_digest(residency.table.host)
        blocks = self._tables.delta([s.request for s in scheduled])
        # the followers run the forward only: no Request objects, no sampling
        bare = replace(batch, sample_requests=[], slices=BlockTableSender.bare(batch.slices))
        loading = residency.loading_slots  # device copy-in: the followers take rank 0's
        slots = tuple(loading.slots) if loading is not None else ()
        self.groups.send(StepMessage(step, changes, self.residency_digest, bare, blocks, slots))
        self.num_steps += 1
        self.in_forward = True

    def forward_done(self) -> None:
        self.in_forward = False

    def close(self) -> None:
        """Stop the engine on every rank and check their reports. After rank 0 failed inside
        a forward the other ranks wait in its collectives: they are killed instead (a stop
        message would wait for them until the collective timed out, minutes later)."""
        if self.closed:
            return
        self.closed = True
        if self.in_forward:
            if self.abandon is not None:
                self.abandon()
            raise RuntimeError(
                "rank 0 failed inside a tensor-parallel forward: the other ranks were stopped"
            )
        try:
            self.groups.send(StopEngine())
            reports = self.groups.gather(None) or []
            self.reports = [r for r in reports[1:] if r is not None]
            for r in self.reports:
                if (r.num_steps, r.residency_digest) != (self.num_steps, self.residency_digest):
                    raise RuntimeError(
                        f"tensor-parallel rank {r.rank} diverged from rank 0: {r.num_steps} "
                        f"forwards and residency {r.residency_digest}, rank 0 "
                        f"{self.num_steps} and {self.residency_digest}"
                    )
        finally:
            if self.after_close is not None:
                self.after_close()
