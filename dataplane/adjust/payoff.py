"""Does an eviction pay? The cost-aware elastic rule (`Tunables.elastic_rule = "cost"`).

The paper's rule evicts whenever KV pages run short, up to `expert_offload_limit` per
layer; where routing is near uniform every offloaded expert is copied in nearly every
decode step, and elastic then serves slower than keeping every expert (docs/benchmarks.md).
This rule prices each eviction first, from measured costs:

    a decode step of B sequences that copies c experts in takes
        T(B, c) = fixed + per_seq * B + per_copy * c                   (StepCost)
    output rate = B / T(B, c)

Offloading one more expert frees `pages_per_expert` expert pages: room for

    dB = pages_per_expert / pages_per_request

more running requests (`CostView.pages_per_request`: what a running request holds, in expert
pages), and it adds dc = route_probability(p, B + dB) expected copies per step (p: the
expert's routing share). Only where requests wait, or a running one would be preempted
(`CostView.demand`), do the pages buy batch; otherwise an eviction buys nothing. It pays iff

    (B + dB) / T(B + dB, c + dc) > B / T(B, c)
    <=>  dB * (fixed + per_copy * c) > B * per_copy * dc            (per_seq cancels)

and, with a TPOT SLO, T(B + dB, c + dc) stays within it and the decode steps measured
lately do too (past it, nothing more is evicted and the engine admits no one more while
experts are offloaded, so pages return to them). Evictions are priced coldest first,
each on the batch and copies the ones before it left, so the first that does not pay stops
the round: the ones after it are hotter. Worked example (qwen3-30b-a3b's shapes): an expert
copy of 9.4 MB at ~50 GB/s is per_copy ~0.19 ms; take a 25 ms step; a request of ~500
tokens holds ~15 expert pages, so one eviction (3 pages) buys dB = 0.2. At B = 100 and
uniform routing (dc ~ 1) it does not pay (0.2 * 25 < 100 * 0.19); at B = 10 it does
(0.2 * 25 > 10 * 0.19), which is where the paper's gains come from: weights that just fit.

Pure: no torch, no clock. The engine measures the StepCost (engine/step_cost.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from rimuru.policy import HotnessRanking


@dataclass(frozen=True)
class StepCost:
    """A decode step's time in seconds: fixed + per_seq * B + per_copy * copies."""

    fixed: float
    per_seq: float
    per_copy: float

    def __post_init__(self) -> None:
        if not (self.fixed > 0 and self.per_seq >= 0 and self.per_copy >= 0):
            raise ValueError(f"a step cost needs fixed > 0 and the rest >= 0; got {self}")

    def seconds(self, batch: float, copies: float) -> float:
        return self.fixed + self.per_seq * batch + self.per_copy * copies


@dataclass(frozen=True)
class CostView:
    """What the cost rule sees of the engine now."""

    cost: StepCost
    batch: int  # B: the decode batch the evictions are for (running, plus one admitting)
    copies: float  # c: copies per decode step now (the larger of expected and measured)
    batch_per_eviction: float  # dB: pages_per_expert / what a running request holds
    demand: bool  # requests wait or a running one lacks pages: more pages buy batch
    tpot_slo_s: float | None = None  # a decode step may take at most this long
    # Routing shares to price copies by (recent routing, engine/live_routing.py); None: the
    # ranking's that orders the evictions.
    prices: HotnessRanking | None = None
    recent_step_s: float = 0.0  # decode steps' measured time lately (0: none seen)

    @property
    def over_slo(self) -> bool:
        """Decode steps already take longer than the TPOT SLO."""
        return self.tpot_slo_s is not None and self.recent_step_s > self.tpot_slo_s

    def __post_init__(self) -> None:
        if self.batch < 0 or self.copies < 0 or self.batch_per_eviction < 0:
            raise ValueError(f"batch, copies and batch_per_eviction must be >= 0; got {self}")


def eviction_pays(view: CostView, done: int, extra_copies: float, dc: float) -> bool:
    """Whether one more eviction, costing `dc` copies per step, pays after `done` earlier
    ones this round added `extra_copies` copies (module docstring)."""
    if not view.demand or view.over_slo:
        return False
    cost, db = view.cost, view.batch_per_eviction
    b = view.batch + done * db
    c = view.copies + extra_copies
    if view.tpot_slo_s is not None and cost.seconds(b + db, c + dc) > view.tpot_slo_s:
        return False
    return db * (cost.fixed + cost.per_copy * c) > max(b, 1.0) * cost.per_copy * dc
