"""When each request of a benchmark arrives: gamma-distributed gaps, as vLLM's benchmark does.

Gaps are drawn from Gamma(shape=burstiness, scale=1 / (rate * burstiness)), whose mean is
1 / rate for any burstiness and whose coefficient of variation is 1 / sqrt(burstiness):
burstiness 1 is a Poisson process, < 1 burstier, > 1 more regular. The cumulative times are
then rescaled so that the last request lands at exactly N / rate seconds, so every run of N
requests at one rate spans the same time whatever the draw. Rate `inf` sends all at t = 0.
"""

from __future__ import annotations

import math

import numpy as np


def arrival_times(
    num_requests: int, request_rate: float, burstiness: float = 1.0, seed: int = 0
) -> np.ndarray:
    """Arrival time of each request in seconds from the start, non-decreasing. # [N] float64"""
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if not request_rate > 0:
        raise ValueError(f"request_rate must be > 0 requests/s (or inf), got {request_rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a finite number > 0 (1 = Poisson), got {burstiness}")
    if math.isinf(request_rate) or num_requests == 0:
        return np.zeros(num_requests, dtype=np.float64)
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests)
    times = np.cumsum(gaps)  # [N]
    if times[-1] <= 0:  # every gap underflowed to 0: nothing left to rescale
        raise ValueError(f"burstiness {burstiness} is too small to draw gaps; use >= 0.01")
    return times * ((num_requests / request_rate) / times[-1])


def parse_request_rate(text: str) -> float:
    """A command-line request rate: a positive number of requests/s, or "inf"."""
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not rate > 0:
        raise ValueError(f"request rate must be a number > 0 or 'inf', got {text!r}")
    return rate
