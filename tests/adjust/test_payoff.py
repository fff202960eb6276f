"""The cost rule's decisions (payoff.py through adjuster.decide) on constructed cases."""

from dataclasses import replace

import pytest

from rimuru.dataplane.adjust.adjuster import StepShape, decide, route_probability
from rimuru.dataplane.adjust.payoff import DECODE_ONLY, CostView, StepCost, StepMix, eviction_pays
from rimuru.policy import HotnessRanking, InvalidPolicy, Tunables

# layer 0: expert 2 hottest ... expert 1 coldest; layer 1: expert 0 hottest ... expert 3 coldest
# coldest first: L0 e1 (share .05), L1 e3 (.10), L1 e2 (.20)
RANKING = HotnessRanking.from_counts([[30, 5, 40, 25], [50, 20, 20, 10]])
ALL = [frozenset(range(4)), frozenset(range(4))]
COST = Tunables(expert_offload_limit=4)  # elastic_rule "cost" is the default
PAPER = Tunables(expert_offload_limit=4, elastic_rule="paper")
STEP = StepShape(tokens=2, top_k=1)  # only top_k is read by the cost rule


def view(
    batch: int, per_copy: float, *, demand=True, slo=None, per_seq=0.0, mix=DECODE_ONLY
) -> CostView:
    return CostView(StepCost(0.020, per_seq, per_copy), batch, 0.0, 0.5, demand, slo, mix=mix)


def test_offloading_pays_while_the_batch_is_small_against_its_copies():
    # B = 2: each eviction adds half a request (10 ms of fixed step time per half request)
    # against at most 2.5 x 1 ms of copies: all three go, as under the paper's rule
    d = decide(8, 0, RANKING, ALL, COST, STEP, costs=view(2, 0.001))
    assert d.evict == ((0, 1), (1, 3), (1, 2)) == decide(8, 0, RANKING, ALL, PAPER, STEP).evict


def test_offloading_that_cannot_pay_evicts_nothing():
    # a slow bus (100 ms a copy) at B = 50: half a request never buys a copy in most steps
    assert decide(8, 0, RANKING, ALL, COST, STEP, costs=view(50, 0.1)).evict == ()
    # the paper's rule evicts regardless
    assert decide(8, 0, RANKING, ALL, PAPER, STEP, costs=view(50, 0.1)).evict != ()


def test_the_first_eviction_that_does_not_pay_ends_the_round():
    # B = 10, 2 ms a copy. L0 e1 at B 11: dc = 1 - .95^11 = .4312; .5 x 20 ms = 10 ms >
    # 10 x 2 ms x .4312 = 8.6 ms: pays. L1 e3: dc = 1 - .9^11 = .6862; .5 x (20 + 2 x .4312)
    # = 10.4 ms < 10.5 x 2 x .6862 = 14.4 ms: does not, nor any hotter one after it.
    assert decide(8, 0, RANKING, ALL, COST, STEP, costs=view(10, 0.002)).evict == ((0, 1),)


@pytest.mark.parametrize(("slo", "evicted"), [(0.0204, ((0, 1),)), (0.0203, ())])
def test_an_eviction_may_not_push_the_step_past_the_tpot_slo(slo, evicted):
    # T(2.5, .1426) = 20 + .25 + .1426 ms = 20.39 ms; the second, at B 3 with .4136 copies,
    # would take 20.71 ms
    costs = view(2, 0.001, slo=slo, per_seq=0.0001)
    assert decide(8, 0, RANKING, ALL, COST, STEP, costs=costs).evict == evicted


def test_without_waiting_or_short_requests_pages_buy_nothing():
    # nothing short, 1 free expert page: the paper's rule evicts one for headroom
    assert decide(0, 1, RANKING, ALL, PAPER, STEP).evict == ((0, 1),)
    assert decide(0, 1, RANKING, ALL, COST, STEP, costs=view(2, 0.0, demand=False)).evict == ()


def test_an_expert_never_routed_always_pays_where_pages_are_wanted():
    free = CostView(StepCost(0.02, 0.0, 1.0), 500, 0.0, 0.01, True)
    assert eviction_pays(free, 0, 0.0, 0.0)
    assert not eviction_pays(free, 0, 0.0, 1e-3)


def test_loads_follow_the_grow_rule_under_either_rule():
    resident = [frozenset({0, 2, 3}), frozenset({0, 1, 2})]
    for t in (COST, PAPER):
        assert decide(0, 20, RANKING, resident, t, STEP, costs=view(2, 0.1)).load == (
            (1, 3),
            (0, 1),
        )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"elastic_rule": "greedy"}, "tunables.elastic_rule"),
        ({"tpot_slo_ms": -1.0}, "tunables.tpot_slo_ms"),
        ({"tpot_slo_ms": float("nan")}, "tunables.tpot_slo_ms"),
        ({"tpot_slo_ms": 50.0, "elastic_rule": "paper"}, "tunables.tpot_slo_ms"),
        ({"tpot_slo_ms": 50.0, "mode": "resident"}, "tunables.tpot_slo_ms"),
    ],
)
def test_bad_rules_and_slos_are_refused(kwargs, field):
    with pytest.raises(InvalidPolicy) as raised:
        Tunables(**kwargs)
    assert raised.value.field == field


def test_a_step_cost_needs_a_positive_fixed_part():
    with pytest.raises(ValueError, match="fixed > 0"):
        StepCost(0.0, 0.0, 0.001)


def test_the_rule_and_the_slo_travel_on_the_wire_and_an_unknown_rule_is_refused():
    from rimuru.policy_proto import tunables_from_proto, tunables_to_proto

    t = Tunables(elastic_rule="paper")
    assert tunables_from_proto(tunables_to_proto(t)) == t
    t = Tunables(tpot_slo_ms=45.5)
    assert tunables_from_proto(tunables_to_proto(t)) == t
    # a client that predates the fields sends neither: the cost rule, no SLO
    msg = tunables_to_proto(Tunables())
    msg.ClearField("elastic_rule")
    msg.ClearField("tpot_slo_ms")
    assert tunables_from_proto(msg) == Tunables()
    msg.elastic_rule = 7
    with pytest.raises(InvalidPolicy) as raised:
        tunables_from_proto(msg)
    assert raised.value.field == "tunables.elastic_rule"


def test_recent_routing_prices_an_expert_the_ranking_calls_cold():
    # B = 10, 2 ms a copy: by the ranking L0 e1 (share .05) pays (test above); if recent
    # routing gives it half of layer 0's pairs, its copy is in nearly every step: it does not
    live = HotnessRanking.from_counts([[20, 50, 20, 10], [50, 20, 20, 10]], "live")
    priced = CostView(StepCost(0.020, 0.0, 0.002), 10, 0.0, 0.5, True, prices=live)
    assert decide(8, 0, RANKING, ALL, COST, STEP, costs=priced).evict == ()


def test_past_the_slo_by_measurement_nothing_more_is_evicted():
    # the model says the first eviction stays within 20.4 ms, but steps already take 25 ms
    costs = CostView(StepCost(0.020, 0.0001, 0.001), 2, 0.0, 0.5, True, 0.0204, None, 0.025)
    assert costs.over_slo
    assert decide(8, 0, RANKING, ALL, COST, STEP, costs=costs).evict == ()
    within = CostView(StepCost(0.020, 0.0001, 0.001), 2, 0.0, 0.5, True, 0.0204, None, 0.019)
    assert decide(8, 0, RANKING, ALL, COST, STEP, costs=within).evict == ((0, 1),)


# Half the steps carry a prompt chunk of 40 tokens beyond their decodes.
HALF_MIXED = StepMix(mixed_share=0.5, extra_tokens=40)


def test_prompt_chunks_make_an_eviction_that_pays_for_decodes_alone_not_pay():
    # B = 10, 2 ms a copy: decode-only, L0 e1 pays (dc .4312, 8.6 ms < 10 ms: above). With
    # half the steps routing 11 + 40 tokens it is copied in 1 - .95^51 = .9270 of those:
    # dc = (.4312 + .9270) / 2 = .6791, and 10 x 2 ms x .6791 = 13.6 ms > 10 ms
    assert decide(8, 0, RANKING, ALL, COST, STEP, costs=view(10, 0.002)).evict == ((0, 1),)
    mixed = view(10, 0.002, mix=HALF_MIXED)
    assert decide(8, 0, RANKING, ALL, COST, STEP, costs=mixed).evict == ()


def test_with_few_requests_evictions_pay_even_when_every_step_copies_them():
    # weights that just fit: B = 2, 1 ms a copy, every step a prompt chunk of 500 tokens
    # (dc = 1 each): half a request buys 10, 10.5, 11 ms of step time against 2, 2.5, 3 ms
    every = view(2, 0.001, mix=StepMix(mixed_share=1.0, extra_tokens=500))
    assert decide(8, 0, RANKING, ALL, COST, STEP, costs=every).evict == ((0, 1), (1, 3), (1, 2))


@pytest.mark.parametrize(
    ("mix", "slo", "evicted"),
    [
        (DECODE_ONLY, 0.0204, ((0, 1),)),  # decode-only: 20.39 ms (above)
        (StepMix(1.0, 500), 0.0204, ()),  # every step copies it: 20.25 + 1 ms
        (StepMix(1.0, 500), 0.0213, ((0, 1),)),  # 21.25 ms in; the second, 22.3 ms, not
        (StepMix(1.0, 500), 0.0212, ()),
    ],
)
def test_the_tpot_slo_prices_the_copies_the_mixed_steps_make(mix, slo, evicted):
    costs = view(2, 0.001, slo=slo, per_seq=0.0001, mix=mix)
    assert decide(8, 0, RANKING, ALL, COST, STEP, costs=costs).evict == evicted


def test_the_paper_rule_ignores_the_step_mix():
    costs = view(50, 0.1, mix=HALF_MIXED)
    assert (
        decide(8, 0, RANKING, ALL, PAPER, STEP, costs=costs).evict
        == decide(8, 0, RANKING, ALL, PAPER, STEP).evict
        == ((0, 1), (1, 3), (1, 2))
    )


def test_a_mix_prices_each_kind_of_step_not_the_mean_tokens():
    p, step = 0.05, StepShape(11, 1, HALF_MIXED)
    decode, mixed = 1 - 0.95**11, 1 - 0.95**51
    assert route_probability(p, step) == pytest.approx((decode + mixed) / 2)
    # q is concave in the tokens: the mean step (31 tokens) would overprice the copy
    assert route_probability(p, step) < route_probability(p, StepShape(31, 1))
    assert route_probability(p, StepShape(11, 1, DECODE_ONLY)) == decode


@pytest.mark.parametrize(("share", "extra"), [(-0.1, 0), (1.5, 0), (0.5, -1)])
def test_a_step_mix_out_of_range_is_refused(share, extra):
    with pytest.raises(ValueError, match="step mix"):
        StepMix(share, extra)


def test_copies_priced_up_by_what_decode_steps_measured_stop_an_eviction():
    # B = 10, 2 ms a copy: L0 e1 pays at the shares' dc (.4312: 8.6 ms < 10 ms). Measured
    # steps made 1.5x the copies the shares expect: 1.5 x 8.6 = 12.9 ms > 10 ms
    scaled = replace(view(10, 0.002), copy_scale=1.5)
    assert decide(8, 0, RANKING, ALL, COST, STEP, costs=scaled).evict == ()
    # one eviction, dc .45: .5 x 20 ms = 10 ms against 10 x 2 ms x .45 = 9 ms, x 1.2 = 10.8
    assert eviction_pays(view(10, 0.002), 0, 0.0, 0.45)
    assert not eviction_pays(replace(view(10, 0.002), copy_scale=1.2), 0, 0.0, 0.45)


def test_a_copy_scale_below_one_is_refused():
    with pytest.raises(ValueError, match="copy_scale"):
        replace(view(10, 0.002), copy_scale=0.9)
