"""One set of engine flags: every command that builds an engine reads the same flags into
the same EngineConfig, with EngineConfig's and Tunables' own defaults."""

from __future__ import annotations

import argparse
import importlib
import os
from dataclasses import replace

import pytest

from rimuru.dataplane.engine.flags import engine_config_from_args
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.policy import Tunables

COMMANDS = {
    "serve": "rimuru.dataplane.serve.cli",
    "bench": "rimuru.dataplane.bench.cli",
    "generate": "rimuru.dataplane.cli.generate",
    "plan": "rimuru.dataplane.cli.plan",
    "profile-hotness": "rimuru.dataplane.cli.hotness",
}
# Every value differs from its default, so a flag a command drops or defaults differently
# shows. (--mode is elastic: bench and plan take --policies instead and compare modes.)
FLAGS = [
    "--model", "tiny", "--dtype", "float16", "--device", "cuda:1", "--seed", "7",
    "--router-skew", "0.5", "--memory-budget", "300MiB", "--max-num-seqs", "12",
    "--max-num-batched-tokens", "512", "--max-model-len", "900", "--block-size", "16",
    "--activation-reserve", "64MiB", "--mode", "elastic", "--expert-offload-limit", "3",
    "--shrink-threshold", "1", "--grow-threshold", "6", "--max-grow-per-round", "2",
    "--pages-per-expert", "3", "--copy-budget", "0.5", "--fixed-expert-share", "0.25",
    "--loading-buffer-slots", "5", "--hotness", "ranking.json", "--evict-to-admit", "off",
    "--expert-copy", "host", "--enforce-eager", "on", "--cudagraph-mode", "full_decode_only",
    "--moe-path", "gather",
]  # fmt: skip
EXPECTED = EngineConfig(
    model="tiny", dtype="float16", device="cuda:1", seed=7, router_skew=0.5,
    memory_budget=300 * 2**20, max_num_seqs=12, max_num_batched_tokens=512, max_model_len=900,
    activation_reserve=64 * 2**20, fixed_expert_share=0.25, loading_buffer_slots=5,
    hotness_path="ranking.json", evict_to_admit=False, expert_copy="host", enforce_eager=True,
    cudagraph_mode="full_decode_only", moe_path="gather",
    tunables=Tunables(mode="elastic", expert_offload_limit=3, shrink_threshold=1,
                      grow_threshold=6, max_grow_per_round=2, copy_budget=0.5),
)  # fmt: skip


@pytest.fixture(autouse=True)
def no_rimuru_environment(monkeypatch):
    # `rimuru serve` reads RIMURU_* as defaults; the machine's must not leak in.
    for name in [n for n in os.environ if n.startswith("RIMURU_")]:
        monkeypatch.delenv(name)


def config_of(command: str, argv: list[str]) -> EngineConfig:
    module = importlib.import_module(COMMANDS[command])
    parser = argparse.ArgumentParser(prog=f"rimuru {command}")
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    if command == "serve":
        return module.engine_config(args)  # what serve's run() builds
    return engine_config_from_args(args)


def flags_for(command: str, flags: list[str]) -> list[str]:
    """bench and plan compare policies (--policies, not --mode); generate's --seed is the
    sampling seed (the weights keep the default)."""
    drop = {"bench": {"--mode"}, "plan": {"--mode"}, "generate": {"--seed"}}.get(command, set())
    kept = []
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        if flag not in drop:
            kept += [flag, value]
    return kept


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reads_the_same_flags_into_the_same_config(command):
    config = config_of(command, flags_for(command, FLAGS))
    expected = replace(EXPECTED, seed=0) if command == "generate" else EXPECTED
    assert config == expected


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_the_same_defaults(command):
    # plan needs a budget; the rest default to EngineConfig(), but for bench's documented
    # quick-start setup (BENCH_DEFAULTS; its CPU budget is applied in its run())
    argv = ["--memory-budget", "1GiB"] if command == "plan" else []
    config = config_of(command, argv)
    expected = replace(EngineConfig(), memory_budget=2**30 if argv else None)
    if command == "bench":
        tunables = replace(expected.tunables, expert_offload_limit=16)
        expected = replace(expected, max_num_batched_tokens=1024, tunables=tunables)
    else:
        # the drift that made `rimuru plan` mispredict a server started with defaults
        assert config.tunables.expert_offload_limit == Tunables().expert_offload_limit
    assert config == expected


def test_bench_and_plan_run_each_policy_of_the_same_config():
    config = config_of("plan", flags_for("plan", FLAGS))
    fixed = config.with_mode("fixed")
    assert fixed.tunables == replace(EXPECTED.tunables, mode="fixed", copy_budget=0.0)
    assert replace(fixed, tunables=EXPECTED.tunables) == EXPECTED


@pytest.mark.parametrize(
    ("command", "argv", "message"),
    [
        ("serve", ["--expert-offload-limit", "x"], "invalid int value: 'x'"),
        ("plan", [], "the following arguments are required: --memory-budget"),
        ("bench", ["--expert-copy", "gpu"], "invalid choice: 'gpu'"),
        ("generate", ["--mode", "turbo"], "invalid choice: 'turbo'"),
    ],
)
def test_bad_flags_are_usage_errors(command, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        config_of(command, argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_value_names_its_flag_or_field():
    with pytest.raises(ValueError, match="--enforce-eager must be on or off"):
        config_of("bench", ["--enforce-eager", "sometimes"])
    with pytest.raises(ValueError, match=r"tunables\.grow_threshold: must exceed"):
        config_of("plan", ["--memory-budget", "1GiB", "--grow-threshold", "2"])
    # a bare switch means on, as bench's --enforce-eager always did
    assert config_of("bench", ["--enforce-eager"]).enforce_eager is True


def test_async_scheduling_also_takes_auto_its_default():
    assert config_of("serve", []).async_scheduling is None
    assert config_of("bench", ["--async-scheduling", "auto"]).async_scheduling is None
    assert config_of("generate", ["--async-scheduling", "off"]).async_scheduling is False
    assert config_of("bench", ["--async-scheduling"]).async_scheduling is True
    with pytest.raises(ValueError, match="--async-scheduling must be on, off or auto"):
        config_of("bench", ["--async-scheduling", "sometimes"])
    with pytest.raises(ValueError, match=r"--enforce-eager must be on or off \("):
        config_of("bench", ["--enforce-eager", "auto"])  # no auto where the default is a bool


@pytest.mark.parametrize("command", COMMANDS)
def test_retired_flags_take_their_one_value_and_are_hidden(command, capsys):
    # --block-size 16 and --pages-per-expert 3 were flags: old scripts still pass them.
    argv = ["--memory-budget", "1GiB"] if command == "plan" else []
    old = ["--block-size", "16", "--pages-per-expert", "3"]
    assert config_of(command, argv + old) == config_of(command, argv)
    with pytest.raises(SystemExit):
        config_of(command, ["--help"])
    shown = capsys.readouterr().out
    assert "--max-num-seqs" in shown
    assert "--block-size" not in shown and "--pages-per-expert" not in shown


def test_retired_flags_are_also_read_from_older_operators_configmaps(monkeypatch):
    monkeypatch.setenv("RIMURU_BLOCK_SIZE", "16")
    monkeypatch.setenv("RIMURU_PAGES_PER_EXPERT", "3")
    assert config_of("serve", []) == EngineConfig()
    monkeypatch.setenv("RIMURU_PAGES_PER_EXPERT", "4")
    with pytest.raises(ValueError, match=r"--pages-per-expert must be 3 \(an expert takes"):
        config_of("serve", [])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--block-size", "32"], "--block-size must be 16 (the kernels' page layout); got 32"),
        (
            ["--pages-per-expert", "1"],
            "--pages-per-expert must be 3 (an expert takes one page for each of w1, w3, w2); got 1",
        ),
    ],
)
def test_a_retired_flag_refuses_any_other_value_as_a_usage_error(argv, message, capsys):
    from rimuru.cli import main

    assert main(["plan", "--memory-budget", "1GiB", *argv]) == 2
    assert f"rimuru plan: {message}" in capsys.readouterr().err
