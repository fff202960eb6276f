import pytest

from rimuru.dataplane.adjust.adjuster import (
    ChangeList,
    StepShape,
    decide,
    expected_copies,
    max_batch_within_budget,
    num_to_evict,
    num_to_load,
    reserve,
    route_probability,
)
from rimuru.dataplane.memory.allocator import PageAllocator
from rimuru.dataplane.memory.geometry import MemoryShape, PageGeometry, PageType
from rimuru.policy import HotnessRanking, Tunables

# layer 0: expert 2 hottest ... expert 1 coldest; layer 1: expert 0 hottest ... expert 3 coldest
RANKING = HotnessRanking.from_counts([[30, 5, 40, 25], [50, 20, 20, 10]])
ALL = [frozenset(range(4)), frozenset(range(4))]


def test_paper_worked_examples():
    t = Tunables()
    assert num_to_evict(8, 0, t) == 3  # short 8 -> evict 3
    assert num_to_load(0, 20, t) == 3  # 20 free -> add 3
    assert num_to_evict(0, 1, t) == 1  # nothing short, F < 2 -> evict 1
    assert num_to_evict(0, 2, t) == 0
    assert num_to_load(0, 9, t) == 0 and num_to_load(0, 12, t) == 1
    assert num_to_load(0, 100, t) == 5  # capped by max_grow_per_round


def test_shrink_takes_lowest_probability_first_across_layers():
    d = decide(8, 0, RANKING, ALL, Tunables(expert_offload_limit=4))
    # probabilities: L0 e1=.05, L1 e3=.10, L0 e3=.25, L1 e1/e2=.20 (tie -> id order: e2 ranked later)
    assert d.evict == ((0, 1), (1, 3), (1, 2))
    assert d.load == ()


def test_offload_limit_leaves_layers_out():
    d = decide(8, 0, RANKING, ALL, Tunables(expert_offload_limit=1))
    assert d.evict == ((0, 1), (1, 3))  # one per layer, then no candidates remain
    resident = [frozenset({0, 2, 3}), frozenset({0, 1, 2})]
    assert decide(8, 0, RANKING, resident, Tunables(expert_offload_limit=1)).evict == ()


def test_grow_takes_highest_probability_first():
    resident = [frozenset({2}), frozenset({0})]
    d = decide(0, 20, RANKING, resident, Tunables())
    # offloaded: L0 e0=.30 e3=.25 e1=.05; L1 e1=.2 e2=.2 e3=.1 -> top 3
    assert d.load == ((0, 0), (0, 3), (1, 1))


def test_resident_and_fixed_modes_never_move():
    for mode in ("resident", "fixed"):
        assert decide(8, 0, RANKING, ALL, Tunables(mode=mode)) == decide(
            0, 50, RANKING, ALL, Tunables(mode=mode)
        )
        assert not decide(8, 0, RANKING, ALL, Tunables(mode=mode)).evict


def test_reserve_assigns_pages_until_full():
    g = PageGeometry.from_shape(MemoryShape(2, 4, 16, 16, 1, 2, 4))
    a = PageAllocator(g, 7)
    d = decide(0, 20, RANKING, [frozenset({2}), frozenset({0})], Tunables())
    changes = reserve(d, a, Tunables())
    assert isinstance(changes, ChangeList)
    assert [(x.layer, x.expert, x.pages) for x in changes.load] == [
        (0, 0, (0, 1, 2)),
        (0, 3, (3, 4, 5)),
    ]
    assert a.num_free(PageType.EXPERT) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "turbo"}, "tunables.mode: must be one of"),
        ({"expert_offload_limit": -1}, r"tunables.expert_offload_limit: must be in \[0, "),
        ({"grow_threshold": 2, "shrink_threshold": 2}, "must exceed shrink_threshold"),
        ({"max_grow_per_round": 2.5}, "tunables.max_grow_per_round: must be an integer"),
    ],
)
def test_tunables_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Tunables(**kwargs)


def test_ranking_roundtrip_and_validation(tmp_path):
    path = tmp_path / "hot.json"
    RANKING.save(path)
    again = HotnessRanking.load(path)
    assert again == RANKING
    assert again.order[0] == (2, 0, 3, 1)
    assert again.probability(1, 3) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="permutation"):
        HotnessRanking(((0, 0),), ((0.5, 0.5),))
    with pytest.raises(ValueError, match="non-increasing"):
        HotnessRanking(((0, 1),), ((0.2, 0.8),))
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a hotness ranking"):
        HotnessRanking.load(tmp_path / "bad.json")


def test_ranking_file_missing_fields_is_a_value_error(tmp_path):
    (tmp_path / "r.json").write_text('{"format": "rimuru.hotness/v1"}')
    with pytest.raises(ValueError, match="lacks layers"):
        HotnessRanking.load(tmp_path / "r.json")


# Copy budget: P(routed in a step of B tokens) = 1 - (1 - min(1, K p))^B. With B = 2, K = 1:
# L0 e1 (p .05) .0975, L1 e3 (.10) .19, L1 e2 (.20) .36, L0 e3 (.25) .4375.
STEP = StepShape(tokens=2, top_k=1)


@pytest.mark.parametrize(
    "budget, evicted",
    [
        (0.0, ((0, 1), (1, 3), (1, 2))),  # no budget: as before
        (0.3, ((0, 1), (1, 3))),  # .0975 + .19 = .2875 fits; + .36 would not
        (0.28, ((0, 1),)),  # .2875 > .28: the second is refused, and every hotter one
        (0.05, ()),
    ],
)
def test_copy_budget_stops_shrinking_before_the_expected_copies_pass_it(budget, evicted):
    t = Tunables(expert_offload_limit=4, copy_budget=budget)
    assert decide(8, 0, RANKING, ALL, t, STEP).evict == evicted
    assert decide(8, 0, RANKING, ALL, t).evict == ((0, 1), (1, 3), (1, 2))  # no step: no budget


def test_copy_budget_counts_the_experts_already_offloaded():
    resident = [frozenset({0, 2, 3}), frozenset(range(4))]  # L0 e1 is off: .0975 spent
    assert expected_copies(RANKING, resident, STEP) == pytest.approx(0.0975)
    t = Tunables(expert_offload_limit=4, copy_budget=0.3)
    assert decide(8, 0, RANKING, resident, t, STEP).evict == ((1, 3),)


def test_route_probability_saturates_with_top_k_and_batch():
    assert route_probability(0.3, StepShape(tokens=1, top_k=4)) == 1.0  # K p > 1
    assert route_probability(0.0, StepShape(tokens=1000, top_k=8)) == 0.0
    assert route_probability(0.25, StepShape(tokens=0, top_k=1)) == 0.25  # at least one token
    # uniform routing over 8 experts, top-2, 16 tokens: nearly always routed
    assert route_probability(1 / 8, StepShape(tokens=16, top_k=2)) == pytest.approx(1 - 0.75**16)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "1"])
def test_copy_budget_must_be_a_finite_number_at_least_zero(bad):
    with pytest.raises(ValueError, match="copy_budget"):
        Tunables(copy_budget=bad)


@pytest.mark.parametrize("mode", ["resident", "fixed"])
def test_copy_budget_is_refused_outside_elastic(mode):
    with pytest.raises(ValueError, match="only to mode elastic"):
        Tunables(mode=mode, expert_offload_limit=0, copy_budget=1.0)
    assert Tunables(mode=mode, expert_offload_limit=0, copy_budget=0).copy_budget == 0


def test_an_eviction_that_costs_nothing_is_never_refused():
    ranking = HotnessRanking.from_counts([[5, 4, 1, 0]])  # shares .5 .4 .1 0
    step = StepShape(tokens=4, top_k=1)
    resident = [frozenset({1, 2, 3})]  # e0 off: 1 - .5^4 = .9375, over a budget of .5
    t = Tunables(expert_offload_limit=4, copy_budget=0.5)
    # e3 (never routed) may go; e2 (1 - .9^4 = .34) may not
    assert decide(8, 0, ranking, resident, t, step).evict == ((0, 3),)


def test_probabilities_are_taken_as_shares_of_their_layer():
    """A ranking file need not sum to 1 per layer: the budget divides by the layer's sum."""
    raw = HotnessRanking(((0, 1, 2, 3),), ((0.8, 0.6, 0.4, 0.2),))  # sums to 2
    shares = HotnessRanking(((0, 1, 2, 3),), ((0.4, 0.3, 0.2, 0.1),))
    off = [frozenset({0, 1, 2})]
    assert expected_copies(raw, off, STEP) == expected_copies(shares, off, STEP)
    assert expected_copies(shares, off, STEP) == pytest.approx(1 - 0.9**2)
    t = Tunables(expert_offload_limit=4, copy_budget=0.6)
    assert (
        decide(8, 0, raw, [frozenset(range(4))], t, STEP).evict
        == (decide(8, 0, shares, [frozenset(range(4))], t, STEP).evict)
        == ((0, 3), (0, 2))
    )  # .19 + .36 = .55; + .51 would pass .6
    zeros = HotnessRanking(((0, 1, 2, 3),), ((0.0,) * 4,))  # no traffic yet: as uniform
    assert expected_copies(zeros, off, STEP) == pytest.approx(1 - 0.75**2)


# Admission cap: two layers of four experts at share .25, top-1; e0 offloaded in both, so a
# batch of B costs 2 (1 - .75^B): B = 1 .5, 2 .875, 3 1.156, 4 1.367, 5 1.525.
FLAT = HotnessRanking.from_counts([[1, 1, 1, 1], [1, 1, 1, 1]])
E0_OFF = [frozenset({1, 2, 3}), frozenset({1, 2, 3})]


@pytest.mark.parametrize(
    "budget, limit, cap",
    [(1.0, 256, 2), (1.5, 256, 4), (1.2, 3, 3), (10.0, 256, 256), (0.3, 256, 1)],
)
def test_admission_cap_is_the_largest_batch_within_the_budget(budget, limit, cap):
    assert max_batch_within_budget(FLAT, E0_OFF, 1, budget, limit) == cap


def test_admission_cap_ignores_experts_that_cost_nothing_or_do_not_count():
    assert max_batch_within_budget(FLAT, ALL, 1, 0.1, 64) == 64  # nothing offloaded
    cold = HotnessRanking.from_counts([[1, 1, 1, 0]])  # e3 never routed in the sample
    assert max_batch_within_budget(cold, [frozenset({0, 1, 2})], 8, 0.01, 64) == 64
    # L1's e0 was offloaded at start-up: only L0's counts, 1 - .75^B: B = 3 .578, 4 .684
    counted = [frozenset(range(4)), frozenset({1, 2, 3})]
    assert max_batch_within_budget(FLAT, E0_OFF, 1, 0.6, 64, counted) == 3


def test_admission_cap_agrees_with_expected_copies():
    """The bisection in torch against the plain sum, over random rankings and residencies."""
    import random

    rng = random.Random(3)
    for _ in range(40):
        ranking = HotnessRanking.from_counts(
            [[rng.choice([0, 1, 5, 20]) for _ in range(6)] for _ in range(3)]
        )
        resident = [frozenset(e for e in range(6) if rng.random() < 0.6) for _ in range(3)]
        top_k, budget, limit = rng.choice([1, 2]), rng.uniform(0.05, 3.0), rng.choice([1, 7, 40])
        fits = [
            b
            for b in range(1, limit + 1)
            if expected_copies(ranking, resident, StepShape(b, top_k)) <= budget + 1e-12
        ]
        assert max_batch_within_budget(ranking, resident, top_k, budget, limit) == max(
            fits, default=1
        )


def test_experts_offloaded_at_start_up_are_outside_the_budget():
    """L0 e1 (.0975 at B = 2) never fitted: with it counted a budget of .2 refuses L1 e3
    (.19); priced from the start-up residency, it is free and L1 e3 goes."""
    start = [frozenset({0, 2, 3}), frozenset(range(4))]
    t = Tunables(expert_offload_limit=4, copy_budget=0.2)
    assert decide(8, 0, RANKING, start, t, STEP).evict == ()
    assert decide(8, 0, RANKING, start, t, STEP, counted=start).evict == ((1, 3),)
    assert expected_copies(RANKING, start, STEP, counted=start) == 0.0


def test_measured_copies_count_when_they_exceed_the_expectation():
    """The engine's measured copies per decode step stand in for the ranking's expectation
    when larger; at or past the budget nothing is evicted, not even an expert the ranking
    calls free."""
    t = Tunables(expert_offload_limit=4, copy_budget=0.3)
    assert decide(8, 0, RANKING, ALL, t, STEP, measured=0.2).evict == ((0, 1),)  # .1 left
    assert decide(8, 0, RANKING, ALL, t, STEP, measured=0.0).evict == ((0, 1), (1, 3))
    assert decide(8, 0, RANKING, ALL, t, STEP, measured=0.3).evict == ()
    cold = HotnessRanking.from_counts([[5, 4, 1, 0]])  # e3 "never routed"
    t = Tunables(expert_offload_limit=4, copy_budget=0.5)
    full = [frozenset(range(4))]
    # e3 free, e2 1 - .9^4 = .34; e1 (.87) would pass .5
    assert decide(8, 0, cold, full, t, StepShape(4, 1)).evict == ((0, 3), (0, 2))
    assert decide(8, 0, cold, full, t, StepShape(4, 1), measured=0.6).evict == ()


def test_loads_skip_layers_with_every_expert_resident_and_take_the_hottest_missing():
    from rimuru.dataplane.adjust.adjuster import hottest

    ranking = HotnessRanking.from_counts([[30, 5, 40, 25], [50, 20, 20, 10], [1, 2, 3, 4]])
    resident = [frozenset(range(4)), frozenset({0, 1}), frozenset({0, 1, 2})]
    # missing: L1 e2 (.20), L1 e3 (.10), L2 e3 (.40): hottest first across layers
    assert hottest(5, ranking, resident) == ((2, 3), (1, 2), (1, 3))
    assert hottest(5, ranking, [frozenset(range(4))] * 3) == ()
