from dataclasses import replace

import pytest

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.engine.startup.setup import loading_buffer_bytes
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


def checkpoint_engine(
    path, mode: str, extra_kv_blocks: int | None, *, requests: int = 0, **overrides
) -> Engine:
    """A local checkpoint in fp32 with 8 loading-buffer slots; `extra_kv_blocks`: a pool of
    every expert plus this many 16-token blocks of all attention layers plus, for a hybrid
    model, the state pages of `requests` requests, so that pages run short (None: the CPU
    default budget, room for everything)."""
    settings = dict(
        model=str(path),
        activation_reserve=0,
        max_num_batched_tokens=128,
        loading_buffer_slots=8,
        tunables=Tunables(mode=mode, expert_offload_limit=6),
    )
    config = EngineConfig(**{**settings, **overrides})
    if extra_kv_blocks is None:
        return Engine(config, log_plan=False)
    probe = Engine(config, log_plan=False)
    g, mc = probe.geometry, probe.model_config
    experts = mc.num_moe_layers * mc.num_experts * 3 * g.expert_page_bytes
    kv = extra_kv_blocks * mc.num_kv_layers * g.kv_page_bytes
    kv += g.state_parent_bytes(len(mc.linear_attention_layers), requests)
    budget = probe.model.resident_nbytes() + loading_buffer_bytes(config, 8, g) + experts + kv
    return Engine(replace(config, memory_budget=budget), log_plan=False)


@pytest.fixture
def make_checkpoint_engine():
    return checkpoint_engine


@pytest.fixture
def prompts():
    import random

    rng = random.Random(7)
    return [[rng.randrange(151_000) for _ in range(rng.randint(40, 110))] for _ in range(14)]


@pytest.fixture
def make_engine():
    return tight_engine
