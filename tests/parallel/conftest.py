"""Tensor-parallel tests: two ranks on the CPU (gloo). One group of worker processes per
test module: spawning a rank costs seconds (it imports torch), an engine on it does not."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
import torch

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.engine.startup.loaded_model import page_geometry
from rimuru.dataplane.engine.startup.setup import loading_buffer_bytes
from rimuru.dataplane.memory.geometry import PageGeometry
from rimuru.dataplane.model import MoETransformer
from rimuru.dataplane.model.checkpoint import open_weights
from rimuru.dataplane.model.checkpoint.shard import ShardedWeights, TensorShard
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.hybrid.transformer import HybridTransformer
from rimuru.dataplane.parallel.workers import TensorParallelWorkers

MiB = 2**20
TP = 2


@pytest.fixture(scope="module")
def workers():
    with TensorParallelWorkers(TP, "cpu") as w:
        yield w


@cache
def _rank_model(model: str, size: int) -> tuple[int, PageGeometry, ModelConfig]:
    """Rank 0's non-pool weight bytes, page geometry and model config, of `size` ranks."""
    source = open_weights(model)
    if size > 1:
        source = ShardedWeights(source, TensorShard(0, size))
    mc, dtype = source.config, source.config.dtype
    decoder = HybridTransformer if mc.is_hybrid else MoETransformer
    weights = decoder.from_source(source, None, None, "cpu", dtype)
    return weights.resident_nbytes(), page_geometry(mc, dtype), mc


def rank_budget(config: EngineConfig, pool_bytes: int) -> int:
    """A budget per GPU leaving `pool_bytes` of pool on each rank (no activation reserve)."""
    non_pool, geometry, _ = _rank_model(config.model, config.tensor_parallel_size)
    buffers = loading_buffer_bytes(config, config.loading_buffer_slots, geometry)
    return non_pool + buffers + pool_bytes


def tight_pool(kv_blocks: int, requests: int) -> Callable[[PageGeometry, ModelConfig], int]:
    """A rank's pool of every expert, `kv_blocks` 16-token blocks of every attention layer
    and, for a hybrid, the state pages of `requests` requests."""

    def pool(g: PageGeometry, mc: ModelConfig) -> int:
        experts = mc.num_moe_layers * mc.num_experts * 3 * g.expert_page_bytes
        kv = kv_blocks * mc.num_kv_layers * g.kv_page_bytes
        return experts + kv + g.state_parent_bytes(len(mc.linear_attention_layers), requests)

    return pool


def build(
    workers: TensorParallelWorkers | None,
    config: EngineConfig,
    pool: int | Callable[[PageGeometry, ModelConfig], int],
) -> Engine:
    """TP=1 in this process (workers None), else rank 0 of `workers`. `pool`: TP=1's pool
    bytes, of which a rank gets 1/TP (the same pages, each TP times smaller), or a rank's
    pool from its geometry and model config."""
    size = 1 if workers is None else workers.size
    config = replace(config, tensor_parallel_size=size, activation_reserve=0)
    if callable(pool):
        _, geometry, mc = _rank_model(config.model, size)
        pool_bytes = pool(geometry, mc)
    else:
        pool_bytes = pool // size
    config = replace(config, memory_budget=rank_budget(config, pool_bytes))
    if workers is None:
        return Engine(config, log_plan=False)
    return workers.engine(config, log_plan=False)


def gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped counts: it runs nothing)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return re.search(r"State:\s+Z", status) is not None


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)
