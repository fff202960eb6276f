from dataclasses import replace

import pytest

from rimuru.dataplane.engine.config import EngineConfig
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.setup import loading_buffer_bytes
from rimuru.policy import Tunables

MiB = 2**20


def tight_engine(mode: str, pool_mib: float = 26, **overrides) -> Engine:
    """tiny preset with a pool so small that KV pages run out (all experts = 24 MiB)."""
    probe = Engine(EngineConfig(activation_reserve=0, max_num_batched_tokens=128), log_plan=False)
    non_pool = probe.model.resident_nbytes()
    tunables = overrides.pop("tunables", Tunables(mode=mode, expert_offload_limit=16))
    slots = overrides.pop("loading_buffer_slots", 32)
    config = EngineConfig(
        activation_reserve=0,
        max_num_batched_tokens=128,
        loading_buffer_slots=slots,
        tunables=tunables,
        **overrides,
    )
    # the pool is pool_mib whatever the copy mode's number of loading buffers
    buffers = loading_buffer_bytes(config, slots, probe.geometry)
    config = replace(config, memory_budget=int(non_pool + buffers + pool_mib * MiB))
    return Engine(config, log_plan=False)


@pytest.fixture
def prompts():
    import random

    rng = random.Random(7)
    return [[rng.randrange(151_000) for _ in range(rng.randint(40, 110))] for _ in range(14)]


@pytest.fixture
def make_engine():
    return tight_engine
