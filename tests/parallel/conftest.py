"""Tensor-parallel tests: two ranks on the CPU (gloo). One group of worker processes per
test module: spawning a rank costs seconds (it imports torch), an engine on it does not."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
import torch

from rimuru.dataplane.engine.config import EngineConfig
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.setup import loading_buffer_bytes, page_geometry
from rimuru.dataplane.model import MoETransformer, open_weights
from rimuru.dataplane.parallel.shard import ShardedWeights, TensorShard
from rimuru.dataplane.parallel.workers import TensorParallelWorkers

MiB = 2**20
TP = 2


@pytest.fixture(scope="module")
def workers():
    with TensorParallelWorkers(TP, "cpu") as w:
        yield w


@cache
def _rank_model(model: str, size: int):
    """(rank 0's non-pool weight bytes, its page geometry) for `size` ranks."""
    source = open_weights(model)
    if size > 1:
        source = ShardedWeights(source, TensorShard(0, size))
    dtype = source.config.dtype
    weights = MoETransformer.from_source(source, None, None, "cpu", dtype)
    return weights.resident_nbytes(), page_geometry(source.config, dtype, 16)


def rank_budget(config: EngineConfig, pool_bytes: int) -> int:
    """A budget per GPU leaving `pool_bytes` of pool on each rank (no activation reserve)."""
    non_pool, geometry = _rank_model(config.model, config.tensor_parallel_size)
    buffers = loading_buffer_bytes(config, config.loading_buffer_slots, geometry)
    return non_pool + buffers + pool_bytes


def build(workers: TensorParallelWorkers | None, config: EngineConfig, pool_bytes: int) -> Engine:
    """TP=1 in this process (workers None), else rank 0 of `workers`, with pool_bytes / TP
    per rank: the same pages as TP=1 (every page is TP times smaller)."""
    size = 1 if workers is None else workers.size
    config = replace(config, tensor_parallel_size=size, activation_reserve=0)
    config = replace(config, memory_budget=rank_budget(config, pool_bytes // size))
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
