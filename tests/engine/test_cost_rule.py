"""The cost-aware elastic rule in a whole engine: where copies cost more than the pages buy
it keeps every expert (and serves like resident); where they are cheap it offloads, with the
same tokens. And the measured step cost it prices with (step_cost.py)."""

import random
from dataclasses import replace

import pytest

from rimuru.dataplane.adjust.payoff import DECODE_ONLY
from rimuru.dataplane.engine.experts.step_cost import MIN_DECODE_STEPS, StepCostMeter
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.policy import HotnessRanking, Tunables


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
    assert elastic.expert_counters.evictions == 0
    steps, base = len(elastic.stats), len(resident.stats)
    assert abs(steps - base) <= 0.03 * base, (steps, base)
    # the paper's rule on the same pool offloads (and steps differently)
    paper = make_engine("elastic", tunables=Tunables(expert_offload_limit=16, elastic_rule="paper"))
    assert paper.generate(burst(), params) == want
    assert paper.expert_counters.evictions > 0
    elastic.check_invariants()
    assert elastic.num_leaked_pages() == 0


def test_where_copies_are_cheap_elastic_offloads_and_runs_a_larger_batch(make_engine):
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    resident = make_engine("resident")
    want = resident.generate(burst(), params)
    elastic = make_engine("elastic")
    elastic.step_cost.per_copy = 0.0  # copies free: every page is worth taking
    assert elastic.generate(burst(), params) == want
    assert elastic.expert_counters.evictions > 0
    peak = max(s.num_running for s in elastic.stats)
    assert peak > max(s.num_running for s in resident.stats)
    assert len(elastic.stats) < len(resident.stats)


def test_the_step_cost_is_seeded_then_fitted_to_decode_steps():
    meter = StepCostMeter(per_copy=0.002, seed_fixed=0.010)
    assert (meter.cost().fixed, meter.cost().per_seq) == (0.010, 0.0)
    meter.record(batch=64, num_tokens=300, copies=0, seconds=9.0)  # a prompt step: left out
    for i in range(MIN_DECODE_STEPS):
        batch = 8 + 8 * i
        copies = i % 3
        # a device with 5 ms fixed and 0.1 ms per sequence, plus 2 ms per copy
        meter.record(batch, batch, copies, 0.005 + 0.0001 * batch + 0.002 * copies)
    cost = meter.cost()
    assert cost.fixed == pytest.approx(0.005) and cost.per_seq == pytest.approx(0.0001)
    assert cost.per_copy == 0.002


def test_the_step_mix_weighs_every_step_and_averages_the_mixed_ones_extra_tokens():
    meter = StepCostMeter(per_copy=0.002, seed_fixed=0.010, decay=0.5)
    assert meter.mix() == DECODE_ONLY  # nothing seen: decode-only
    meter.record(batch=4, num_tokens=104, copies=3, seconds=0.05)  # 100 prompt tokens
    meter.record(batch=4, num_tokens=4, copies=1, seconds=0.01)
    meter.record(batch=4, num_tokens=24, copies=2, seconds=0.02)  # 20 prompt tokens
    # weights 1/4, 1/2, 1: mixed 1/4 + 1 of 1.75 steps; extra (25 + 20) / 1.25 = 36
    assert meter.mix().mixed_share == pytest.approx(1.25 / 1.75)
    assert meter.mix().extra_tokens == pytest.approx(36.0)
    assert meter.num_steps == 1  # the fit saw the decode step alone


def test_the_engine_tells_the_meter_the_tokens_its_steps_route(make_engine):
    """One request of 100 prompt tokens and 8 output tokens: a step of 100 tokens (one
    sequence: 99 extra), then 7 decode steps."""
    engine = make_engine("elastic")
    prompt = burst(1)[0][:1] * 100
    engine.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))
    assert len(engine.stats) == 8
    d = engine.step_cost.decay
    mix = engine.step_cost.mix()
    assert mix.mixed_share == pytest.approx(d**7 / sum(d**i for i in range(8)))
    assert mix.extra_tokens == pytest.approx(99.0)


def offloading(make_engine):
    """An elastic engine with copies priced free, stepped through a burst until its first
    eviction."""
    engine = make_engine("elastic")
    engine.step_cost.per_copy = 0.0  # copies free: experts go
    for i, prompt in enumerate(burst()):
        engine.add_request(prompt, SamplingParams(max_tokens=16, ignore_eos=True), f"r{i}")
    while engine.expert_counters.evictions == 0:
        engine.step()
    return engine


def test_the_boundary_prices_the_offloaded_experts_over_the_step_mix(make_engine):
    engine = offloading(make_engine)
    for _ in range(200):  # lately only decode steps of 2: the offloaded are seldom routed
        engine.step_cost.record(batch=2, num_tokens=2, copies=0, seconds=0.01)
    decode = engine.boundary.costs(2, 2, demand=True, step=engine.step_id + 1)
    assert decode.mix.mixed_share < 1e-2
    for _ in range(200):  # now every step also carries a prompt chunk of 120 tokens
        engine.step_cost.record(batch=2, num_tokens=122, copies=0, seconds=0.01)
    mixed = engine.boundary.costs(2, 2, demand=True, step=engine.step_id + 1)
    assert mixed.mix.mixed_share > 0.99 and mixed.mix.extra_tokens == pytest.approx(120)
    assert mixed.copies > decode.copies
    while engine.has_unfinished_requests():
        engine.step()
    engine.check_invariants()


def test_the_engine_measures_its_copy_and_read_costs_at_start(make_engine):
    engine = make_engine("elastic")
    cost = engine.step_cost.cost()
    assert cost.per_copy > 0 and cost.fixed > 0


def test_past_the_tpot_slo_elastic_admits_no_one_more_while_experts_are_offloaded(make_engine):
    """The SLO by measurement: once decode steps run past it, the batch stops growing, so
    pages that finishing requests free bring experts back instead."""
    from rimuru.dataplane.engine.sched.scheduler import RoundState

    engine = make_engine("elastic", tunables=Tunables(expert_offload_limit=16, tpot_slo_ms=1e6))
    engine.step_cost.per_copy = 0.0
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    for i, prompt in enumerate(burst()):
        engine.add_request(prompt, params, f"r{i}")
    while engine.expert_counters.evictions == 0:
        engine.step()
    running = len(engine.scheduler.running)
    round_now = RoundState(engine.step_id + 1, running, len(engine.scheduler.waiting))
    assert engine.boundary.admit_limit(round_now) == engine.config.max_num_seqs
    engine.step_cost.recent_step_s = 2e3  # steps of 2,000 s: past the 1,000 s SLO
    assert engine.boundary.admit_limit(round_now) == running
    while engine.has_unfinished_requests():
        engine.step()
    engine.check_invariants()


def test_the_cost_rule_evicts_the_coldest_of_recent_routing_not_of_a_stale_ranking(make_engine):
    """Evictions follow live routing once its window is full (boundary.order): a ranking
    that routing has left would offer hot experts first."""
    from rimuru.dataplane.adjust.adjuster import num_to_evict
    from rimuru.dataplane.engine.sched.scheduler import RoundState
    from rimuru.dataplane.memory.geometry import PageType

    engine = make_engine("elastic")
    engine.step_cost.per_copy = 0.0  # copies free: every eviction asked for pays
    assert engine.boundary.order(step=1) is engine.ranking  # no window yet: the seed
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    engine.generate(burst(8), params)
    live = engine.boundary.live.ranking(engine.moe_backend, engine.step_id + 10**6)  # read now
    assert live is not None
    num_experts = live.num_experts
    # a stale ranking: live routing's order reversed (its hottest are live's coldest)
    stale = HotnessRanking.from_counts(
        [[float(order.index(e)) for e in range(num_experts)] for order in live.order], "stale"
    )
    engine.set_ranking(stale)
    assert engine.boundary.order(engine.step_id + 1) is live
    for i, prompt in enumerate(burst(6)):
        engine.add_request(prompt, params, f"r{i}")
    engine.step()
    round_now = RoundState(engine.step_id + 1, len(engine.scheduler.running), 0)
    short = engine.kv.shortfall_in_expert_pages(200)
    want = num_to_evict(short, engine.allocator.num_free(PageType.EXPERT), engine.tunables)
    changes = engine.boundary.move(kv_pages_short=200, round=round_now)
    assert len(changes.evict) == want >= 4
    by_layer: dict[int, list[int]] = {}
    for layer, expert in changes.evict:
        by_layer.setdefault(layer, []).append(expert)
    for layer, experts in by_layer.items():  # each layer gave its live-coldest, coldest first
        assert experts == list(reversed(live.order[layer]))[: len(experts)]
    # the paper's rule keeps the policy's order
    engine.set_tunables(replace(engine.tunables, elastic_rule="paper"))
    assert engine.boundary.order(engine.step_id + 1) is stale
    while engine.has_unfinished_requests():
        engine.step()
    engine.check_invariants()


def test_the_boundary_scales_copies_by_what_decode_steps_measured_over_the_shares(make_engine):
    from rimuru.dataplane.adjust.adjuster import StepShape, expected_copies
    from rimuru.dataplane.engine.sched.boundary import MAX_COPY_SCALE

    engine = offloading(make_engine)
    boundary, meter = engine.boundary, engine.copy_control.meter
    resident = engine.residency.resident_sets()
    shares = boundary.live.ranking(engine.moe_backend, engine.step_id + 1) or engine.ranking
    expected = expected_copies(shares, resident, StepShape(4, boundary.top_k))
    assert expected > 0
    for measured, scale in [(0.0, 1.0), (0.5, 1.0), (1.7, 1.7), (10.0, MAX_COPY_SCALE)]:
        meter.value = measured * expected
        assert boundary.copy_scale(shares, resident, 4) == pytest.approx(scale)
    meter.value = 1.7 * expected
    costs = boundary.costs(4, 4, demand=True, step=engine.step_id + 1)
    assert costs.copy_scale == pytest.approx(1.7)
    while engine.has_unfinished_requests():
        engine.step()
    engine.check_invariants()


def test_live_routing_is_read_only_in_rounds_where_the_boundary_can_move(make_engine):
    roomy = make_engine("elastic", pool_mib=200)  # every request fits: nothing to evict
    roomy.generate(burst(4), SamplingParams(max_tokens=40, ignore_eos=True))
    assert roomy.expert_counters.evictions == 0
    assert roomy.boundary.live.window is None  # 40+ rounds, no read
    tight = offloading(make_engine)  # KV ran short: the rule asked for evictions
    assert tight.boundary.live.window is not None
    while tight.has_unfinished_requests():
        tight.step()
    tight.check_invariants()
