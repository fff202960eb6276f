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
