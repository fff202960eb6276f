"""The elastic copy budget's admission cap (adjuster.max_batch_within_budget), cached.

The scheduler asks for it every round that has requests waiting, which at overload is every
round; it changes only when the boundary moves, the ranking or the start-up residency is
replaced, or the budget is pushed, so it is recomputed only then (0.4 ms at 48 layers x 128
experts with 16 offloaded per layer, on this CPU, against steps of 8-22 ms on the H200).
"""

from __future__ import annotations

from rimuru.dataplane.adjust.adjuster import Residency, max_batch_within_budget
from rimuru.dataplane.adjust.hotness import HotnessRanking
from rimuru.dataplane.adjust.tunables import Tunables
from rimuru.dataplane.engine.expert_manager import ExpertManager


class AdmissionCap:
    def __init__(self, max_num_seqs: int, top_k: int):
        self.max_num_seqs = max_num_seqs
        self.top_k = top_k
        self._inputs: tuple | None = None  # what the cached cap was computed from
        self._cap = max_num_seqs

    def limit(
        self,
        tunables: Tunables,
        ranking: HotnessRanking,
        experts: ExpertManager,
        counted: Residency,
    ) -> int:
        """Running requests up to which waiting ones may be admitted: max_num_seqs unless
        elastic with a copy budget."""
        if tunables.mode != "elastic" or tunables.copy_budget <= 0:
            return self.max_num_seqs
        inputs = (experts.residency_version, tunables.copy_budget, ranking, counted)
        cached = self._inputs
        if (
            cached is None
            or cached[:2] != inputs[:2]
            or any(a is not b for a, b in zip(cached[2:], inputs[2:], strict=True))
        ):
            self._cap = max_batch_within_budget(
                ranking, experts.resident_sets(), self.top_k, tunables.copy_budget,
                self.max_num_seqs, counted,
            )  # fmt: skip
            self._inputs = inputs
        return self._cap
