"""The highest request rate that meets an SLO, in a bounded number of benchmark runs.

The search assumes that meeting the SLO is monotone in the rate (if a rate meets it, every
lower rate does) and brackets the boundary, then narrows it:

    bracket: start, then x2 while it passes (/2 while it fails)   pass ... | ... fail
    bisect:  the midpoint of the last pass and the first fail     lo --- mid --- hi
    stop:    hi / lo <= 1 + rel_tol, or max_runs runs made

Each probe is one full benchmark run, so `max_runs` bounds the search's time. The answer is
the highest rate that passed (None if none did), and the first failing rate above it (None
if every rate tried passed, i.e. the runs ran out while doubling). A failure below a pass
(the assumption broken, e.g. by noise) ends the search, and shows as a first failing rate
below the max rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RateSearch:
    max_rate: float | None  # highest rate that met the SLO; None if none did
    first_failing_rate: float | None  # lowest rate that failed above max_rate
    probes: tuple[tuple[float, bool], ...]  # (rate, met the SLO), in the order run

    @property
    def converged(self) -> bool:
        return self.max_rate is not None and self.first_failing_rate is not None

    def to_dict(self) -> dict:
        return {
            "max_rate": self.max_rate,
            "first_failing_rate": self.first_failing_rate,
            "probes": [{"rate": r, "meets_slo": ok} for r, ok in self.probes],
        }


def search_max_rate(
    meets_slo: Callable[[float], bool],
    start_rate: float = 1.0,
    max_runs: int = 8,
    rel_tol: float = 0.1,
) -> RateSearch:
    """Call `meets_slo(rate)` at most `max_runs` times; see the module docstring."""
    if not (start_rate > 0 and math.isfinite(start_rate)):
        raise ValueError(f"start_rate must be a finite number > 0 requests/s, got {start_rate}")
    if max_runs < 1:
        raise ValueError(f"max_runs must be >= 1, got {max_runs}")
    if not rel_tol > 0:
        raise ValueError(f"rel_tol must be > 0, got {rel_tol}")
    probes: list[tuple[float, bool]] = []
    lo: float | None = None  # highest passing rate
    hi: float | None = None  # lowest failing rate

    def probe(rate: float) -> None:
        nonlocal lo, hi
        ok = bool(meets_slo(rate))
        probes.append((rate, ok))
        if ok:
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)

    rate = start_rate
    while len(probes) < max_runs and (lo is None or hi is None):
        probe(rate)
        rate = rate * 2.0 if hi is None else rate / 2.0
    while len(probes) < max_runs and lo is not None and hi is not None and hi / lo > 1 + rel_tol:
        probe((lo + hi) / 2.0)
    return RateSearch(lo, hi, tuple(probes))
