"""`rimuru plan --hotness` refuses a ranking made for another model, as the engine does:
planned on, a smaller ranking indexed experts the model lacks (IndexError) and a larger one
gave wrong rows with exit status 0."""

from __future__ import annotations

import pytest

from rimuru.cli import main
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.startup.capacity import PolicyCapacity, plan_capacity
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.policy import HotnessRanking


def _ranking(path, num_layers: int, num_experts: int) -> str:
    counts = [[float(e + 1) for e in range(num_experts)] for _ in range(num_layers)]
    HotnessRanking.from_counts(counts).save(path)
    return str(path)


@pytest.mark.parametrize(
    ("model", "shape", "message"),
    [
        # tiny: 4 layers x 32 experts; a smaller ranking once raised IndexError
        ("tiny", (2, 8), "hotness ranking is for 2 layers x 8 experts; the model has 4 x 32"),
        # qwen1.5-moe: 24 x 60; tiny's ranking once planned 128 experts at start, exit 0
        (
            "qwen1.5-moe-a2.7b",
            (4, 32),
            "hotness ranking is for 4 layers x 32 experts; the model has 24 x 60",
        ),
    ],
)
def test_plan_refuses_a_ranking_of_another_shape(tmp_path, capsys, model, shape, message):
    path = _ranking(tmp_path / "hot.json", *shape)
    argv = ["plan", "--model", model, "--memory-budget", "28.8GiB", "--hotness", path]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert f"rimuru plan: {message}" in err
    assert "experts at start" not in out  # no table of wrong rows


def test_plan_and_engine_give_the_same_message(tmp_path):
    config = EngineConfig(
        memory_budget=100 * 2**20,
        activation_reserve=0,
        max_num_batched_tokens=128,
        hotness_path=_ranking(tmp_path / "hot.json", 4, 8),
    )
    with pytest.raises(ValueError) as planned:
        plan_capacity(config, ("fixed",))
    with pytest.raises(ValueError) as started:
        Engine(config, log_plan=False)
    assert str(planned.value) == str(started.value)


def test_plan_accepts_a_ranking_of_the_models_shape(tmp_path, capsys):
    path = _ranking(tmp_path / "hot.json", 4, 32)
    config = EngineConfig(memory_budget=2**30, hotness_path=path)
    assert all(isinstance(p, PolicyCapacity) for p in plan_capacity(config, ("fixed",)).policies)
    assert main(["plan", "--memory-budget", "1GiB", "--hotness", path]) == 0
    assert "experts at start" in capsys.readouterr().out
