"""The order experts come back in: the adjuster's grow order, which start-up residency
follows too (dataplane/policies/). Pure: integer keys and the hotness ranking.

"Globally hottest": each layer nominates its hottest non-resident expert, and the highest
routing probability goes first.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from rimuru.policy import HotnessRanking

ExpertKey = tuple[int, int]  # (layer, expert)
Residency = Sequence[frozenset[int] | set[int]]  # per layer: the experts in pool pages


def hottest(n: int, ranking: HotnessRanking, resident: Residency) -> tuple[ExpertKey, ...]:
    # A layer with every expert resident is skipped whole: the grow rule asks every round
    # that has free pages, most of them with nothing offloaded.
    everyone = ranking.num_experts
    queues = [
        [e for e in ranking.order[layer] if e not in resident[layer]]
        if len(resident[layer]) < everyone
        else []
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
