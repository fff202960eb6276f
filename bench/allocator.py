"""Cost of the pool's bookkeeping at realistic sizes (CPU; no torch in the hot path).

    python bench/allocator.py

Measures: one KV-block allocation and free (one page per layer), an expert's 3 pages,
one adjuster decision, and one round of scheduling bookkeeping at 256 running requests
(each decode step: grow by a block when a block fills, every 16 steps).
Prints a short table last.
"""

from __future__ import annotations

import random
import time

from rimuru.dataplane.adjust.adjuster import StepShape, decide
from rimuru.dataplane.adjust.payoff import CostView, StepCost
from rimuru.dataplane.engine.sched.kv_cache import KVCacheManager
from rimuru.dataplane.engine.sched.request import Request, SamplingParams
from rimuru.dataplane.engine.sched.scheduler import Scheduler
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import MemoryShape, PageGeometry, PageType
from rimuru.dataplane.memory.reclaim import DeferredReclaim
from rimuru.policy import HotnessRanking, Tunables

MODELS = {
    # name: (shape, pool bytes): every expert resident plus room for 5000 16-token blocks
    "qwen1.5-moe-a2.7b": (MemoryShape(24, 60, 2048, 1408, 16, 128, 2), 48 * 2**30),
    "qwen3-30b-a3b": (MemoryShape(48, 128, 2048, 768, 4, 128, 2), 80 * 2**30),
}


def per_op(fn, n: int) -> float:
    start = time.perf_counter()
    fn(n)
    return (time.perf_counter() - start) / n * 1e6  # us


def bench_model(name: str, shape: MemoryShape, pool_bytes: int) -> dict:
    g = PageGeometry.from_shape(shape)
    a = PageAllocator(g, pool_bytes // g.huge_page_bytes)
    rng = random.Random(0)
    # fill experts: every expert resident (3 pages each)
    experts = {}
    for layer in range(shape.num_layers):
        for e in range(shape.num_experts):
            experts[(layer, e)] = a.allocate(PageType.EXPERT, 3, ("expert", layer, e))
    live: list[tuple[str, list[int]]] = []

    def alloc_blocks(n):
        for i in range(n):
            pages = a.allocate(PageType.KV, shape.num_layers, f"r{i % 512}")
            live.append((f"r{i % 512}", pages))

    def free_blocks(n):
        for _ in range(n):
            owner, pages = live.pop()
            a.free(PageType.KV, pages, owner)

    n = 5000
    alloc_us = per_op(alloc_blocks, n) / shape.num_layers
    rng.shuffle(live)
    free_us = per_op(free_blocks, n) / shape.num_layers

    def expert_cycle(n):
        for i in range(n):
            key = (i % shape.num_layers, i % shape.num_experts)
            a.free(PageType.EXPERT, experts[key], ("expert", *key))
            experts[key] = a.allocate(PageType.EXPERT, 3, ("expert", *key))

    expert_us = per_op(expert_cycle, 2000) / 6  # 3 frees + 3 allocations
    ranking = HotnessRanking.from_counts(
        [[rng.random() for _ in range(shape.num_experts)] for _ in range(shape.num_layers)]
    )
    resident = [frozenset(range(shape.num_experts))] * shape.num_layers
    t = Tunables(expert_offload_limit=16)

    def decisions(n):
        for i in range(n):
            decide(30 + i % 7, 0, ranking, resident, t)

    decide_us = per_op(decisions, 200)
    # the cost rule (elastic's default) prices each of those evictions first: a case where
    # all pay (B = 64, copies cheap against the step), the most work it does
    costs = CostView(StepCost(0.025, 0.0, 1e-6), 64, 0.0, 0.2, True)
    step = StepShape(64, 8)

    def priced(n):
        for i in range(n):
            decide(30 + i % 7, 0, ranking, resident, t, step, costs=costs)

    priced_us = per_op(priced, 200)
    # scheduling bookkeeping: 256 running decode requests, 16 rounds (one block boundary)
    a2 = PageAllocator(g, pool_bytes // g.huge_page_bytes)
    kv = KVCacheManager(a2, DeferredReclaim(a2), shape.num_layers, 16)
    sched = Scheduler(kv, 256, 8192)
    for i in range(256):
        r = Request(f"q{i}", [1] * (100 + i), SamplingParams(max_tokens=1000), shape.num_layers)
        sched.add(r)
    sched.schedule(0)
    for r in sched.running:
        r.num_computed_tokens = r.num_tokens

    def rounds(n):
        for step in range(1, n + 1):
            out = sched.schedule(step)
            for s in out.scheduled:
                s.request.num_computed_tokens += s.num_new_tokens
                s.request.output_token_ids.append(7)

    rounds(32)  # let every request's block table catch up with its prompt first
    round_us = per_op(rounds, 64)
    a.check_invariants()
    return {
        "model": name,
        "pages": a.num_huge_pages,
        "kv alloc us/page": alloc_us,
        "kv free us/page": free_us,
        "expert us/page": expert_us,
        "adjuster us/decision": decide_us,
        "cost rule us/decision": priced_us,
        "schedule round us @256": round_us,
    }


def main() -> None:
    rows = [bench_model(name, *spec) for name, spec in MODELS.items()]
    keys = list(rows[0])
    widths = [max(len(k), 10) for k in keys]
    print("  ".join(k.rjust(w) for k, w in zip(keys, widths, strict=True)))
    for row in rows:
        cells = [f"{row[k]:.2f}" if isinstance(row[k], float) else str(row[k]) for k in keys]
        print("  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))


if __name__ == "__main__":
    main()
