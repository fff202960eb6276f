"""The SLO spec, goodput on hand-built records, and the rate search on a fake run."""

import math

import pytest

from rimuru.cli import main
from rimuru.dataplane.bench.metrics import RequestRecord
from rimuru.dataplane.bench.rate_search import search_max_rate
from rimuru.dataplane.bench.slo import SLO, SLOLimit, parse_slo


def test_parse_slo_reads_units_and_percentiles():
    slo = parse_slo("ttft_p99=2s, tpot_p99=100ms,ttft_p50=0.5s,tpot_p90=1.5e1ms,TPOT_P95=20MS")
    assert slo.limits == (
        SLOLimit("ttft", 99, 2000.0),
        SLOLimit("tpot", 99, 100.0),
        SLOLimit("ttft", 50, 500.0),
        SLOLimit("tpot", 90, 15.0),
        SLOLimit("tpot", 95, 20.0),
    )
    assert str(parse_slo("ttft_p99=2s")) == "ttft_p99=2000ms"


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("", "cannot read ''"),
        ("ttft_p99=2", "cannot read 'ttft_p99=2'"),  # no unit
        ("ttft_p99:2s", "cannot read"),  # vLLM's own KEY:VALUE syntax
        ("e2el_p99=2s", "cannot read"),
        ("ttft_p98=2s", "percentile p98"),
        ("ttft_p99=0ms", "must be > 0"),
        ("ttft_p99=2s,ttft_p99=3s", "ttft_p99 given twice"),
        ("ttft_p99=2s,", "cannot read ''"),
    ],
)
def test_parse_slo_refuses_bad_specs_and_says_the_format(spec, why):
    with pytest.raises(ValueError, match=why) as error:
        parse_slo(spec)
    assert "ttft|tpot" in str(error.value) or "given twice" in str(error.value)


def test_a_bad_slo_exits_2_before_anything_runs(tmp_path, capsys):
    code = main(["bench", "--slo", "ttft=2s", "--output-dir", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--slo: cannot read 'ttft=2s'" in err and "METRIC_pNN=LIMIT" in err
    assert not (tmp_path / "out").exists()


def _record(request_id, arrival, ttft, tpot, output_len):
    times = [arrival + ttft + tpot * k for k in range(output_len)]
    return RequestRecord.from_token_times(request_id, arrival, 8, times)


def test_goodput_counts_requests_within_every_limit():
    slo = parse_slo("ttft_p99=1s,tpot_p50=125ms")
    records = [
        _record("ok", 0.0, 0.5, 0.05, 5),
        _record("ok-at-limits", 1.0, 1.0, 0.125, 3),  # exact in binary
        _record("slow-ttft", 2.0, 1.5, 0.05, 5),
        _record("slow-tpot", 3.0, 0.2, 0.25, 5),
        _record("one-token", 4.0, 0.9, 0.0, 1),  # no TPOT: meets the TPOT limit
    ]
    report = slo.evaluate(records, duration_s=10.0)
    assert report.num_requests == 5 and report.num_good == 3
    assert report.goodput == pytest.approx(0.3)
    # TTFT [0.5, 1.0, 1.5, 0.2, 0.9] s: p99 by linear interpolation = 1.48 s
    assert report.percentiles_ms["ttft_p99"] == pytest.approx(1480.0)
    # TPOT of the four with 2+ tokens [50, 125, 50, 250] ms: median 87.5 ms
    assert report.percentiles_ms["tpot_p50"] == pytest.approx(87.5)
    assert not report.meets_slo  # TTFT p99 1.48 s > 1 s
    assert parse_slo("ttft_p99=1.5s,tpot_p50=88ms").evaluate(records, 10.0).meets_slo


def test_goodput_of_no_requests_is_zero_and_meets_nothing_wrong():
    report = SLO((SLOLimit("tpot", 99, 10.0),)).evaluate([], duration_s=2.0)
    assert (report.num_good, report.goodput, report.meets_slo) == (0, 0.0, True)


def _fake_run(capacity):
    calls = []

    def meets_slo(rate):
        calls.append(rate)
        return rate <= capacity

    return meets_slo, calls


@pytest.mark.parametrize("capacity", [0.3, 1.0, 3.7, 11.0, 100.0])
def test_search_brackets_then_bisects_to_the_capacity(capacity):
    meets_slo, calls = _fake_run(capacity)
    search = search_max_rate(meets_slo, start_rate=1.0, max_runs=12, rel_tol=0.05)
    assert search.converged
    assert search.max_rate <= capacity < search.first_failing_rate
    assert search.first_failing_rate / search.max_rate <= 1.05
    assert len(calls) <= 12 and [r for r, _ in search.probes] == calls


def test_search_exact_probes_on_a_known_capacity():
    meets_slo, calls = _fake_run(5.0)
    search = search_max_rate(meets_slo, start_rate=1.0, max_runs=10, rel_tol=0.1)
    # 1, 2, 4 pass, 8 fails; then 6 fails, 5 passes, 5.5 fails: 5.5 / 5 <= 1.1
    assert calls == [1.0, 2.0, 4.0, 8.0, 6.0, 5.0, 5.5]
    assert (search.max_rate, search.first_failing_rate) == (5.0, 5.5)


def test_search_stops_at_max_runs():
    meets_slo, calls = _fake_run(math.inf)
    search = search_max_rate(meets_slo, start_rate=1.0, max_runs=4)
    assert calls == [1.0, 2.0, 4.0, 8.0]
    assert (search.max_rate, search.first_failing_rate, search.converged) == (8.0, None, False)
    meets_slo, calls = _fake_run(0.0)
    search = search_max_rate(meets_slo, start_rate=1.0, max_runs=3)
    assert calls == [1.0, 0.5, 0.25] and search.max_rate is None


def test_search_refuses_a_bad_start():
    with pytest.raises(ValueError, match="start_rate must be a finite number > 0"):
        search_max_rate(lambda r: True, start_rate=math.inf)
