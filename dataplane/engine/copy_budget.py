"""The elastic copy budget on the engine's side: the copies its decode steps really make
(`CopyMeter`), and the admission cap (`AdmissionCap`, adjuster.max_batch_within_budget).

Why measure: the budget's model prices an offloaded expert by its share in the hotness
ranking. Where the ranking misjudges routing, the model does too: on the H200 (2026-11-30,
Fig. 4 at router skew 0, ranking profiled on 32 prompts) it expected ~10 copies per decode
step while the steps made ~54. So the adjuster counts the larger of the two; once the
measured copies pass the budget, nothing more is evicted and no request is admitted past
the batch now running, until experts come back and the copies fall.

The cap is asked every round that has requests waiting (every round at overload); the
model's part changes only when the boundary moves, the ranking or the start-up residency is
replaced, or the budget is pushed, so it is recomputed only then (0.4 ms at 48 layers x 128
experts with 16 offloaded per layer, on this CPU, against steps of 8-22 ms on the H200).
"""

from __future__ import annotations

from rimuru.dataplane.adjust.adjuster import Residency, max_batch_within_budget
from rimuru.dataplane.adjust.hotness import HotnessRanking
from rimuru.dataplane.adjust.tunables import Tunables
from rimuru.dataplane.engine.expert_manager import ExpertManager


class CopyMeter:
    """Expert copies per decode step, as a moving average over the last ~1/alpha steps.
    Steps with prompt tokens are left out: a prompt routes to nearly every expert, and the
    budget prices decode steps (prompts cost copies whatever the budget)."""

    def __init__(self, alpha: float = 0.1):
        self.alpha = alpha
        self.value = 0.0  # no decode step seen yet: the model alone decides

    def update(self, copies: int, decode_only: bool) -> None:
        if decode_only:
            self.value += self.alpha * (copies - self.value)


class AdmissionCap:
    def __init__(self, max_num_seqs: int, top_k: int):
        self.max_num_seqs = max_num_seqs
        self.top_k = top_k
        self._inputs: tuple | None = None  # what the cached model cap was computed from
        self._cap = max_num_seqs

    def limit(
        self,
        tunables: Tunables,
        ranking: HotnessRanking,
        experts: ExpertManager,
        counted: Residency,
        running: int,
        measured: float,
    ) -> int:
        """Running requests up to which waiting ones may be admitted: max_num_seqs unless
        elastic with a copy budget; then the model's cap, and no more than run now (at
        least 1) while the measured copies are over the budget."""
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
        if measured > tunables.copy_budget:
            return max(1, min(self._cap, running))
        return self._cap
