"""`rimuru bench` end to end on the CPU: three policies, one trace, one budget."""

import json
import math
from dataclasses import replace

import pytest

from rimuru.cli import main
from rimuru.dataplane.bench.results import read_results, read_slo_section
from rimuru.dataplane.bench.trace import Trace, TraceRequest, load_trace, save_trace


def test_bench_runs_three_policies_and_writes_results(tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--num-prompts",
            "40",
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
        assert run["request_metrics"]["num_completed"] == 40
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
        [
            "bench",
            "--policies",
            "elastic",
            "--request-rate",
            "inf,50",
            "--num-prompts",
            "40",
            "--output-dir",
            str(out),
            "--no-progress",
            "--profile-prompts",
            "4",
        ]
    )
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
    code = main(["bench", "--num-prompts", "1", "--output-dir", str(blocker / "sub")])
    assert code == 2
    err = capsys.readouterr().err
    assert f"rimuru bench: [Errno 20] Not a directory: '{blocker / 'sub'}'" in err
    assert "Traceback" not in err


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
    trace = Trace(
        "short", [TraceRequest((1, 2, 200_000), 4), TraceRequest((5, 6), 4), TraceRequest((7,), 4)]
    )
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


def test_find_max_rate_searches_each_policy_and_writes_table_json_png(tmp_path, capsys):
    """A loose SLO that every rate meets: the search doubles from 50 req/s until its runs
    run out, on one engine per policy; the JSON's slo section and the PNG follow."""
    out = tmp_path / "search"
    code = main(
        [
            "bench",
            "--policies",
            "resident,elastic",
            "--num-prompts",
            "6",
            "--profile-prompts",
            "4",
            "--slo",
            "ttft_p99=60s,tpot_p99=10s",
            "--find-max-rate",
            "--request-rate",
            "50",
            "--rate-search-runs",
            "3",
            "--output-dir",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "highest request rate meeting the SLO" in printed
    table = printed.split("highest request rate meeting the SLO")[1].split("results:")[0]
    rows = {line.split()[0]: line.split() for line in table.strip().splitlines()[2:]}
    assert rows["elastic"][1] == "200" and rows["resident"][1] == "200"
    document = json.loads((out / "results.json").read_text())
    assert document["format"] == "rimuru-bench-results/1"
    rates = [(r["policy"], r["request_rate"]) for r in document["results"]]
    assert rates == [(p, r) for p in ("resident", "elastic") for r in (50.0, 100.0, 200.0)]
    slo = document["slo"]
    assert slo["spec"] == "ttft_p99=60000ms,tpot_p99=10000ms"
    assert [run["meets_slo"] for run in slo["runs"]] == [True] * 6
    assert all(run["num_good"] == 6 for run in slo["runs"])
    search = slo["max_rate"]["elastic"]
    assert (search["max_rate"], search["first_failing_rate"]) == (200.0, None)
    assert [p["rate"] for p in search["probes"]] == [50.0, 100.0, 200.0]
    assert read_slo_section(out / "results.json") == slo
    assert len(read_results(out / "results.json")) == 6  # the results' reader is unchanged
    assert (out / "slo_rate_search.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_find_max_rate_needs_an_slo_and_one_finite_start(tmp_path, capsys):
    assert main(["bench", "--find-max-rate", "--output-dir", str(tmp_path / "a")]) == 2
    assert "--find-max-rate needs --slo" in capsys.readouterr().err
    argv = ["bench", "--find-max-rate", "--slo", "ttft_p99=1s", "--output-dir", str(tmp_path)]
    assert main([*argv, "--request-rate", "1,2"]) == 2
    assert "starts from one finite --request-rate" in capsys.readouterr().err


def test_each_policy_engine_is_released_before_the_next_is_built(tmp_path):
    """Two engines alive at once hold two copies of every weight: qwen3-30b's pinned experts
    twice over were killed for memory on a 128 GiB host. The earlier policy's engine must be
    gone when the next one is built."""
    import argparse
    import weakref

    from rimuru.dataplane.bench import cli
    from rimuru.dataplane.engine.engine import Engine
    from rimuru.dataplane.engine.flags import engine_config_from_args

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        [
            "--num-prompts",
            "4",
            "--profile-prompts",
            "2",
            "--no-progress",
            "--policies",
            "resident,elastic",
            "--output-dir",
            str(tmp_path),
        ]
    )
    args.memory_budget = cli.CPU_DEFAULT_BUDGET
    built: list[weakref.ref] = []
    alive_at_build: list[int] = []

    def build(config):
        alive_at_build.append(sum(ref() is not None for ref in built))
        engine = Engine(config)
        built.append(weakref.ref(engine))
        return engine

    trace = cli.load_trace(args.trace).head(4)
    base = engine_config_from_args(args)
    assert cli._run_local(args, build, base, trace, [math.inf], None, ["resident", "elastic"]) == 0
    assert alive_at_build == [0, 0]
    assert [ref() for ref in built] == [None, None]


def test_bench_refuses_a_bad_temperature_before_building_an_engine(tmp_path, capsys):
    code = main(["bench", "--temperature", "-0.5", "--output-dir", str(tmp_path / "out")])
    assert code == 2
    assert "temperature must be a finite number >= 0, got -0.5" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_sampled_run_draws_each_request_from_its_own_seed():
    """--temperature: request i is seeded i, so two runs (or two policies) sample the same
    streams, and they are not the greedy ones."""
    from rimuru.dataplane.bench.runner import run_trace
    from rimuru.dataplane.bench.trace import load_trace
    from rimuru.dataplane.engine.engine import Engine
    from rimuru.dataplane.engine.startup.config import EngineConfig

    trace = load_trace("sharegpt_qwen_cpu").head(6)

    def outputs(temperature: float) -> list[list[int]]:
        engine = Engine(EngineConfig(memory_budget=400 * 2**20), log_plan=False)
        run_trace(engine, trace, [0.0] * 6, math.inf, progress=False, temperature=temperature)
        return [r.output_token_ids for r in engine.requests.values()]

    sampled = outputs(0.7)
    assert [len(o) for o in sampled] == [r.output_len for r in trace.requests]
    assert outputs(0.7) == sampled and outputs(0.0) != sampled


def test_policies_compared_on_cuda_share_one_scheduling():
    from rimuru.dataplane.bench.cli import same_scheduling
    from rimuru.dataplane.engine.startup.config import EngineConfig

    host = EngineConfig(device="cuda", expert_copy="host").with_mode("resident")
    # auto would schedule resident async and elastic (host copies) synchronously
    assert host.schedules_async and not host.with_mode("elastic").schedules_async
    assert same_scheduling(host, ["resident", "elastic"]).async_scheduling is False
    assert same_scheduling(host, ["resident"]).async_scheduling is True
    device = EngineConfig(device="cuda").with_mode("resident")
    assert same_scheduling(device, ["resident", "elastic"]).async_scheduling is True
    asked = replace(device, async_scheduling=False)
    assert same_scheduling(asked, ["resident"]) is asked  # what was asked for stands


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("missing/h.json", "the directory {tmp}/missing does not exist"),
        ("", "is a directory: give a file path"),
    ],
)
def test_profile_hotness_checks_its_output_path_before_it_profiles(
    where, message, tmp_path, capsys
):
    # It used to profile for the whole run and then fail on the write, losing the work.
    output = tmp_path / where if where else tmp_path
    code = main(["profile-hotness", "--trace", "NO_SUCH_TRACE", "-o", str(output)])
    err = capsys.readouterr().err
    # the output is checked first: a missing trace would otherwise be the error reported
    assert code == 2 and message.format(tmp=tmp_path) in err, err


def test_bench_refuses_an_output_dir_that_is_a_file(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("")
    argv = ["bench", "--num-prompts", "2", "--no-progress", "--output-dir", str(taken)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"rimuru bench: --output-dir {taken} is a file: give a directory (made if absent)" in err
    assert taken.read_text() == ""  # nothing written over it


def test_a_run_longer_than_the_step_log_counts_each_step_from_the_oldest_kept_record():
    """A run whose first steps fell out of the engine's bounded step log: its records start
    from the oldest kept one, whose cumulative counters are the baseline; they never carry
    what the engine counted before the run (an earlier run on the same engine here)."""
    from rimuru.dataplane.bench.runner import run_trace
    from rimuru.dataplane.bench.trace import load_trace
    from rimuru.dataplane.engine.engine import Engine
    from rimuru.dataplane.engine.sched.step_log import StepLog
    from rimuru.dataplane.engine.startup.config import EngineConfig
    from rimuru.policy import Tunables
    from tests.engine.test_liveness import resident_bytes

    trace = load_trace("sharegpt_qwen_cpu").head(8)
    config = EngineConfig(
        activation_reserve=0,
        max_num_batched_tokens=256,
        tunables=Tunables(mode="resident", expert_offload_limit=0),
    )
    # every expert and 2 MiB of KV pages: these requests preempt one another
    budget = resident_bytes(config) + 2 * 2**20
    engine = Engine(replace(config, memory_budget=budget), log_plan=False)
    run_trace(engine, trace, [0.0] * 8, math.inf, progress=False)
    before = engine.scheduler.num_preemptions
    assert before > 0  # the pool is tight enough to preempt
    engine.stats = StepLog(window=8)
    result = run_trace(engine, trace, [0.0] * 8, math.inf, progress=False)
    assert engine.stats.num_steps > 8  # the window dropped the run's first steps
    counted = sum(s.num_preemptions for s in result.steps)
    assert counted <= engine.scheduler.num_preemptions - before
    assert len(result.steps) <= 7  # the oldest kept record is the baseline


def test_bench_refuses_a_negative_system_prompt_before_building_an_engine(tmp_path, capsys):
    code = main(["bench", "--system-prompt-tokens", "-1", "--output-dir", str(tmp_path / "out")])
    assert code == 2
    assert "a system prompt of -1 tokens: give 0 or more" in capsys.readouterr().err


def test_bench_multi_turn_runs_a_closed_loop_and_refuses_a_rate(tmp_path, capsys):
    code = main(
        ["bench", "--multi-turn", "2", "--request-rate", "5", "--output-dir", str(tmp_path)]
    )
    assert code == 2
    assert (
        "--multi-turn sends each turn when the last answer is complete" in capsys.readouterr().err
    )
    out = tmp_path / "chat"
    args = ["--multi-turn", "2", "--num-clients", "2", "--num-prompts", "4"]
    code = main(["bench", *args, "--policies", "resident", "--output-dir", str(out)])
    assert code == 0, capsys.readouterr().err
    (result,) = json.loads((out / "results.json").read_text())["results"]
    assert result["request_metrics"]["num_completed"] == 4
    assert (result["config"]["num_clients"], result["config"]["conversations"]) == (2, 2)


def test_max_concurrency_holds_arrived_requests_until_one_finishes():
    from rimuru.dataplane.bench.runner import run_trace
    from rimuru.dataplane.engine.engine import Engine
    from rimuru.dataplane.engine.startup.config import EngineConfig
    from rimuru.policy import Tunables

    trace = load_trace("sharegpt_qwen_cpu").head(6)
    config = EngineConfig(activation_reserve=0, tunables=Tunables(mode="resident"))
    engine = Engine(config, log_plan=False)
    result = run_trace(engine, trace, [0.0] * 6, math.inf, progress=False, max_concurrency=2)
    requests = [engine.requests[f"resident-{i}"] for i in range(6)]
    # never more than two in flight: each request is sent after an earlier one finished
    for i, r in enumerate(requests[2:], start=2):
        done_before = [q for q in requests[:i] if q.finish_time <= r.arrival_time]
        assert len(done_before) >= i - 1
    assert max(s.num_running for s in engine.stats) <= 2
    # the first two were sent at their arrival, the rest on a freed slot, timed from then
    assert requests[0].arrival_time == requests[1].arrival_time
    assert all(r.arrival_time > requests[0].arrival_time for r in requests[2:])
    assert result.request_metrics.num_completed == 6
    with pytest.raises(ValueError, match="--max-concurrency must be at least 1; got 0"):
        run_trace(engine, trace, [0.0] * 6, math.inf, progress=False, max_concurrency=0)


def test_bench_refuses_max_concurrency_with_a_closed_loop(tmp_path, capsys):
    args = ["--multi-turn", "2", "--max-concurrency", "4", "--output-dir", str(tmp_path)]
    assert main(["bench", *args]) == 2
    assert "--max-concurrency caps an in-process open-loop run" in capsys.readouterr().err


def test_cached_prefixes_are_their_own_band_of_the_pool_split(tmp_path, capsys):
    from rimuru.dataplane.bench.results import read_results

    out = tmp_path / "shared"
    args = ["--num-prompts", "8", "--system-prompt-tokens", "64", "--policies", "resident"]
    assert main(["bench", *args, "--output-dir", str(out)]) == 0, capsys.readouterr().err
    document = json.loads((out / "results.json").read_text())
    steps = document["results"][0]["steps"]
    assert max(steps["cached_bytes"]) > 0  # finished requests' prompt blocks stay cached
    pool = {
        k + e + c + f
        for k, e, c, f in zip(
            steps["kv_bytes"],
            steps["expert_bytes"],
            steps["cached_bytes"],
            steps["free_bytes"],
            strict=True,
        )
    }
    assert len(pool) == 1  # the four bands always add up to the pool
    # a results file written before the band existed still reads, with no cached bytes
    del document["results"][0]["steps"]["cached_bytes"]
    (out / "old.json").write_text(json.dumps(document))
    (old,) = read_results(out / "old.json")
    assert {s.cached_bytes for s in old.steps} == {0}
