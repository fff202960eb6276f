"""net_changes: ordered change lists netted into what a follower must apply, checked against
the page-table difference it replaces."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rimuru.dataplane.adjust.adjuster import ChangeList, ExpertLoad
from rimuru.dataplane.engine.sched.round_moves import RoundMoves, net_changes


def test_an_expert_moved_travels_as_one_load_and_a_round_trip_not_at_all():
    lists = [
        ChangeList(evict=((0, 1),), load=(ExpertLoad(1, 2, (7, 8, 9)),)),
        ChangeList(evict=((1, 2),), load=(ExpertLoad(0, 1, (10, 11, 12)),)),
        ChangeList(evict=((0, 3),)),
    ]
    assert net_changes(lists) == ChangeList(evict=((0, 3),), load=(ExpertLoad(0, 1, (10, 11, 12)),))


def test_round_counts_only_its_own_moves():
    push = ChangeList(evict=((0, 0), (0, 1)), load=(ExpertLoad(0, 2, (1, 2, 3)),))
    made_room = ChangeList(evict=((1, 4),))
    adjusted = ChangeList(load=(ExpertLoad(1, 5, (4, 5, 6)), ExpertLoad(1, 6, (7, 8, 9))))
    moves = RoundMoves(between=(push,), inside=(made_room, adjusted))
    assert (moves.num_evicted, moves.num_loaded) == (1, 2)
    assert moves.changes == (push, made_room, adjusted)


def _apply(table: dict, changes: ChangeList) -> None:
    for key in changes.evict:
        del table[key]
    for load in changes.load:
        table[(load.layer, load.expert)] = load.pages


@st.composite
def _histories(draw):
    """A starting table and a sequence of valid change lists over 2 layers x 3 experts,
    pages never reused within the sequence (the reclaim defers them past the step)."""
    keys = [(layer, e) for layer in range(2) for e in range(3)]
    next_page = iter(range(0, 10_000, 3))
    table = {k: (p, p + 1, p + 2) for k in keys if draw(st.booleans()) for p in [next(next_page)]}
    start, state, lists = dict(table), dict(table), []
    for _ in range(draw(st.integers(0, 6))):
        resident = sorted(state)
        evict = tuple(k for k in resident if draw(st.booleans()))
        after = set(state) - set(evict)
        load = tuple(
            ExpertLoad(*k, tuple(range(p, p + 3)))
            for k in keys
            if k not in after and draw(st.booleans())
            for p in [next(next_page)]
        )
        changes = ChangeList(evict=evict, load=load)
        _apply(state, changes)
        lists.append(changes)
    return start, lists


@settings(max_examples=300, deadline=None)
@given(_histories())
def test_net_changes_equal_the_table_difference(history):
    start, lists = history
    end = dict(start)
    for changes in lists:
        _apply(end, changes)
    net = net_changes(lists)
    # what a follower applies (loads, then evictions) turns the start into the end
    follower = dict(start)
    for load in net.load:
        follower[(load.layer, load.expert)] = load.pages
    for key in net.evict:
        del follower[key]
    assert follower == end
    # and nothing that did not change travels
    assert all(start.get((x.layer, x.expert)) != x.pages for x in net.load)
    assert all(key in start for key in net.evict)


def test_an_elastic_run_records_each_round_s_own_moves(make_engine, prompts):
    from rimuru.dataplane.engine.sched.request import SamplingParams

    engine = make_engine("elastic")
    start_up = engine.residency.take_moves()  # what the first round would find
    assert len(start_up) == 1 and not start_up[0].evict
    assert len(start_up[0].load) == engine.residency.num_resident()
    engine.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0))
    c = engine.expert_counters
    assert c.evictions > 0 and c.loads > 0  # the pool ran short: the boundary moved
    # per round, the round's moves; summed, the counters (start-up was not counted)
    assert sum(s.evicted for s in engine.stats) == c.evictions
    assert sum(s.loaded for s in engine.stats) == c.loads
    assert [s.evictions for s in engine.stats][-1] == c.evictions
    before = _pages(engine.residency)
    # a reset between rounds (a live push's) is counted in no round; netted, its moves take
    # the table from before to after, as a tensor-parallel follower applies them
    engine.reset_residency()
    pushed = engine.residency.take_moves()
    assert [(bool(c.evict), bool(c.load)) for c in pushed] == [(True, False), (False, True)]
    follower = dict(before)
    net = net_changes(pushed)
    follower.update({(x.layer, x.expert): x.pages for x in net.load})
    for key in net.evict:
        del follower[key]
    assert follower == _pages(engine.residency)


def _pages(residency) -> dict:
    return {
        (layer, e): tuple(residency.table.pages(layer, e))
        for layer, experts in enumerate(residency.resident)
        for e in experts
    }
