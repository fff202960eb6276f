"""A policy push applied live (engine/startup/live_policy.py): all of it or none of it, and never one
that would strand a request already accepted."""

from dataclasses import replace

import pytest

from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.policy import HotnessRanking, Tunables

PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)


def test_a_push_whose_residency_cannot_load_leaves_the_engine_as_it_was(prompts, make_engine):
    # a pool short of a few experts, 4 loading-buffer slots: limit 4 starts; limit 0 with a
    # ranking must re-choose start-up residency, and cannot (every expert would be resident)
    engine = make_engine(
        "elastic",
        pool_mib=22.5,
        loading_buffer_slots=4,
        tunables=Tunables(mode="elastic", expert_offload_limit=4),
    )
    layers, experts = engine.model_config.num_layers, engine.model_config.num_experts
    resident, tunables, ranking = engine.residency.resident_sets(), engine.tunables, engine.ranking
    counters = replace(engine.expert_counters)  # exported as metrics: a NACK moves none
    assert sum(map(len, resident)) < layers * experts, "the pool holds every expert"
    skewed = HotnessRanking.from_counts([list(range(experts, 0, -1))] * layers, source="test")
    with pytest.raises(ValueError, match="pool"):
        engine.apply_policy(replace(tunables, expert_offload_limit=0), skewed)
    assert engine.tunables is tunables and engine.ranking is ranking
    assert engine.residency.resident_sets() == resident
    assert engine.expert_counters == counters
    want = make_engine(
        "elastic",
        pool_mib=22.5,
        loading_buffer_slots=4,
        tunables=Tunables(mode="elastic", expert_offload_limit=4),
    ).generate(prompts[:4], PARAMS)
    assert engine.generate(prompts[:4], PARAMS) == want
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0


def test_tunables_that_would_strand_an_accepted_request_are_refused(make_engine):
    engine = make_engine("elastic", tunables=Tunables(mode="elastic", expert_offload_limit=16))
    tight = replace(engine.tunables, expert_offload_limit=0)
    fits_now, fits_then = engine.max_kv_tokens(), engine.max_kv_tokens(tight)
    assert fits_then < fits_now
    engine.add_request([5] * (fits_then + 8), PARAMS, "big")  # fits only with experts out
    with pytest.raises(ValueError, match="request 'big' needs"):
        engine.set_tunables(tight)
    assert engine.tunables.expert_offload_limit == 16
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.requests["big"].status.finished
    engine.set_tunables(tight)  # once it has finished, the same push applies
    assert engine.tunables.expert_offload_limit == 0
