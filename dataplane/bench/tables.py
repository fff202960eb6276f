"""The tables `rimuru bench` prints, in process or against a server (remote.py)."""

from __future__ import annotations

from rimuru.dataplane.bench.goodput import (
    align_columns,
    format_goodput_table,
    format_max_rate_table,
)
from rimuru.dataplane.bench.rate_search import RateSearch
from rimuru.dataplane.bench.results import BenchResult
from rimuru.dataplane.bench.slo import SLO

COLUMNS = (
    ("policy", "policy", "{}"),
    ("rate", "request_rate", "{:g}"),
    ("peak conc", "peak_running", "{}"),
    ("steps", "forward_steps", "{}"),
    ("out tok/s", "output_tok_s", "{:.1f}"),
    ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p99 ms", "ttft_p99_ms", "{:.0f}"),
    ("TPOT p50 ms", "tpot_p50_ms", "{:.1f}"),
    ("TPOT p99 ms", "tpot_p99_ms", "{:.1f}"),
    ("preempt", "preemptions", "{}"),
    ("evict", "evictions", "{}"),
    ("loads", "loads", "{}"),
)


def format_table(results: list[BenchResult]) -> str:
    rows = [[title for title, _, _ in COLUMNS]]
    for r in results:
        h = r.headline()
        rows.append([fmt.format(h[key]) if h[key] is not None else "-" for _, key, fmt in COLUMNS])
    return align_columns(rows)


def print_slo_tables(
    slo: SLO | None, results: list[BenchResult], searches: dict[str, RateSearch]
) -> None:
    if slo is None:
        return
    print(f"\nSLO {slo}: goodput = requests/s within every limit")
    print(format_goodput_table(slo, results))
    if searches:
        print("\nhighest request rate meeting the SLO")
        print(format_max_rate_table(slo, results, searches))
