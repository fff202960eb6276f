"""rimuru.kernels.moe_bench's plain-Python parts: the paged-overhead statistic (per-round
ratios, so drift between rounds cancels) and the GPU scripts' --models list."""

import pytest

from rimuru.kernels import moe_bench


def test_drift_between_rounds_cancels():
    # B is 1% faster than A in every round, while the whole device slows 20% round by round.
    a = [[1.01 * (1 + 0.2 * r)] * 5 for r in range(6)]
    b = [[1.00 * (1 + 0.2 * r)] * 5 for r in range(6)]
    ab = moe_bench.summarize_ab(a, b)
    assert ab.ratio == pytest.approx(1.01)
    assert ab.ratio_q1 == pytest.approx(1.01) and ab.ratio_q3 == pytest.approx(1.01)
    # The pooled medians alone would mix rounds: they are the middle rounds' times.
    assert ab.a_s == pytest.approx(1.01 * 1.5)
    assert ab.rounds == 6


def test_median_ratio_ignores_one_outlier_round():
    a = [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0], [9.0, 9.0, 9.0], [2.0, 2.0, 2.0]]
    b = [[1.0, 1.0, 1.0]] * 4
    ab = moe_bench.summarize_ab(a, b)
    assert ab.ratio == 2.0
    assert ab.ratio_q1 == 2.0 and ab.ratio_q3 == pytest.approx(3.75)


def test_mismatched_rounds_are_refused():
    with pytest.raises(ValueError, match="same number"):
        moe_bench.summarize_ab([[1.0]], [[1.0], [1.0]])
    with pytest.raises(ValueError, match="non-empty"):
        moe_bench.summarize_ab([[1.0], []], [[1.0], [1.0]])


def test_models_are_named_or_all_and_an_unknown_one_is_refused():
    assert moe_bench.model_names("all") == sorted(moe_bench.MODELS)
    assert moe_bench.model_names("qwen3-30b-a3b,mixtral-8x7b") == ["qwen3-30b-a3b", "mixtral-8x7b"]
    with pytest.raises(ValueError, match="unknown models \\['qwen3'\\]"):
        moe_bench.model_names("qwen3")
