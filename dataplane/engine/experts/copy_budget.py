"""The elastic copy budget on the engine's side (`CopyControl`): which experts it prices
(those resident at start-up), the copies decode steps really make (`CopyMeter`), and the
admission cap (adjuster.max_batch_within_budget, cached).

Why measure: the budget's model prices an offloaded expert by its share in the hotness
ranking. Where the ranking misjudges routing, the model does too (it has expected a fraction
of the copies per decode step that the steps made: docs/benchmarks.md). So the adjuster
counts the larger of the two; once the measured copies reach the budget, nothing more is
evicted and no request is admitted (the batch drains as requests finish), until experts
come back and the copies fall.

The meter cannot tell whose copies it counts, so it is used only while it measures the
adjuster's own evictions: when start-up residency held every expert (else the copies of
experts that never fit would hold admission for good; the model alone decides then), and
it reads 0 whenever no expert resident at start-up is offloaded, when the batch empties,
and when the budget is changed (so it cannot hold a later batch for an earlier one's copies).

The cap is asked every round that has requests waiting (every round at overload); the
model's part changes only when the boundary moves, the ranking or the start-up residency is
replaced, or the budget is pushed, so it is recomputed only then (it walks every layer's
offloaded experts: a millisecond on a host at 48 layers x 128 experts, a fair share of a
decode step).
"""

from __future__ import annotations

from rimuru.dataplane.adjust.adjuster import Residency, max_batch_within_budget
from rimuru.dataplane.engine.experts.counters import ExpertCounters
from rimuru.dataplane.engine.experts.residency_table import ResidencyTable
from rimuru.dataplane.policies import memory_policy
from rimuru.policy import HotnessRanking, Tunables


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


class CopyControl:
    def __init__(self, max_num_seqs: int, top_k: int):
        self.max_num_seqs, self.top_k = max_num_seqs, top_k
        self.meter = CopyMeter()
        self.start_resident: Residency | None = None  # the experts the budget prices
        self._meter_on = False
        self._copies_before = 0
        self._cap_key: tuple | None = None  # (residency version, budget, ranking) of _cap
        self._cap = max_num_seqs

    def reset(self, start_resident: Residency, num_experts: int) -> None:
        """After start-up residency is (re)chosen."""
        self.start_resident = start_resident
        self._meter_on = all(len(r) == num_experts for r in start_resident)
        self.meter.value = 0.0
        self._cap_key = None

    def budget_changed(self) -> None:
        """What was measured belongs to batches the old budget admitted."""
        self.meter.value = 0.0

    @property
    def measured(self) -> float:
        return self.meter.value if self._meter_on else 0.0

    def begin_step(self, counters: ExpertCounters) -> None:
        # host copies are counted inside the forward, device copy-in after it
        self._copies_before = counters.buffer_copies

    def end_step(
        self,
        counters: ExpertCounters,
        residency: ResidencyTable,
        decode_only: bool,
        idle: bool,
        tunables: Tunables,
    ) -> int:
        """After the step's forward finished and the device's counters were synced;
        `decode_only`: the step had one new token per sequence. `idle`: nothing runs now; what was
        measured belonged to a batch that is gone (a server does not step while idle, so the
        next burst would start held). Returns the step's expert copies. Without a budget or
        the cost rule the meter is left alone."""
        copies = counters.buffer_copies - self._copies_before
        policy = memory_policy(tunables)
        priced = tunables.copy_budget > 0 or policy.prices_copies
        if not policy.moves_boundary or not priced or not self._meter_on:
            return copies
        back = all(
            len(r) == len(s) for r, s in zip(residency.resident, self.start_resident, strict=True)
        )
        if idle or back:  # back: every expert (start-up held them all)
            self.meter.value = 0.0
            return copies
        self.meter.update(copies, decode_only)
        return copies

    def limit(
        self, tunables: Tunables, ranking: HotnessRanking, residency: ResidencyTable, running: int
    ) -> int:
        """Running requests up to which waiting ones may be admitted: max_num_seqs unless
        elastic with a copy budget; then the model's cap, and no one more than runs now (at
        least 1: with nothing running one request is let in) while the measured copies are at
        or past the budget."""
        if not memory_policy(tunables).moves_boundary or tunables.copy_budget <= 0:
            return self.max_num_seqs
        key = (residency.residency_version, tunables.copy_budget, ranking)
        cached = self._cap_key
        # The ranking by identity: a new policy brings a new object, and comparing two
        # rankings' contents every round would cost more than the lookup it saves.
        if cached is None or cached[:2] != key[:2] or cached[2] is not ranking:
            self._cap = max_batch_within_budget(
                ranking, residency.resident_sets(), self.top_k, tunables.copy_budget,
                self.max_num_seqs, self.start_resident,
            )  # fmt: skip
            self._cap_key = key
        if self.measured >= tunables.copy_budget:
            return max(1, min(self._cap, running))
        return self._cap
