"""How a command builds its engines, whatever the tensor-parallel size: in this process on
one device, else as rank 0 of workers started here and stopped when the command ends."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.startup.config import EngineConfig


@contextmanager
def engine_builder(config: EngineConfig, *, threads: int = 1) -> Iterator[Callable[..., Engine]]:
    """Yields `build(config, **engine_kwargs) -> Engine` for configs of `config`'s
    tensor_parallel_size and device. threads: each follower's torch CPU threads."""
    size = config.tensor_parallel_size
    if size == 1:
        yield Engine
        return
    from rimuru.dataplane.parallel.workers import TensorParallelWorkers

    with TensorParallelWorkers(size, config.device, threads=threads) as workers:
        yield workers.engine


def start_engine(config: EngineConfig, *, threads: int = 1, **kwargs) -> Engine:
    """One engine that owns its workers (rimuru serve builds it on its engine thread):
    `Engine.close()` stops them."""
    if config.tensor_parallel_size == 1:
        return Engine(config, **kwargs)
    from rimuru.dataplane.parallel.workers import TensorParallelWorkers

    workers = TensorParallelWorkers(config.tensor_parallel_size, config.device, threads=threads)
    try:
        engine = workers.engine(config, **kwargs)
    except BaseException:
        workers.__exit__(*sys.exc_info())
        raise
    engine.tp.after_close = workers.shutdown
    return engine
