"""Gamma arrivals: the rate is exact, draws are reproducible, burstiness sets the spread."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rimuru.dataplane.bench.arrivals import arrival_times, parse_request_rate


def gaps_cv(times: np.ndarray) -> float:
    gaps = np.diff(np.concatenate([[0.0], times]))
    return float(gaps.std() / gaps.mean())


def test_last_request_lands_at_n_over_rate():
    times = arrival_times(1000, request_rate=10.0, seed=1)
    assert times.shape == (1000,)
    assert times[-1] == pytest.approx(100.0, rel=1e-12)
    assert np.all(np.diff(times) >= 0) and times[0] > 0
    # Mean rate over the run is exactly the requested rate.
    assert len(times) / times[-1] == pytest.approx(10.0, rel=1e-12)


def test_same_seed_same_times_other_seed_other_times():
    a = arrival_times(200, 4.0, burstiness=0.5, seed=7)
    assert np.array_equal(a, arrival_times(200, 4.0, burstiness=0.5, seed=7))
    assert not np.array_equal(a, arrival_times(200, 4.0, burstiness=0.5, seed=8))


@pytest.mark.parametrize(("burstiness", "expected_cv"), [(0.25, 2.0), (1.0, 1.0), (4.0, 0.5)])
def test_burstiness_sets_the_coefficient_of_variation(burstiness, expected_cv):
    # Gamma(k) gaps have CV = 1 / sqrt(k); rescaling does not change the CV.
    cv = gaps_cv(arrival_times(20_000, 5.0, burstiness=burstiness, seed=0))
    assert cv == pytest.approx(expected_cv, rel=0.08)


def test_infinite_rate_sends_everything_at_once():
    assert np.array_equal(arrival_times(5, math.inf), np.zeros(5))
    assert arrival_times(0, 3.0).shape == (0,)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="request_rate must be > 0"):
        arrival_times(10, 0.0)
    with pytest.raises(ValueError, match="burstiness must be a finite number > 0"):
        arrival_times(10, 1.0, burstiness=0.0)
    with pytest.raises(ValueError, match="num_requests must be >= 0"):
        arrival_times(-1, 1.0)
    assert parse_request_rate("inf") == math.inf
    assert parse_request_rate("2.5") == 2.5
    for text in ("0", "-1", "fast", "nan"):
        with pytest.raises(ValueError, match="request rate must be a number > 0 or 'inf'"):
            parse_request_rate(text)
