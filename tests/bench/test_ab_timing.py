"""The paged-overhead statistic: per-round ratios, so drift between rounds cancels."""

import pytest


def test_drift_between_rounds_cancels(ab_timing):
    # B is 1% faster than A in every round, while the whole device slows 20% round by round.
    a = [[1.01 * (1 + 0.2 * r)] * 5 for r in range(6)]
    b = [[1.00 * (1 + 0.2 * r)] * 5 for r in range(6)]
    ab = ab_timing.summarize_ab(a, b)
    assert ab.ratio == pytest.approx(1.01)
    assert ab.ratio_q1 == pytest.approx(1.01) and ab.ratio_q3 == pytest.approx(1.01)
    # The pooled medians alone would mix rounds: they are the middle rounds' times.
    assert ab.a_s == pytest.approx(1.01 * 1.5)
    assert ab.rounds == 6


def test_median_ratio_ignores_one_outlier_round(ab_timing):
    a = [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0], [9.0, 9.0, 9.0], [2.0, 2.0, 2.0]]
    b = [[1.0, 1.0, 1.0]] * 4
    ab = ab_timing.summarize_ab(a, b)
    assert ab.ratio == 2.0
    assert ab.ratio_q1 == 2.0 and ab.ratio_q3 == pytest.approx(3.75)


def test_mismatched_rounds_are_refused(ab_timing):
    with pytest.raises(ValueError, match="same number"):
        ab_timing.summarize_ab([[1.0]], [[1.0], [1.0]])
    with pytest.raises(ValueError, match="non-empty"):
        ab_timing.summarize_ab([[1.0], []], [[1.0], [1.0]])
