"""Start-up residency: which experts go into pool pages first (each policy chooses them:
`MemoryPolicy.start_residency`, dataplane/policies/), fitted beside the loading slots.

With device copy-in the loading slots come from the same free pages (device_copy.py): a
residency that leaves k experts of some layer on the host needs k slots of three pages, so
the free pages the policy fills are what is left once the slots are taken.
"""

from __future__ import annotations

from rimuru.dataplane.adjust.adjuster import ExpertKey
from rimuru.dataplane.policies import memory_policy
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
        chosen = memory_policy(tunables).start_residency(tunables, ranking, free, fixed_share)
        slot_pages = SLOT_PAGES * slots_needed(chosen, ranking, num_slots)
        if free + slot_pages <= num_free_expert_pages:
            return chosen
        free = num_free_expert_pages - slot_pages
    raise AssertionError("start-up residency did not settle")  # slots_needed is bounded


def slots_needed(chosen: list[ExpertKey], ranking: HotnessRanking, num_slots: int) -> int:
    if not num_slots:
        return 0
    return min(num_slots, max_offloaded(chosen, ranking.num_layers, ranking.num_experts))


def max_offloaded(chosen: list[ExpertKey], num_layers: int, num_experts: int) -> int:
    """The most experts any one layer leaves on the host, given the resident `chosen`."""
    per_layer = [0] * num_layers
    for layer, _ in chosen:
        per_layer[layer] += 1
    return num_experts - min(per_layer)
