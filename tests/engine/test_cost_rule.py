"""The cost-aware elastic rule in a whole engine: where copies cost more than the pages buy
it keeps every expert (and serves like resident); where they are cheap it offloads, with the
same tokens. And the measured step cost it prices with (step_cost.py)."""

import random

import pytest

from rimuru.dataplane.engine.request import SamplingParams
from rimuru.dataplane.engine.step_cost import MIN_DECODE_STEPS, StepCostMeter
from rimuru.policy import Tunables


def burst(n: int = 24) -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(151_000) for _ in range(rng.randint(40, 110))] for _ in range(n)]


def test_where_copies_cannot_pay_elastic_keeps_its_experts_and_steps_like_resident(make_engine):
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    resident = make_engine("resident")
    want = resident.generate(burst(), params)
    elastic = make_engine("elastic")
    # A bus where one expert copy costs a second: no half request is worth that.
    elastic.step_cost.per_copy = 1.0
    assert elastic.generate(burst(), params) == want
    assert elastic.experts.counters.evictions == 0
    steps, base = len(elastic.stats), len(resident.stats)
    assert abs(steps - base) <= 0.03 * base, (steps, base)
    # the paper's rule on the same pool offloads (and steps differently)
    paper = make_engine("elastic", tunables=Tunables(expert_offload_limit=16, elastic_rule="paper"))
    assert paper.generate(burst(), params) == want
    assert paper.experts.counters.evictions > 0
    elastic.check_invariants()
    assert elastic.num_leaked_pages() == 0


def test_where_copies_are_cheap_elastic_offloads_and_runs_a_larger_batch(make_engine):
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    resident = make_engine("resident")
    want = resident.generate(burst(), params)
    elastic = make_engine("elastic")
    elastic.step_cost.per_copy = 0.0  # copies free: every page is worth taking
    assert elastic.generate(burst(), params) == want
    assert elastic.experts.counters.evictions > 0
    peak = max(s.num_running for s in elastic.stats)
    assert peak > max(s.num_running for s in resident.stats)
    assert len(elastic.stats) < len(resident.stats)


def test_the_step_cost_is_seeded_then_fitted_to_decode_steps():
    meter = StepCostMeter(per_copy=0.002, seed_fixed=0.010)
    assert (meter.cost().fixed, meter.cost().per_seq) == (0.010, 0.0)
    meter.record(batch=64, copies=0, seconds=9.0, decode_only=False)  # a prompt step: left out
    for i in range(MIN_DECODE_STEPS):
        batch = 8 + 8 * i
        copies = i % 3
        # a device with 5 ms fixed and 0.1 ms per sequence, plus 2 ms per copy
        meter.record(batch, copies, 0.005 + 0.0001 * batch + 0.002 * copies, decode_only=True)
    cost = meter.cost()
    assert cost.fixed == pytest.approx(0.005) and cost.per_seq == pytest.approx(0.0001)
    assert cost.per_copy == 0.002


def test_the_engine_measures_its_copy_and_read_costs_at_start(make_engine):
    engine = make_engine("elastic")
    cost = engine.step_cost.cost()
    assert cost.per_copy > 0 and cost.fixed > 0


def test_past_the_tpot_slo_elastic_admits_no_one_more_while_experts_are_offloaded(make_engine):
    """The SLO by measurement: once decode steps run past it, the batch stops growing, so
    pages that finishing requests free bring experts back instead."""
    from rimuru.dataplane.engine.scheduler import RoundState

    engine = make_engine("elastic", tunables=Tunables(expert_offload_limit=16, tpot_slo_ms=1e6))
    engine.step_cost.per_copy = 0.0
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    for i, prompt in enumerate(burst()):
        engine.add_request(prompt, params, f"r{i}")
    while engine.experts.counters.evictions == 0:
        engine.step()
    running = len(engine.scheduler.running)
    round_now = RoundState(engine.step_id + 1, running, len(engine.scheduler.waiting))
    assert engine.boundary.admit_limit(round_now) == engine.config.max_num_seqs
    engine.step_cost.recent_step_s = 2e3  # steps of 2,000 s: past the 1,000 s SLO
    assert engine.boundary.admit_limit(round_now) == running
    while engine.has_unfinished_requests():
        engine.step()
    engine.check_invariants()
