"""Start-up residency: which experts each memory policy puts in pool pages first.

    resident  every expert.
    fixed     the globally hottest experts filling `fixed_expert_share` of the free expert
              pages; this set never changes (classic fixed-ratio offloading).
    elastic   every layer's hottest E - expert_offload_limit (the adjuster never offloads
              more), then the globally hottest of the rest while grow_threshold pages stay
              free; the adjuster moves the boundary from there.

"Globally hottest" means the adjuster's grow order: each layer nominates its hottest
non-resident expert and the highest routing probability goes first.

With device copy-in the loading slots come from the same free pages (device_copy.py): a
residency that leaves k experts of some layer on the host needs k slots of three pages, so
the free pages the policy fills are what is left once the slots are taken.
"""

from __future__ import annotations

from rimuru.dataplane.adjust.adjuster import ExpertKey, hottest
from rimuru.policy import HotnessRanking, Tunables

SLOT_PAGES = 3  # a loading slot holds one expert's w1, w3 and w2


def initial_experts(
    tunables: Tunables,
    ranking: HotnessRanking,
    num_free_expert_pages: int,
    fixed_share: float,
    num_slots: int = 0,
) -> list[ExpertKey]:
    """num_slots: device copy-in's loading slots (0: host copies, whose buffers lie outside
    the pool). The pages left for experts shrink until they and the slots that residency
    needs fit the free pages (a few rounds: the slots needed are at most num_slots)."""
    free = num_free_expert_pages
    for _ in range(num_slots + 2):
        chosen = _choose(tunables, ranking, free, fixed_share)
        slot_pages = SLOT_PAGES * slots_needed(chosen, ranking, num_slots)
        if free + slot_pages <= num_free_expert_pages:
            return chosen
        free = num_free_expert_pages - slot_pages
    raise AssertionError("start-up residency did not settle")  # slots_needed is bounded


def slots_needed(chosen: list[ExpertKey], ranking: HotnessRanking, num_slots: int) -> int:
    if not num_slots:
        return 0
    return min(num_slots, max_offloaded(chosen, ranking.num_layers, ranking.num_experts))


def _choose(
    tunables: Tunables, ranking: HotnessRanking, num_free_expert_pages: int, fixed_share: float
) -> list[ExpertKey]:
    num_layers, num_experts = ranking.num_layers, ranking.num_experts
    everything = [(layer, e) for layer in range(num_layers) for e in ranking.order[layer]]
    capacity = num_free_expert_pages // tunables.pages_per_expert
    if tunables.mode == "resident":
        return everything
    empty = [frozenset()] * num_layers
    if tunables.mode == "fixed":
        n = int(fixed_share * capacity)
        return list(hottest(min(n, len(everything)), ranking, empty))
    n = max(0, (num_free_expert_pages - tunables.grow_threshold) // tunables.pages_per_expert)
    keep = max(0, num_experts - tunables.expert_offload_limit)
    chosen = [(layer, e) for layer in range(num_layers) for e in ranking.order[layer][:keep]]
    if len(chosen) > capacity:
        raise ValueError(
            f"the pool holds {capacity} experts but elastic mode keeps at least {keep} per "
            f"layer resident ({len(chosen)} in all, expert_offload_limit="
            f"{tunables.expert_offload_limit}): raise the memory budget or expert_offload_limit"
        )
    partial = [frozenset(ranking.order[layer][:keep]) for layer in range(num_layers)]
    chosen += hottest(max(0, min(n, len(everything)) - len(chosen)), ranking, partial)
    return chosen


def max_offloaded(chosen: list[ExpertKey], num_layers: int, num_experts: int) -> int:
    """The most experts any one layer leaves on the host, given the resident `chosen`."""
    per_layer = [0] * num_layers
    for layer, _ in chosen:
        per_layer[layer] += 1
    return num_experts - min(per_layer)
