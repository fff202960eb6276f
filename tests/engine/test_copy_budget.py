"""The elastic adjuster's copy budget (Tunables.copy_budget, adjuster.py) in a whole engine:
fewer experts offloaded, fewer copies, preemption instead, and the same tokens."""

import random
from dataclasses import replace

import pytest

from rimuru.dataplane.adjust.adjuster import StepShape, expected_copies
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.policy import HotnessRanking, Tunables


def a_burst_of_40(engine, max_tokens: int) -> None:
    rng = random.Random(7)
    for i in range(40):
        prompt = [rng.randrange(151_000) for _ in range(rng.randint(40, 110))]
        engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), f"r{i}")


def two_long_then_a_burst(engine, prompts) -> None:
    """Two long requests run alone (the adjuster offloads while few run), then a burst."""
    long = engine.max_kv_tokens() // 3
    for i in range(2):
        engine.add_request([5 + i] * long, SamplingParams(max_tokens=8, ignore_eos=True), f"L{i}")
    for _ in range(3):
        engine.step()
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, SamplingParams(max_tokens=16, ignore_eos=True), f"r{i}")


def test_a_copy_budget_trades_evictions_for_preemptions_and_keeps_the_tokens(prompts, make_engine):
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    want = make_engine("resident").generate(prompts, params)
    # without a budget, under the paper's rule: evictions in the same (ranking's) order as
    # the budget's, where the cost rule's live-routing order would pick other experts
    free = make_engine(
        "elastic", tunables=Tunables(mode="elastic", expert_offload_limit=16, elastic_rule="paper")
    )
    assert free.generate(prompts, params) == want
    # tiny: 32 experts, top-4, no ranking set (uniform): an offloaded expert is routed by a
    # step of B tokens with probability 1 - (1 - 4/32)^B, most of a copy per step
    budget = make_engine(
        "elastic", tunables=Tunables(mode="elastic", expert_offload_limit=16, copy_budget=1.0)
    )
    assert budget.generate(prompts, params) == want
    f, b = free.expert_counters, budget.expert_counters
    assert 0 < b.evictions < f.evictions and b.buffer_copies < f.buffer_copies
    assert budget.scheduler.num_preemptions > free.scheduler.num_preemptions == 0
    budget.check_invariants()
    assert budget.num_leaked_pages() == 0


@pytest.mark.parametrize("budget", [1.0, 2.0])
def test_the_budget_holds_at_every_round_that_evicted(prompts, make_engine, budget):
    """Each eviction was allowed by the expected copies at the batch of its round; it yields
    only to a request running alone."""
    engine = make_engine(
        "elastic", tunables=Tunables(mode="elastic", expert_offload_limit=16, copy_budget=budget)
    )
    checked = []
    move = engine.boundary.move

    def checking(kv_pages_short, round, evict_only=False, apply_copy_budget=True):
        running = len(engine.scheduler.running)
        if not apply_copy_budget:
            assert running == 1, f"the budget yielded with {running} running"
        changes = move(kv_pages_short, round, evict_only, apply_copy_budget)
        if changes.evict and apply_copy_budget and running:
            step = StepShape(max(1, len(engine.scheduler.running)), engine.model_config.top_k)
            copies = expected_copies(engine.ranking, engine.residency.resident_sets(), step)
            checked.append(copies)
            assert copies <= budget
        return changes

    engine.boundary.move = checking
    engine.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    assert checked, "nothing was evicted: the case does not test the budget"


def test_a_lone_request_may_exceed_the_budget_rather_than_preempt_itself(make_engine):
    """The longest request the engine accepts needs the pool's experts offloaded up to the
    limit; a budget that refuses them must not leave it preempting itself forever."""
    tight = Tunables(mode="elastic", expert_offload_limit=16, copy_budget=0.2)
    engine = make_engine("elastic", tunables=tight)
    prompt = [5] * (engine.max_kv_tokens() - 8)
    engine.add_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True), "long")
    for _ in range(300):
        if not engine.has_unfinished_requests():
            break
        engine.step()
    assert not engine.has_unfinished_requests(), "the lone request never finished"
    assert engine.scheduler.num_preemptions == 0 and engine.expert_counters.evictions > 0
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0


def test_with_a_skewed_ranking_the_cold_experts_still_go(prompts, make_engine):
    """The same budget lets far more experts go when the ranking says they are cold."""
    budget = Tunables(mode="elastic", expert_offload_limit=16, copy_budget=1.0)
    uniform = make_engine("elastic", tunables=budget)
    skewed = make_engine("elastic", tunables=budget)
    layers, experts = skewed.model_config.num_layers, skewed.model_config.num_experts
    # half of each layer's experts never routed in the ranking's sample
    counts = [[1.0] * (experts // 2) + [0.0] * (experts - experts // 2)] * layers
    skewed.set_ranking(HotnessRanking.from_counts(counts, source="test: half cold"))
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    assert skewed.generate(prompts, params) == uniform.generate(prompts, params)
    assert skewed.expert_counters.evictions > uniform.expert_counters.evictions
    assert skewed.scheduler.num_preemptions < uniform.scheduler.num_preemptions


@pytest.mark.parametrize("budget", [1.0, 2.0])
def test_the_budget_holds_at_every_step_as_the_batch_grows(prompts, make_engine, budget):
    """Two long requests make the adjuster offload experts while few run; then a burst
    arrives. After every step the experts it offloaded cost at most the budget at the batch
    now running (a request alone may pass it): the admission cap holds the burst back until
    experts return. Without the cap this case reaches 3.5 expected copies per step."""
    engine = make_engine(
        "elastic", tunables=Tunables(mode="elastic", expert_offload_limit=16, copy_budget=budget)
    )
    two_long_then_a_burst(engine, prompts)
    held_back = 0
    for _ in range(2000):
        if not engine.has_unfinished_requests():
            break
        engine.step()
        running = len(engine.scheduler.running)
        step = StepShape(running, engine.model_config.top_k)
        resident = engine.residency.resident_sets()
        copies = expected_copies(engine.ranking, resident, step, engine.copy_control.start_resident)
        assert running <= 1 or copies <= budget + 1e-9, (running, copies)
        held_back += (
            bool(engine.scheduler.waiting)
            and engine.boundary.admit_limit(engine.scheduler.round_state(engine.step_id)) <= running
        )
    assert not engine.has_unfinished_requests()
    assert held_back > 0 and engine.expert_counters.evictions > 0, "the cap never bound"
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0


def test_experts_the_pool_never_held_do_not_hold_the_batch_back(prompts, make_engine):
    """A pool too small for every expert starts with some offloaded: they cost copies the
    adjuster cannot save, so the budget prices only what it evicts itself. Counted, they
    would pass a budget of 0.5 at one request and cap every batch at 1."""
    engine = make_engine(
        "elastic",
        pool_mib=20,
        tunables=Tunables(mode="elastic", expert_offload_limit=16, copy_budget=0.5),
    )
    offloaded = sum(32 - len(r) for r in engine.residency.resident_sets())
    assert offloaded > 4, "the pool holds every expert: the case does not test start-up"
    assert (
        engine.boundary.admit_limit(engine.scheduler.round_state(0)) == engine.config.max_num_seqs
    )
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params, f"r{i}")
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, len(engine.scheduler.running))
    assert peak > 1
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0


def test_evictions_for_a_waiting_request_leave_the_cap_room_to_admit_it(prompts, make_engine):
    """An eviction after a round that left requests waiting makes room for the next one, so
    it is priced at one request more than run now: the cap then lets that request in."""
    engine = make_engine(
        "elastic", tunables=Tunables(mode="elastic", expert_offload_limit=16, copy_budget=2.0)
    )
    checked = []
    move = engine.boundary.move

    def checking(kv_pages_short, round, evict_only=False, apply_copy_budget=True):
        changes = move(kv_pages_short, round, evict_only, apply_copy_budget)
        running = len(engine.scheduler.running)
        if changes.evict and not evict_only and engine.scheduler.waiting and running:
            checked.append(running)
            cap = engine.boundary.admit_limit(engine.scheduler.round_state(round.step))
            assert cap >= min(running + 1, engine.config.max_num_seqs)
        return changes

    engine.boundary.move = checking
    two_long_then_a_burst(engine, prompts)
    while engine.has_unfinished_requests():
        engine.step()
    assert checked, "no eviction made room for a waiting request"


@pytest.mark.parametrize("expert_copy", ["device", "host"])
def test_measured_copies_past_the_budget_stop_evictions_and_admissions(make_engine, expert_copy):
    """A ranking that calls half the experts never routed (tiny routes them all): the model
    prices their eviction at nothing, the decode steps copy them anyway. Once the measured
    copies (CopyMeter) reach the budget, a step evicts nothing and admits no one, unless one
    request runs alone (the budget yields to it). Host copies are counted inside the
    forward, device copy-in after it: the meter sees both."""
    engine = make_engine(
        "elastic",
        expert_copy=expert_copy,
        tunables=Tunables(mode="elastic", expert_offload_limit=16, copy_budget=1.0),
    )
    layers, experts = engine.model_config.num_layers, engine.model_config.num_experts
    wrong = [[1.0] * (experts // 2) + [0.0] * (experts - experts // 2)] * layers
    engine.set_ranking(HotnessRanking.from_counts(wrong, source="test: wrong about what is cold"))
    a_burst_of_40(engine, max_tokens=32)
    held = 0
    while engine.has_unfinished_requests():
        measured, running = engine.copy_control.measured, len(engine.scheduler.running)
        evictions = engine.expert_counters.evictions
        engine.step()
        if measured >= 1.0:
            held += 1
            after = len(engine.scheduler.running)
            assert engine.expert_counters.evictions == evictions or after <= 1
            assert after <= max(1, running)
    assert held > 0, "the measured copies never reached the budget: the case tests nothing"
    assert engine.copy_control.measured == 0.0  # every expert back at the end: nothing held
    engine.check_invariants()
    assert engine.num_leaked_pages() == 0


def test_without_every_expert_at_start_up_the_meter_stays_out(make_engine):
    """The meter cannot tell the copies of experts that never fitted from the adjuster's:
    with some offloaded at start-up it is not used (they would hold admission for good),
    and the model alone prices the budget."""
    engine = make_engine(
        "elastic",
        pool_mib=20,
        tunables=Tunables(mode="elastic", expert_offload_limit=16, copy_budget=0.5),
    )
    a_burst_of_40(engine, max_tokens=16)
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, len(engine.scheduler.running))
        assert engine.copy_control.measured == 0.0
    assert peak > 2 and engine.expert_counters.buffer_copies > 0


def test_the_meter_forgets_a_batch_that_is_gone(make_engine):
    """What one burst measured must not hold the next: the meter reads 0 once nothing runs
    (a server does not step while idle) and when the budget is changed."""
    engine = make_engine(
        "elastic", tunables=Tunables(mode="elastic", expert_offload_limit=16, copy_budget=1.0)
    )
    layers, experts = engine.model_config.num_layers, engine.model_config.num_experts
    wrong = [[1.0] * (experts // 2) + [0.0] * (experts - experts // 2)] * layers
    engine.set_ranking(HotnessRanking.from_counts(wrong, source="test: wrong about what is cold"))
    a_burst_of_40(engine, max_tokens=32)
    while engine.copy_control.measured < 1.0:
        engine.step()
    engine.set_tunables(replace(engine.tunables, copy_budget=2.0))
    assert engine.copy_control.measured == 0.0
    while engine.copy_control.measured < 1.0:
        engine.step()
    for i in range(40):
        engine.abort(f"r{i}")
    engine.step()  # nothing runs: the burst is gone
    assert engine.copy_control.measured == 0.0
    assert engine.residency.num_resident() < layers * experts  # experts are still out
