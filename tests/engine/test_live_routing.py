"""Recent routing for the cost rule's prices (engine/experts/live_routing.py): a decayed window of
the MoE backend's cumulative counts, read every few steps."""

import random

import pytest

from rimuru.dataplane.engine.experts.live_routing import LiveRouting


def test_the_window_decays_old_routing_and_adds_the_new():
    live = LiveRouting(decay=0.5, min_tokens=10)
    live.observe([[5, 5], [1, 1]])
    assert live.ranking_now is None  # layer 1 routed 2 pairs: too thin to price by
    live.observe([[10, 5], [20, 1]])
    assert live.window == [[7.5, 2.5], [19.5, 0.5]]
    # each expert counts one pair more than routed (UNSEEN_PAIRS), then the counts are
    # shrunk: two reads at decay .5 make chance's variance (1 + .25) / (1 + .5) = 5/6 of the
    # mean. Layer 0, [8.5, 3.5]: mean 6, variance 6.25, keep 1 - 5/6 * 6 / 6.25 = .2 of the
    # distance: [6.5, 5.5]. Layer 1, [20.5, 1.5]: mean 11, variance 90.25, keep .89843
    assert live.ranking_now.share(0, 0) == pytest.approx(6.5 / 12)
    assert live.ranking_now.share(1, 1) == pytest.approx((11 - 9.5 * (1 - 5 / 6 * 11 / 90.25)) / 22)


def test_an_expert_unseen_in_the_window_is_priced_as_rare_not_free():
    live = LiveRouting(decay=0.5, min_tokens=10)
    live.observe([[0, 30, 10]])
    assert live.ranking_now.order[0] == (1, 2, 0)
    # [1, 31, 11]: mean 43/3, variance 1400/9; one read: chance's variance is the mean
    keep = 1 - (43 / 3) / (1400 / 9)
    assert live.ranking_now.share(0, 0) == pytest.approx((43 / 3 - keep * 40 / 3) / 43)


def test_counts_that_differ_by_chance_alone_are_priced_alike_and_skewed_ones_as_counted():
    rng = random.Random(5)
    uniform = [0] * 64
    for _ in range(64 * 80):  # 80 pairs an expert, drawn at random: the spread is chance's
        uniform[rng.randrange(64)] += 1
    skewed = [4000 // (e + 1) for e in range(64)]  # a Zipf law: the spread is real
    live = LiveRouting(min_tokens=10)
    live.observe([uniform, skewed])
    coldest = min(range(64), key=uniform.__getitem__)
    assert uniform[coldest] < 0.85 * 80  # the window calls it cold ...
    assert live.ranking_now.share(0, coldest) > 0.95 / 64  # ... its price is about the mean's
    assert live.ranking_now.share(1, 63) == pytest.approx((skewed[63] + 1) / sum(skewed), rel=0.05)


def test_counts_that_went_down_were_reset_and_count_whole():
    live = LiveRouting(decay=0.5, min_tokens=1)
    live.observe([[10, 10]])
    live.observe([[3, 1]])  # a hotness profile reset them in between
    assert live.window == [[8.0, 6.0]]


def test_the_engine_reads_routing_every_refresh_steps(make_engine):
    engine = make_engine("elastic")
    engine.generate([[11, 12, 13] * 30], None)
    live = LiveRouting(refresh_steps=4, min_tokens=1)
    assert live.ranking(engine.moe_backend, step=0) is not None  # read at once
    counts = engine.moe_backend.routing_counts.tolist()
    assert live.window == [[float(c) for c in row] for row in counts]
    engine.generate([[7, 8, 9] * 30], None)
    live.ranking(engine.moe_backend, step=3)  # not yet due: the window stands
    assert live.window == [[float(c) for c in row] for row in counts]
    live.ranking(engine.moe_backend, step=4)
    assert live.window != [[float(c) for c in row] for row in counts]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="refresh_steps >= 1"):
        LiveRouting(refresh_steps=0)
