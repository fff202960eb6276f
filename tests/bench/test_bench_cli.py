"""`rimuru bench` end to end on the CPU: three policies, one trace, one budget."""

import json

from rimuru.cli import main


def test_bench_runs_three_policies_and_writes_results(tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--num-prompts",
            "60",
            "--output-dir",
            str(out),
            "--no-progress",
            "--profile-prompts",
            "8",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "resident" in printed and "elastic" in printed and "peak conc" in printed
    data = json.loads((out / "results.json").read_text())
    runs = {r["policy"]: r for r in data["results"]}
    assert set(runs) == {"resident", "fixed", "elastic"}
    for run in runs.values():
        assert run["request_metrics"]["num_completed"] == 60
    assert (out / "fig4_memory_split.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "hotness.json").exists()
    peak = {p: r["step_metrics"]["peak_running"] for p, r in runs.items()}
    assert peak["elastic"] > peak["resident"]


def test_bench_rejects_unknown_policy(tmp_path, capsys):
    code = main(["bench", "--policies", "turbo", "--output-dir", str(tmp_path)])
    assert code == 2
    assert (
        "unknown policy ['turbo']: choose from resident, fixed, elastic" in capsys.readouterr().err
    )


def test_bench_budget_too_small_says_what_fits(tmp_path, capsys):
    code = main(
        ["bench", "--memory-budget", "64MiB", "--output-dir", str(tmp_path), "--num-prompts", "2"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot hold the non-pool weights" in err and "give at least" in err


def test_each_rate_of_a_sweep_starts_from_start_up_residency(tmp_path, capsys):
    """One engine serves every rate; the burst's evictions must not carry over into the next
    rate, or results would depend on the order of the rates."""
    out = tmp_path / "sweep"
    code = main(
        ["bench", "--policies", "elastic", "--request-rate", "inf,50", "--num-prompts", "20",
         "--output-dir", str(out), "--no-progress", "--profile-prompts", "4"]
    )  # fmt: skip
    assert code == 0
    first, second = json.loads((out / "results.json").read_text())["results"]
    assert first["step_metrics"]["total_evictions"] > 0, "the burst evicted nothing"
    start = first["config"]["experts_resident_at_start"]
    assert second["config"]["experts_resident_at_start"] == start
    assert first["step_metrics"]["min_experts_resident"] < start
