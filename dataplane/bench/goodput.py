"""`rimuru bench --slo` (and `--find-max-rate`): goodput of each run, each policy's highest
rate meeting the SLO, as tables and the results file's `slo` section.

The search and its runs are shared by the in-process and the `--target` benchmark: both
hand over a `run_at(rate) -> BenchResult` that runs the trace once at that rate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rimuru.dataplane.bench.rate_search import RateSearch, search_max_rate
from rimuru.dataplane.bench.results import BenchResult
from rimuru.dataplane.bench.slo import SLO, SLOReport


def evaluate(slo: SLO, result: BenchResult) -> SLOReport:
    return slo.evaluate(result.requests, result.request_metrics.duration_s)


def find_max_rate(
    run_at: Callable[[float], BenchResult],
    slo: SLO,
    start_rate: float,
    max_runs: int,
    rel_tol: float,
) -> RateSearch:
    return search_max_rate(
        lambda rate: evaluate(slo, run_at(rate)).meets_slo, start_rate, max_runs, rel_tol
    )


def slo_section(
    slo: SLO, results: Sequence[BenchResult], searches: Mapping[str, RateSearch]
) -> dict[str, Any]:
    """The results file's `slo` section: the spec, one report per result (in the order of
    `results`) and, after a search, each policy's search."""
    return {
        "spec": str(slo),
        "runs": [evaluate(slo, r).to_dict() for r in results],
        "max_rate": {policy: search.to_dict() for policy, search in searches.items()},
    }


def format_goodput_table(slo: SLO, results: Sequence[BenchResult]) -> str:
    names = [limit.name for limit in slo.limits]
    rows = [["policy", "rate", "goodput req/s", "good", *(f"{n} ms" for n in names), "meets SLO"]]
    for r in results:
        report = evaluate(slo, r)
        rows.append(
            [
                r.policy,
                f"{r.request_rate:g}",
                f"{report.goodput:.2f}",
                f"{report.num_good}/{report.num_requests}",
                *(f"{report.percentiles_ms[n]:.1f}" for n in names),
                "yes" if report.meets_slo else "no",
            ]
        )
    return align_columns(rows)


def format_max_rate_table(
    slo: SLO, results: Sequence[BenchResult], searches: Mapping[str, RateSearch]
) -> str:
    """One row per policy: the highest rate meeting the SLO, its goodput and percentiles,
    and the first rate that failed (the search's bracket)."""
    names = [limit.name for limit in slo.limits]
    rows = [
        [
            "policy",
            "max rate req/s",
            "goodput req/s",
            *(f"{n} ms" for n in names),
            "failed at",
            "runs",
        ]
    ]
    for policy, search in searches.items():
        at_max = next(
            (r for r in results if r.policy == policy and r.request_rate == search.max_rate), None
        )
        report = evaluate(slo, at_max) if at_max is not None else None
        rows.append(
            [
                policy,
                f"{search.max_rate:g}" if search.max_rate is not None else "none",
                f"{report.goodput:.2f}" if report else "-",
                *(f"{report.percentiles_ms[n]:.1f}" if report else "-" for n in names),
                f"{search.first_failing_rate:g}" if search.first_failing_rate else "-",
                str(len(search.probes)),
            ]
        )
    return align_columns(rows)


def align_columns(rows: list[list[str]]) -> str:
    """Right-aligned columns, a rule under the first (header) row."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
