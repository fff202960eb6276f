"""bench/paper_experiments.py on the CPU with the tiny preset: the GPU script must not
rot between GPU runs. Real engines, real results files."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from rimuru.dataplane.bench.results import read_results

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--device", "cpu", "--trace", "sharegpt_qwen_cpu"]
TINY_EXPERTS = 4 * 32  # layers x experts of the tiny preset


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "paper_experiments.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_offload_sweep_honours_each_limit_and_merges_into_one_figure(tmp_path):
    done = run(
        "offload-sweep", *TINY, "--num-prompts", "24", "--memory-budget", "300MiB",
        "--limits", "0,6", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "offload-sweep_table.json").read_text())
    assert [r["run"] for r in rows] == ["limit 0", "limit 6"]
    off = read_results(tmp_path / "offload_limit_0" / "results.json")[0]
    six = read_results(tmp_path / "offload_limit_6" / "results.json")[0]
    assert off.step_metrics.total_evictions == 0
    assert {s.num_experts_resident for s in off.steps} == {TINY_EXPERTS}
    assert six.step_metrics.total_evictions > 0  # the burst made the boundary move
    layers, experts = 4, 32
    assert six.step_metrics.min_experts_resident >= layers * (experts - 6)
    assert rows[1]["evict"] == six.step_metrics.total_evictions

    merged = tmp_path / "merged"
    done = run(
        "merge", str(tmp_path / "offload_limit_0" / "results.json"), str(tmp_path / "offload_limit_6"),
        "--fig4", "sweep.png", "--labels", "limit 0,limit 6", "--out", str(merged),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert (merged / "sweep.png").read_bytes().startswith(b"\x89PNG")
    assert len(read_results(merged / "merged_results.json")) == 2

    done = run("merge", str(tmp_path / "offload_limit_0"), "--fig4", "x.png", "--labels", "a,b",
               "--out", str(tmp_path / "bad"))  # fmt: skip
    assert done.returncode != 0 and "2 labels for 1 results" in done.stderr
    assert not (tmp_path / "bad" / "x.png").exists()


def test_fig4_runs_the_asked_policies_on_one_budget_and_draws_the_figure(tmp_path):
    done = run(
        "fig4", *TINY, "--num-prompts", "8", "--memory-budget", "300MiB",
        "--policies", "resident,elastic", "--expert-offload-limit", "6", "--out", str(tmp_path),
        "--max-num-batched-tokens", "512",  # the GPU setup's 2048 unless given
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    results = read_results(tmp_path / "fig4" / "results.json")
    assert [r.policy for r in results] == ["resident", "elastic"]
    assert {r.config["max_num_batched_tokens"] for r in results} == {512}
    assert {r.config["memory_budget"] for r in results} == {300 * 2**20}
    assert {r.request_rate for r in results} == {10.0}
    assert (tmp_path / "fig4" / "fig4_memory_split.png").read_bytes().startswith(b"\x89PNG")
    rows = json.loads((tmp_path / "fig4_table.json").read_text())
    assert [r["run"] for r in rows] == ["resident", "elastic"]


def test_recovery_is_measured_from_the_deepest_eviction(experiments, make_result):
    base = make_result("elastic", 4.0, num_steps=10)
    resident = [128, 128, 120, 110, 100, 105, 120, 128, 128, 128]
    steps = tuple(
        dataclasses.replace(s, num_experts_resident=n, time=0.5 * i)
        for i, (s, n) in enumerate(zip(base.steps, resident, strict=True))
    )
    result = dataclasses.replace(base, steps=steps)
    assert experiments.recovery_seconds(result) == 0.5 * 7 - 0.5 * 4
    never_back = dataclasses.replace(result, steps=steps[:6])  # 128 .. 100, 105: cut there
    assert experiments.recovery_seconds(never_back) is None
    flat = dataclasses.replace(
        result, steps=tuple(dataclasses.replace(s, num_experts_resident=128) for s in steps)
    )
    assert experiments.recovery_seconds(flat) is None  # the boundary never moved
    # a burst evicts in its first step: the start is the residency before it (130 here),
    # which these steps never reach again
    evicted_at_once = dataclasses.replace(
        result, config={**result.config, "experts_resident_at_start": 130}
    )
    assert experiments.recovery_seconds(evicted_at_once) is None


def test_flags_the_script_sets_itself_are_refused(tmp_path):
    done = run("offload-sweep", *TINY, "--limits", "5", "--expert-offload-limit", "30",
               "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 2 and "are set by this script" in done.stderr
    done = run("offload-sweep", *TINY, "--limit", "30", "--out", str(tmp_path))  # not --limits
    assert done.returncode == 2 and "--limit" in done.stderr
    done = run("rate-sweep", *TINY, "--policies", "fixed", "--out", str(tmp_path))  # fig4's
    assert done.returncode == 2 and "only fig4 takes them" in done.stderr
    assert not list(tmp_path.iterdir())  # nothing ran


def test_the_ablation_refuses_to_change_its_copy_mode_or_graphs(tmp_path):
    for flag in (["--expert-copy", "device"], ["--enforce-eager"]):
        done = run("ablation", *TINY, *flag, "--out", str(tmp_path))
        assert done.returncode == 2 and "every arm eager and with host copies" in done.stderr
    assert not any(tmp_path.iterdir())  # refused before any arm ran


def test_a_failed_run_keeps_the_rows_that_finished(tmp_path):
    done = run(
        "offload-sweep", *TINY, "--num-prompts", "6", "--memory-budget", "300MiB",
        "--limits", "0,-1,6", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 2
    assert "tunables.expert_offload_limit: must be in [0, " in done.stderr
    rows = json.loads((tmp_path / "offload-sweep_table.json").read_text())
    assert [r["run"] for r in rows] == ["limit 0"]  # and limit 6 never started
    assert not (tmp_path / "offload_limit_6").exists()
