"""Elastic mode makes room before it preempts: when a running request's next KV block does not
fit, experts are evicted inside the scheduling round (within expert_offload_limit), and a
request is preempted only once the limit binds. Tokens do not depend on either."""

import random

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.policy import Tunables

MiB = 2**20
LAYERS, EXPERTS = 4, 32  # the tiny preset


def run(limit: int, budget: int, prompts, evict_to_admit: bool = True):
    engine = Engine(
        EngineConfig(
            evict_to_admit=evict_to_admit,
            memory_budget=budget,
            activation_reserve=0,
            max_num_batched_tokens=256,
            loading_buffer_slots=32,
            # the paper's rule: this is the mechanism's test, and the cost rule prices
            # evictions with step times measured on a machine other tests share
            tunables=Tunables(mode="elastic", expert_offload_limit=limit, elastic_rule="paper"),
        ),
        log_plan=False,
    )
    tokens = engine.generate(prompts, SamplingParams(max_tokens=64, ignore_eos=True))
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0
    fewest = min(s.num_experts_resident for s in engine.stats)
    return tokens, engine.scheduler.num_preemptions, engine.expert_counters.evictions, fewest


def test_elastic_evicts_before_it_preempts_and_preempts_once_the_limit_binds():
    rng = random.Random(7)
    prompts = [[rng.randrange(151_000) for _ in range(rng.randint(20, 60))] for _ in range(40)]
    probe = Engine(EngineConfig(activation_reserve=0), log_plan=False)
    # every expert resident leaves ~1 MiB of KV pages: 40 requests of up to 124 tokens need
    # more (device copy-in's one unread slot lies outside the pool; its slots come from it)
    budget = probe.model.resident_nbytes() + 3 * probe.geometry.expert_page_bytes
    budget += 25 * MiB
    # (a limit of 20: of a layer's offloaded experts, as many as the most any layer offloads
    # hold their pages as loading slots, a quarter of the evictions on 4 layers)
    roomy, preempted, evicted, fewest = run(20, budget, prompts)
    assert preempted == 0 and evicted > 0
    assert LAYERS * (EXPERTS - 20) <= fewest < LAYERS * EXPERTS
    tight, preempted, evicted, fewest = run(3, budget, prompts)
    assert preempted > 0  # three experts a layer were not enough room
    assert fewest == LAYERS * (EXPERTS - 3)  # the limit bound, and held
    assert tight == roomy
    # Switched off, the same load preempts instead, and the boundary moves only between rounds.
    preempting, preempted, _, _ = run(20, budget, prompts, False)
    assert preempted > 0
    assert preempting == roomy
