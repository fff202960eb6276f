"""`rimuru bench` end to end on the CPU: three policies, one trace, one budget."""

import json

import pytest

from rimuru.cli import main
from rimuru.dataplane.bench.trace import Trace, TraceRequest, save_trace


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


@pytest.mark.parametrize(
    ("flag", "value"), [("--profile-prompts", "-1"), ("--threads", "-1"), ("--num-prompts", "0")]
)
def test_bench_counts_below_one_are_usage_errors(flag, value, tmp_path, capsys):
    """--profile-prompts -1 used to profile on all but the last prompt, --threads -1 ran 1."""
    with pytest.raises(SystemExit) as exit_:
        main(["bench", flag, value, "--output-dir", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert f"argument {flag}: must be >= 1, got {value}" in capsys.readouterr().err


def test_bench_refuses_more_prompts_than_the_trace_has(tmp_path, capsys):
    code = main(["bench", "--num-prompts", "5000", "--output-dir", str(tmp_path / "out")])
    assert code == 2
    assert "trace 'sharegpt_qwen_cpu' has 200 requests" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bench_refuses_a_bad_burstiness_before_building_an_engine(tmp_path, capsys):
    code = main(["bench", "--burstiness", "0", "--output-dir", str(tmp_path / "out")])
    assert code == 2
    assert "burstiness must be a finite number > 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing ran: no hotness.json written


def test_bench_refuses_a_trace_beyond_the_models_vocabulary_before_building(tmp_path, capsys):
    # `tiny` has Qwen's 151,936 ids; one prompt token past them, as another tokenizer's might be
    trace = Trace("foreign", [TraceRequest((1, 200_000, 3), 4), TraceRequest((5,), 4)])
    path = save_trace(trace, tmp_path / "foreign.npz")
    code = main(["bench", "--trace", str(path), "--output-dir", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "trace 'foreign' holds token ids up to 200000" in err
    assert "model 'tiny' has a vocabulary of 151936" in err and "save_trace" in err
    assert not (tmp_path / "out").exists()


def test_an_os_error_is_reported_without_a_traceback(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["bench", "--num-prompts", "1", "--output-dir", str(blocker)])
    assert code == 2
    assert f"rimuru bench: [Errno 17] File exists: '{blocker}'" in capsys.readouterr().err


def test_profile_hotness_refuses_a_negative_prompt_cut(tmp_path, capsys):
    """--max-prompt-tokens -5 used to drop each prompt's last 5 tokens."""
    with pytest.raises(SystemExit) as exit_:
        main(["profile-hotness", "--max-prompt-tokens", "-5", "-o", str(tmp_path / "h.json")])
    assert exit_.value.code == 2
    assert "argument --max-prompt-tokens: must be >= 1, got -5" in capsys.readouterr().err


def test_profile_hotness_takes_a_small_trace_whole_and_checks_only_the_tokens_it_keeps(
    tmp_path, capsys
):
    # Three requests (fewer than the default 64); the out-of-vocabulary id lies past the cut.
    trace = Trace("short", [TraceRequest((1, 2, 200_000), 4), TraceRequest((5, 6), 4),
                            TraceRequest((7,), 4)])  # fmt: skip
    path = save_trace(trace, tmp_path / "short.npz")
    out = tmp_path / "h.json"
    code = main(
        ["profile-hotness", "--trace", str(path), "--max-prompt-tokens", "2", "-o", str(out)]
    )
    assert code == 0, capsys.readouterr().err
    assert out.exists()
    assert f"{path}: 3 prompts" in out.read_text()
    code = main(
        ["profile-hotness", "--trace", str(path), "--max-prompt-tokens", "3", "-o", str(out)]
    )
    assert code == 2
    assert "holds token ids up to 200000" in capsys.readouterr().err
