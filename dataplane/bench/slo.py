"""A latency SLO for `rimuru bench --slo`, and what a run's records say against it.

An SLO is a set of percentile limits on TTFT and TPOT, written as vLLM's `--goodput` names
its metrics: `ttft_p99=2s,tpot_p99=100ms`. Two judgements of a run follow from it:

- goodput, as vLLM's `--goodput` defines it: the requests per second (over the run's
  duration) of the requests that meet every per-request limit: TTFT within each `ttft_*`
  limit and TPOT within each `tpot_*` limit. A request with one output token has no TPOT
  and meets the TPOT limits (vLLM counts its TPOT as 0). The percentile in a limit's name
  plays no part here: a request is judged by its own latencies.
- whether the run meets the SLO: each named percentile of the run's TTFT / TPOT (numpy's
  linear interpolation, as the summary's p99) is within its limit. This is what the rate
  search asks of each rate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rimuru.dataplane.bench.metrics import RequestRecord

PERCENTILES = (50, 90, 95, 99)
SLO_FORMAT = "METRIC_pNN=LIMIT[,...] with METRIC ttft|tpot, NN 50|90|95|99, LIMIT e.g. 2s or 100ms"
_LIMIT = re.compile(r"^(ttft|tpot)_p(\d+)=([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)(ms|s)$")


@dataclass(frozen=True)
class SLOLimit:
    metric: str  # ttft | tpot
    percentile: int  # 50 | 90 | 95 | 99
    limit_ms: float

    @property
    def name(self) -> str:
        return f"{self.metric}_p{self.percentile}"

    def __str__(self) -> str:
        return f"{self.name}={self.limit_ms:g}ms"


@dataclass(frozen=True)
class SLO:
    limits: tuple[SLOLimit, ...]

    def __str__(self) -> str:
        return ",".join(str(limit) for limit in self.limits)

    def request_meets(self, record: RequestRecord) -> bool:
        """vLLM's per-request goodput test: within every limit of its metric."""
        for limit in self.limits:
            seconds = record.ttft if limit.metric == "ttft" else record.tpot
            if seconds is not None and seconds * 1000.0 > limit.limit_ms:
                return False
        return True

    def evaluate(self, records: Sequence[RequestRecord], duration_s: float) -> SLOReport:
        if not duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s}")
        samples_ms = {
            "ttft": [r.ttft * 1000.0 for r in records],
            "tpot": [r.tpot * 1000.0 for r in records if r.tpot is not None],
        }
        percentiles = {}
        for limit in self.limits:
            ms = samples_ms[limit.metric]
            # No sample (no request with 2+ tokens) is no evidence against the limit.
            percentiles[limit.name] = float(np.percentile(ms, limit.percentile)) if ms else 0.0
        num_good = sum(1 for r in records if self.request_meets(r))
        return SLOReport(
            num_requests=len(records),
            num_good=num_good,
            goodput=num_good / duration_s,
            percentiles_ms=percentiles,
            meets_slo=all(percentiles[x.name] <= x.limit_ms for x in self.limits),
        )


@dataclass(frozen=True)
class SLOReport:
    """One run against an SLO: goodput (requests/s meeting every per-request limit) and
    the run's percentile of each limit (ms), and whether they all meet their limits."""

    num_requests: int
    num_good: int
    goodput: float
    percentiles_ms: dict[str, float]
    meets_slo: bool

    def to_dict(self) -> dict:
        return {
            "num_requests": self.num_requests,
            "num_good": self.num_good,
            "goodput": self.goodput,
            "percentiles_ms": dict(self.percentiles_ms),
            "meets_slo": self.meets_slo,
        }


def parse_slo(text: str) -> SLO:
    """`ttft_p99=2s,tpot_p99=100ms` -> SLO. Each metric-percentile pair at most once."""
    limits: list[SLOLimit] = []
    for part in (p.strip() for p in str(text).split(",")):
        match = _LIMIT.match(part.lower())
        if match is None:
            raise ValueError(f"--slo: cannot read {part!r}; write {SLO_FORMAT}")
        metric, percentile, value, unit = match.groups()
        limit_ms = float(value) * (1000.0 if unit == "s" else 1.0)
        if int(percentile) not in PERCENTILES:
            raise ValueError(f"--slo: percentile p{percentile} in {part!r}; write {SLO_FORMAT}")
        if not (limit_ms > 0 and math.isfinite(limit_ms)):
            raise ValueError(f"--slo: limit in {part!r} must be > 0; write {SLO_FORMAT}")
        limit = SLOLimit(metric, int(percentile), limit_ms)
        if any(x.name == limit.name for x in limits):
            raise ValueError(f"--slo: {limit.name} given twice in {text!r}")
        limits.append(limit)
    return SLO(tuple(limits))
