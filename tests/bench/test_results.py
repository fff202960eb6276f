"""BenchResult JSON files: what is written is what is read back."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from rimuru.dataplane.bench.results import read_results, write_results


def test_round_trip_keeps_records_and_metrics(tmp_path, make_result):
    results = [make_result("resident", 2.0), make_result("elastic", math.inf, elastic=True)]
    path = write_results(tmp_path / "bench.json", results)
    json.loads(path.read_text())  # strict JSON: no Infinity/NaN literals
    loaded = read_results(path)
    assert len(loaded) == 2
    for before, after in zip(results, loaded, strict=True):
        assert after.policy == before.policy
        assert after.steps == before.steps
        assert after.request_metrics == before.request_metrics
        assert after.step_metrics == before.step_metrics
        # token_times are not stored; everything else about a request is.
        assert after.requests == tuple(replace(r, token_times=None) for r in before.requests)
    assert loaded[1].request_rate == math.inf
    assert loaded[1].config["request_rate"] == "inf"
    assert loaded[0].config["budget_bytes"] == 8 << 30


def test_headline_has_the_table_figures(make_result):
    result = make_result("fixed", 4.0)
    row = result.headline()
    assert row["policy"] == "fixed" and row["request_rate"] == 4.0
    assert row["peak_running"] == 40
    assert row["forward_steps"] == 120
    assert row["completed"] == 20
    assert row["evictions"] == sum(i % 3 for i in range(120))
    assert row["predictor_hit_rate"] == pytest.approx(5 / 8)
    assert row["tpot_p50_ms"] == pytest.approx(30.0)


def test_a_foreign_file_is_refused(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"results": []}')
    with pytest.raises(ValueError, match="not a rimuru-bench-results/1 file"):
        read_results(path)


def test_numpy_scalars_from_an_engine_are_written_as_numbers(tmp_path, make_result):
    import numpy as np

    result = make_result("elastic", 1.0)
    steps = [replace(s, num_running=np.int64(s.num_running)) for s in result.steps]
    config = {**result.config, "budget_bytes": np.int64(7), "rate": np.float64(np.inf)}
    result = replace(result, steps=tuple(steps), config=config)
    loaded = read_results(write_results(tmp_path / "np.json", [result]))[0]
    assert loaded.steps == result.steps
    assert loaded.config["budget_bytes"] == 7 and loaded.config["rate"] == "inf"
