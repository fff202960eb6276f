"""Does an eviction pay? The cost-aware elastic rule (`Tunables.elastic_rule = "cost"`).

The paper's rule evicts whenever KV pages run short, up to `expert_offload_limit` per
layer; where routing is near uniform every offloaded expert is copied in nearly every
step, and elastic then serves slower than keeping every expert (docs/benchmarks.md).
This rule prices each eviction first, from measured costs:

    a step of B running requests that copies c experts in takes
        T(B, c) = fixed + per_seq * B + per_copy * c                   (StepCost)
    output rate = B / T(B, c)

Offloading one more expert frees `EXPERT_MATRICES` (3) expert pages: room for

    dB = EXPERT_MATRICES / pages_per_request

more running requests (`CostView.pages_per_request`: what a running request holds, in expert
pages). Only where requests wait, or a running one would be preempted (`CostView.demand`),
do the pages buy batch; otherwise an eviction buys nothing. It pays iff

    (B + dB) / T(B + dB, c + dc) > B / T(B, c)
    <=>  dB * (fixed + per_copy * c) > B * per_copy * dc            (per_seq cancels)

c and dc are copies per step over the steps the engine runs (`StepMix`): a decode-only step
routes one token per running request, a mixed one also the prompt chunks scheduled with
them, which route to nearly every expert. The eviction adds (p: the expert's routing share,
K: top-k, w: the share of steps that carry prompt tokens, X: the prompt tokens such a step
carries beyond one per request, both measured by engine/experts/step_cost.py)

    dc = (1 - w) * q(B + dB) + w * q(B + dB + X),   q(N) = 1 - (1 - min(1, K p))^N

(adjuster.route_probability). Not q at the mean tokens per step: q is concave in N, so one
step of 500 tokens and one of 20 cost less than two of 260. T is fitted to decode-only
steps and leaves the prompts' time out on purpose: with requests waiting, every request
admitted is prefilled once, so the prompt tokens per step grow with the output rate, B
times prompt over output length; their time is a per-sequence term and cancels like per_seq
(counted in `fixed` it would make a larger batch look cheaper than it is). Copies do not
scale so: a prompt chunk copies in almost every offloaded expert whatever B is. (That a
larger batch also brings more mixed steps is left out: w and X are taken as measured.)

With a TPOT SLO, T(B + dB, c + dc) stays within it and the decode steps measured lately do
too (past it, nothing more is evicted and the engine admits no one more while experts are
offloaded, so pages return to them). Evictions are priced coldest first, each on the batch
and copies the ones before it left, so the first that does not pay stops the round: the
ones after it are hotter. Worked example (qwen3-30b-a3b's shapes, K = 8, uniform routing so
K p = 1/16): an expert copy of 9.4 MB at ~50 GB/s is per_copy ~0.19 ms; take
fixed + per_copy * c = 25 ms; a request of ~500 tokens holds ~15 expert pages, so one
eviction (3 pages) buys dB = 0.2, worth 0.2 * 25 = 5 ms. At B = 10, decode-only
(q(11) = 0.51), it pays (5 > 10 * 0.19 * 0.51 = 0.97 ms), as it still does with every step
mixed (dc = 1: 1.9 ms): weights that just fit, where the paper's gains come from. At
B = 30 a decode-only load prices the copy at q(31) = 0.86 and it pays (4.9 ms), but if half
the steps carry a prompt chunk of 500 tokens (q ~ 1) dc = 0.93 and it does not (5.3 ms). At
B = 100 it never does (19 ms).

Shares lie low for the experts they pick: the coldest of a window of recent routing are partly
the ones that drew low by chance and will be routed more, and where routing is near uniform that
is all of them. So the engine scales every copy it prices by what the decode steps measured over
what the shares expected at the same batch (`CostView.copy_scale`), never below 1: after an
eviction round the measured average lags the new residency, and a scale below 1 would then price
the next round's copies low.

Pure: no torch, no clock. The engine measures the StepCost and the StepMix
(engine/experts/step_cost.py).
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
class StepMix:
    """The steps the engine runs, as their copies see them: a share of them (`mixed_share`)
    carry prompt chunks, `extra_tokens` tokens on average beyond one per running request;
    the rest are decode-only."""

    mixed_share: float = 0.0  # w
    extra_tokens: float = 0.0  # X

    def __post_init__(self) -> None:
        if not (0.0 <= self.mixed_share <= 1.0 and self.extra_tokens >= 0.0):
            raise ValueError(
                f"a step mix needs mixed_share in [0, 1], extra_tokens >= 0; got {self}"
            )


DECODE_ONLY = StepMix()  # no step seen with prompt tokens


@dataclass(frozen=True)
class CostView:
    """What the cost rule sees of the engine now."""

    cost: StepCost
    batch: int  # B: the running batch the evictions are for (running, plus one admitting)
    copies: float  # c: copies per step now (the larger of expected and measured)
    batch_per_eviction: float  # dB: EXPERT_MATRICES / what a running request holds
    demand: bool  # requests wait or a running one lacks pages: more pages buy batch
    tpot_slo_s: float | None = None  # a decode step may take at most this long
    # Routing shares to price copies by (recent routing, engine/experts/live_routing.py); None: the
    # ranking's that orders the evictions.
    prices: HotnessRanking | None = None
    recent_step_s: float = 0.0  # decode steps' measured time lately (0: none seen)
    mix: StepMix = DECODE_ONLY  # the steps copies are priced over (module docstring)
    # The copies decode steps made lately over those the shares expect at that batch, at
    # least 1: every copy an eviction adds is priced this much higher (module docstring).
    copy_scale: float = 1.0

    @property
    def over_slo(self) -> bool:
        """Decode steps already take longer than the TPOT SLO."""
        return self.tpot_slo_s is not None and self.recent_step_s > self.tpot_slo_s

    def __post_init__(self) -> None:
        if self.batch < 0 or self.copies < 0 or self.batch_per_eviction < 0:
            raise ValueError(f"batch, copies and batch_per_eviction must be >= 0; got {self}")
        if not self.copy_scale >= 1.0:
            raise ValueError(f"copy_scale must be >= 1; got {self.copy_scale}")


def eviction_pays(view: CostView, done: int, extra_copies: float, dc: float) -> bool:
    """Whether one more eviction, costing `dc` copies per step, pays after `done` earlier
    ones this round added `extra_copies` copies (module docstring)."""
    if not view.demand or view.over_slo:
        return False
    cost, db = view.cost, view.batch_per_eviction
    b = view.batch + done * db
    c = view.copies + view.copy_scale * extra_copies
    dc = view.copy_scale * dc
    if view.tpot_slo_s is not None and cost.seconds(b + db, c + dc) > view.tpot_slo_s:
        return False
    return db * (cost.fixed + cost.per_copy * c) > max(b, 1.0) * cost.per_copy * dc
