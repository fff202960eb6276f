"""The adjuster: where the boundary between expert pages and KV pages goes next round.

`decide` is a pure function of (shortfall, free expert pages, hotness ranking, current
residency, tunables, and for a copy budget the step's shape, the experts it prices and the
copies measured lately) -> which experts to evict and which to load.
Rules (the Rimuru paper; ppe = pages per expert = 3 by default):

    short by R expert pages          -> evict ceil((R + 1) / ppe) experts
    not short, F < shrink_threshold  -> evict 1 expert (keep headroom for new KV blocks)
    F > grow_threshold               -> load min(max_grow_per_round,
                                                 floor((F - grow_threshold) / ppe)) experts

  worked examples: short 8 -> evict 3;  20 free -> load 3.

Shrinking: every layer nominates its coldest resident expert; the lowest routing
probability goes first, then that layer nominates its next one. Layers that already have
`expert_offload_limit` experts offloaded are left out. Growing mirrors it: every layer
nominates its hottest offloaded expert; the highest probability goes first.

Copy budget (`tunables.copy_budget` > 0, given the step's shape): every offloaded expert a
decode step routes to is copied in for that step, so offloading costs

    expected copies per step = sum over offloaded (l, e) of 1 - (1 - min(1, K p_le))^B

(p_le = expert e's share of layer l's routed pairs: the ranking's probabilities divided by their
layer's sum, uniform where they sum to 0; K = top-k, B = tokens per step; tokens are taken as
independent). A shrink stops before an eviction would take that sum past the budget: with skewed
routing the cold experts cost little and may go; with uniform routing each one is needed in
nearly every step, and an elastic run becomes copy-bound (its cost against resident's is in
docs/benchmarks.md). Evictions are taken coldest first, so the first refused is the last tried;
one that costs nothing (p = 0) is not refused by the model (the measured copies below may still
stop every eviction).
Only experts resident at start-up count (`counted`): those that never fit are outside
the budget, which prices the adjuster's own evictions. A batch that grows after its
evictions would raise the sum again, so the budget also caps admission
(`max_batch_within_budget`: the largest batch whose sum stays within it); requests wait
while it binds, and pages that running requests free bring experts back by the usual grow
rule (hottest first), which lowers the sum and lifts the cap once the experts that come
back are ones the budget counts. The ranking can be wrong about what is cold, so the engine
also measures the copies its decode steps make (engine/experts/copy_budget.py) and the budget
counts the larger figure.

Cost rule (`tunables.elastic_rule = "cost"`, the default; "paper" is the rules above alone):
each eviction the rules ask for must also pay for itself, from measured costs (payoff.py):
the batch its pages buy against the copies it adds, priced over the steps the engine runs
(decode-only and mixed: the same sum, each term averaged over `StepShape.mix`). The first that does not pay ends the
round, so `expert_offload_limit` becomes a ceiling the rule stays under by itself. The
engine then hands `decide` recent routing as the ranking, so that evictions go coldest first
by the routing that prices them (engine/sched/boundary.py, ElasticBoundary.order).

`reserve` then turns a decision into a ChangeList with page ids from the allocator.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from rimuru.dataplane.adjust.order import ExpertKey, Residency, hottest
from rimuru.dataplane.adjust.payoff import DECODE_ONLY, CostView, StepMix, eviction_pays
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import PageType
from rimuru.dataplane.policies import memory_policy
from rimuru.policy import EXPERT_MATRICES, HotnessRanking, Tunables


@dataclass(frozen=True)
class StepShape:
    """What a step looks like now: for the copy budget a decode step; for the cost rule the
    steps the engine runs, mixed ones included (`mix`, payoff.py)."""

    tokens: int  # B: tokens per decode step (the running requests' decodes)
    top_k: int  # K
    mix: StepMix = DECODE_ONLY


def route_probability(p: float, step: StepShape) -> float:
    """Probability that a step routes at least one token to an expert with routing share p,
    i.e. the expected copies per step it costs offloaded: 1 - (1 - min(1, K p))^B for a
    decode step; over a mix, that weighed against the same at B + extra_tokens by the mixed
    share (payoff.py says why not at the mean tokens)."""
    keep = 1.0 - min(1.0, step.top_k * p)
    decode = 1.0 - keep ** max(1, step.tokens)
    if not step.mix.mixed_share:
        return decode
    mixed = 1.0 - keep ** (max(1, step.tokens) + step.mix.extra_tokens)
    return decode + step.mix.mixed_share * (mixed - decode)


def _offloaded(
    ranking: HotnessRanking, resident: Residency, counted: Residency | None
) -> Iterator[ExpertKey]:
    """Experts offloaded now that count for the budget (`counted` None: all of them)."""
    everyone = frozenset(range(ranking.num_experts))
    for layer, here in enumerate(resident):
        for e in sorted((everyone if counted is None else counted[layer]) - here):
            yield layer, e


def expected_copies(
    ranking: HotnessRanking,
    resident: Residency,
    step: StepShape,
    counted: Residency | None = None,
) -> float:
    """Expected expert copies per decode step for the (counted) experts offloaded now."""
    return sum(
        route_probability(ranking.share(layer, e), step)
        for layer, e in _offloaded(ranking, resident, counted)
    )


def max_batch_within_budget(
    ranking: HotnessRanking,
    resident: Residency,
    top_k: int,
    budget: float,
    limit: int,
    counted: Residency | None = None,
) -> int:
    """The largest decode batch B in [1, limit] whose expected copies stay within `budget`;
    1 even when one token passes it (a request must always be able to run). The sum grows
    with B, so a bisection over the offloaded experts (the engine caches the result per
    residency: engine/experts/copy_budget.py)."""
    keep = [
        1.0 - min(1.0, top_k * ranking.share(layer, e))
        for layer, e in _offloaded(ranking, resident, counted)
    ]
    q = [k for k in keep if k < 1.0]  # ever routed

    def within(batch: int) -> bool:  # the epsilon: an eviction may spend the budget exactly
        return len(q) - math.fsum(k**batch for k in q) <= budget + 1e-9

    if within(limit):
        return limit
    lo, hi = 1, limit  # not within(hi); within(lo), or lo == 1 regardless
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if within(mid):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class AdjusterDecision:
    evict: tuple[ExpertKey, ...] = ()
    load: tuple[ExpertKey, ...] = ()


@dataclass(frozen=True)
class ExpertLoad:
    layer: int
    expert: int
    pages: tuple[int, ...]  # (w1, w3, w2) page ids reserved for the copy


@dataclass(frozen=True)
class ChangeList:
    evict: tuple[ExpertKey, ...] = ()
    load: tuple[ExpertLoad, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.evict or self.load)


def num_to_evict(shortfall: int, num_free: int, tunables: Tunables) -> int:
    if shortfall > 0:
        return math.ceil((shortfall + 1) / EXPERT_MATRICES)
    if num_free < tunables.shrink_threshold:
        return 1
    return 0


def num_to_load(shortfall: int, num_free: int, tunables: Tunables) -> int:
    if shortfall > 0 or num_free <= tunables.grow_threshold:
        return 0
    extra = (num_free - tunables.grow_threshold) // EXPERT_MATRICES
    return min(tunables.max_grow_per_round, extra)


def decide(
    shortfall: int,
    num_free_expert_pages: int,
    ranking: HotnessRanking,
    resident: Residency,
    tunables: Tunables,
    step: StepShape | None = None,
    counted: Residency | None = None,
    measured: float = 0.0,
    costs: CostView | None = None,
) -> AdjusterDecision:
    """Pure: what to evict or load this round (see the module docstring). `step` is needed
    for a copy budget; without it the budget is not applied. `counted`: the experts whose
    absence the budget prices (the start-up residency; None: all). `measured`: copies per
    decode step lately (the engine's CopyMeter, engine/experts/copy_budget.py); the budget counts the larger of it and the
    ranking's expectation, and at or past the budget evicts nothing, not even experts the
    ranking calls free (it is evidently wrong about them). `costs`: what the cost rule
    (elastic_rule "cost", payoff.py) prices evictions with; without it (or with the paper
    rule) evictions are not priced."""
    if shortfall < 0 or num_free_expert_pages < 0:
        raise ValueError("shortfall and free page counts must be >= 0")
    if len(resident) != ranking.num_layers:
        raise ValueError(f"residency has {len(resident)} layers, ranking {ranking.num_layers}")
    if not memory_policy(tunables).moves_boundary:
        return AdjusterDecision()
    n_evict = num_to_evict(shortfall, num_free_expert_pages, tunables)
    if n_evict:
        checks = []
        if tunables.copy_budget > 0 and step is not None:
            if measured >= tunables.copy_budget:
                return AdjusterDecision()
            spent = max(expected_copies(ranking, resident, step, counted), measured)
            checks.append(_within_budget(tunables.copy_budget - spent, step, counted))
        if memory_policy(tunables).prices_copies and costs is not None:
            checks.append(_paying(costs, step.top_k if step else 1))
        return AdjusterDecision(evict=_coldest(n_evict, ranking, resident, tunables, checks))
    n_load = num_to_load(shortfall, num_free_expert_pages, tunables)
    if n_load:
        return AdjusterDecision(load=hottest(n_load, ranking, resident))
    return AdjusterDecision()


# An eviction check: given the next coldest (layer, expert) and its routing share, whether
# it may go (and, if so, it counts it as gone).
Check = Callable[[ExpertKey, float], bool]


def _within_budget(left: float, step: StepShape, counted: Residency | None) -> Check:
    def check(key: ExpertKey, share: float) -> bool:
        nonlocal left
        if counted is not None and key[1] not in counted[key[0]]:
            return True  # never fitted at start-up: outside the budget
        cost = route_probability(share, step)
        if cost > 0 and cost > left:
            return False
        left -= cost
        return True

    return check


def _paying(view: CostView, top_k: int) -> Check:
    done, added = 0, 0.0

    def check(key: ExpertKey, share: float) -> bool:
        nonlocal done, added
        if view.prices is not None:
            share = view.prices.share(*key)
        batch_after = view.batch + (done + 1) * view.batch_per_eviction
        dc = route_probability(share, StepShape(math.ceil(batch_after), top_k, view.mix))
        if not eviction_pays(view, done, added, dc):
            return False
        done, added = done + 1, added + dc
        return True

    return check


def _coldest(
    n: int,
    ranking: HotnessRanking,
    resident: Residency,
    t: Tunables,
    checks: Sequence[Check] = (),
) -> tuple[ExpertKey, ...]:
    """Up to n resident experts, coldest first across layers, within expert_offload_limit;
    the first that a check refuses ends the list (the ones after it are hotter)."""
    num_experts = ranking.num_experts
    # per layer: resident experts coldest first
    queues = [
        [e for e in reversed(ranking.order[layer]) if e in resident[layer]]
        for layer in range(ranking.num_layers)
    ]
    offloaded = [num_experts - len(resident[layer]) for layer in range(ranking.num_layers)]
    heap: list[tuple[float, int, int]] = []  # (probability, layer, position in queue)
    for layer, queue in enumerate(queues):
        if queue and offloaded[layer] < t.expert_offload_limit:
            heap.append((ranking.share(layer, queue[0]), layer, 0))
    heapq.heapify(heap)
    chosen: list[ExpertKey] = []
    while heap and len(chosen) < n:
        share, layer, pos = heapq.heappop(heap)
        key = (layer, queues[layer][pos])
        if not all(check(key, share) for check in checks):
            break
        chosen.append(key)
        offloaded[layer] += 1
        if pos + 1 < len(queues[layer]) and offloaded[layer] < t.expert_offload_limit:
            heapq.heappush(heap, (ranking.share(layer, queues[layer][pos + 1]), layer, pos + 1))
    return tuple(chosen)


def reserve(decision: AdjusterDecision, allocator: PageAllocator, tunables: Tunables) -> ChangeList:
    """Reserve expert pages for each load (as many loads as fit, in decision order)."""
    loads = []
    for layer, expert in decision.load:
        pages = allocator.allocate(
            PageType.EXPERT, EXPERT_MATRICES, owner=("expert", layer, expert)
        )
        if pages is None:
            break
        loads.append(ExpertLoad(layer, expert, tuple(pages)))
    return ChangeList(evict=decision.evict, load=tuple(loads))
