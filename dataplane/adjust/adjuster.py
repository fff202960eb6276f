"""The adjuster: where the boundary between expert pages and KV pages goes next round.

`decide` is a pure function of (shortfall, free expert pages, hotness ranking, current
residency, expert_offload_limit, tunables) -> which experts to evict and which to load.
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

(p_le = expert e's share of layer l's routed pairs: the ranking's probabilities divided by
their layer's sum, uniform where they sum to 0; K = top-k, B = tokens per step; tokens are
taken as independent). A shrink stops before an eviction would take that sum past the
budget: with skewed routing the cold experts cost little and may go; with uniform routing
each one is needed in nearly every step (on the H200, 2026-11-30, elastic at router skew 0
ran at 0.52x resident's output rate, copying 5.4 TB). Evictions are taken coldest first, so
the first refused is the last tried; one that costs nothing (p = 0) is never refused.
The budget only limits shrinks: start-up residency (set by memory) ignores it, and nothing
is brought back when a growing batch raises the sum; free expert pages do that, as always.

`reserve` then turns a decision into a ChangeList with page ids from the allocator.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rimuru.dataplane.adjust.hotness import HotnessRanking
from rimuru.dataplane.adjust.tunables import Tunables
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import PageType

ExpertKey = tuple[int, int]  # (layer, expert)


@dataclass(frozen=True)
class StepShape:
    """What a decode step looks like now, for the copy budget."""

    tokens: int  # B: tokens per step (the running requests' decodes)
    top_k: int  # K


def route_probability(p: float, step: StepShape) -> float:
    """Probability that an expert with routing share p gets at least one of B tokens."""
    return 1.0 - (1.0 - min(1.0, step.top_k * p)) ** max(1, step.tokens)


def expected_copies(
    ranking: HotnessRanking, resident: Sequence[frozenset[int] | set[int]], step: StepShape
) -> float:
    """Expected expert copies per decode step for the experts offloaded now."""
    return sum(
        route_probability(ranking.share(layer, e), step)
        for layer in range(ranking.num_layers)
        for e in range(ranking.num_experts)
        if e not in resident[layer]
    )


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
        return math.ceil((shortfall + 1) / tunables.pages_per_expert)
    if num_free < tunables.shrink_threshold:
        return 1
    return 0


def num_to_load(shortfall: int, num_free: int, tunables: Tunables) -> int:
    if shortfall > 0 or num_free <= tunables.grow_threshold:
        return 0
    extra = (num_free - tunables.grow_threshold) // tunables.pages_per_expert
    return min(tunables.max_grow_per_round, extra)


def decide(
    shortfall: int,
    num_free_expert_pages: int,
    ranking: HotnessRanking,
    resident: Sequence[frozenset[int] | set[int]],
    tunables: Tunables,
    step: StepShape | None = None,
) -> AdjusterDecision:
    """Pure: what to evict or load this round (see the module docstring). `step` is needed
    for a copy budget; without it the budget is not applied."""
    if shortfall < 0 or num_free_expert_pages < 0:
        raise ValueError("shortfall and free page counts must be >= 0")
    if len(resident) != ranking.num_layers:
        raise ValueError(f"residency has {len(resident)} layers, ranking {ranking.num_layers}")
    if tunables.mode != "elastic":
        return AdjusterDecision()
    n_evict = num_to_evict(shortfall, num_free_expert_pages, tunables)
    if n_evict:
        budget = None
        if tunables.copy_budget > 0 and step is not None:
            budget = (tunables.copy_budget - expected_copies(ranking, resident, step), step)
        return AdjusterDecision(evict=_coldest(n_evict, ranking, resident, tunables, budget))
    n_load = num_to_load(shortfall, num_free_expert_pages, tunables)
    if n_load:
        return AdjusterDecision(load=hottest(n_load, ranking, resident))
    return AdjusterDecision()


def _coldest(
    n: int,
    ranking: HotnessRanking,
    resident: Sequence[frozenset[int] | set[int]],
    t: Tunables,
    budget: tuple[float, StepShape] | None = None,  # (copies per step left, the step)
) -> tuple[ExpertKey, ...]:
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
    left = budget[0] if budget is not None else math.inf
    while heap and len(chosen) < n:
        share, layer, pos = heapq.heappop(heap)
        if budget is not None:
            cost = route_probability(share, budget[1])
            if cost > 0 and cost > left:  # the rest cost at least as much: none fits either
                break
            left -= cost
        chosen.append((layer, queues[layer][pos]))
        offloaded[layer] += 1
        if pos + 1 < len(queues[layer]) and offloaded[layer] < t.expert_offload_limit:
            heapq.heappush(heap, (ranking.share(layer, queues[layer][pos + 1]), layer, pos + 1))
    return tuple(chosen)


def hottest(
    n: int, ranking: HotnessRanking, resident: Sequence[frozenset[int] | set[int]]
) -> tuple[ExpertKey, ...]:
    queues = [
        [e for e in ranking.order[layer] if e not in resident[layer]]
        for layer in range(ranking.num_layers)
    ]
    heap = [(-ranking.probability(layer, q[0]), layer, 0) for layer, q in enumerate(queues) if q]
    heapq.heapify(heap)
    chosen: list[ExpertKey] = []
    while heap and len(chosen) < n:
        _, layer, pos = heapq.heappop(heap)
        chosen.append((layer, queues[layer][pos]))
        if pos + 1 < len(queues[layer]):
            heapq.heappush(
                heap, (-ranking.probability(layer, queues[layer][pos + 1]), layer, pos + 1)
            )
    return tuple(chosen)


def reserve(decision: AdjusterDecision, allocator: PageAllocator, tunables: Tunables) -> ChangeList:
    """Reserve expert pages for each load (as many loads as fit, in decision order)."""
    loads = []
    for layer, expert in decision.load:
        pages = allocator.allocate(
            PageType.EXPERT, tunables.pages_per_expert, owner=("expert", layer, expert)
        )
        if pages is None:
            break
        loads.append(ExpertLoad(layer, expert, tuple(pages)))
    return ChangeList(evict=decision.evict, load=tuple(loads))
