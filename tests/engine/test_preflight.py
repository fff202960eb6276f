"""The engine refuses a budget before it builds a weight: a preset builds every expert on
the host first, so a 30B preset on a budget that cannot hold it would build tens of GB
before the pool's plan said no."""

from __future__ import annotations

import os

import pytest

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.sizes import format_bytes, parse_bytes


def test_a_30b_preset_on_a_1_gib_budget_is_refused_before_its_weights_exist():
    # Building this preset's weights would take ~60 GB of host memory: the refusal must
    # come from the plan, on shapes alone.
    config = EngineConfig(model="qwen3-30b-a3b", memory_budget=parse_bytes("1GiB"))
    with pytest.raises(ValueError) as info:
        Engine(config)
    message = str(info.value)
    assert message.startswith("the elastic policy does not fit a memory budget of 1.0 GiB: ")
    assert "cannot hold the non-pool weights (2.9 GiB)" in message
    assert "`rimuru plan`" in message


def test_a_budget_above_the_hosts_memory_is_refused_naming_both():
    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with pytest.raises(ValueError) as info:
        Engine(EngineConfig(model="tiny", memory_budget=host + 2**30))
    assert str(info.value) == (
        f"the memory budget {format_bytes(host + 2**30)} exceeds the {format_bytes(host)} of "
        "this host: give a smaller --memory-budget"
    )


@pytest.mark.parametrize("mode", ["resident", "fixed", "elastic"])
def test_on_the_cpu_the_smallest_budget_the_plan_accepts_builds_the_engine(mode):
    """The check is no stricter than the engine: at the smallest budget the plan accepts (to
    a MiB) the engine builds; a MiB below, the check refuses with its message."""
    from rimuru.dataplane.engine.startup.capacity import plan_capacity

    def fits(budget: int) -> bool:
        c = EngineConfig(model="tiny", memory_budget=budget).with_mode(mode)
        return not isinstance(plan_capacity(c, (mode,)).policies[0], str)

    lo, hi = parse_bytes("64MiB"), parse_bytes("1GiB")
    assert not fits(lo) and fits(hi)
    while hi - lo > 2**20:  # the smallest fitting budget, to a MiB
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    with pytest.raises(ValueError, match=f"the {mode} policy does not fit"):
        Engine(EngineConfig(model="tiny", memory_budget=lo).with_mode(mode))
    engine = Engine(EngineConfig(model="tiny", memory_budget=hi).with_mode(mode))
    assert engine.plan.budget_bytes == hi
