"""Rank 0's handle on the other ranks of one host: starts them, builds engines across
them, stops them.

    workers = TensorParallelWorkers(2, "cpu")     # spawns rank 1, joins the groups
    engine = workers.engine(config)               # rank 0's Engine; rank 1 follows it
    engine.generate(...)
    workers.shutdown()                            # closes the engine, rank 1 exits 0

The followers outlive one engine (a benchmark builds one per policy; tests reuse one
group per module). They are spawned (not forked: CUDA and threads do not survive a fork)
as daemons, so they never outlive rank 0.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import sys
import threading
import traceback

import torch

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.model.checkpoint import model_config
from rimuru.dataplane.model.checkpoint.shard import check_shardable
from rimuru.dataplane.parallel.follower import follower_main
from rimuru.dataplane.parallel.groups import RankGroups, rank_zero_store
from rimuru.dataplane.parallel.leader import StepLeader
from rimuru.dataplane.parallel.messages import Shutdown, StartEngine
from rimuru.dataplane.parallel.rank import rank_config
from rimuru.dataplane.parallel.watchdog import first_exited, stop_for, watch_followers

log = logging.getLogger("rimuru.parallel")

JOIN_TIMEOUT_S = 30.0  # a follower told to shut down has left by then, or is killed
DEATH_NOTICE_S = 1.0  # how long after a failed collective a dead follower shows its exit


class TensorParallelWorkers:
    def __init__(self, size: int, device: str, *, threads: int = 1):
        if size < 2:
            raise ValueError(f"tensor parallel needs >= 2 ranks, got {size}")
        device_type = "cuda" if device.startswith("cuda") else "cpu"
        if device_type == "cuda" and torch.cuda.device_count() < size:
            raise ValueError(
                f"--tensor-parallel-size {size} needs {size} GPUs, "
                f"{torch.cuda.device_count()} are visible"
            )
        self.size = size
        store = rank_zero_store(size)
        spawn = multiprocessing.get_context("spawn")
        self.processes = [
            spawn.Process(
                target=follower_main,
                args=(rank, size, store.port, device_type, threads),
                name=f"rimuru-tp-rank{rank}",
                daemon=True,
            )
            for rank in range(1, size)
        ]
        for p in self.processes:
            p.start()
        # a warning so that it shows where logging is not set up (rimuru generate): the
        # pids are what someone inspecting or stopping a rank needs
        log.warning(
            "tensor parallel: %d ranks, followers' pids %s",
            size,
            ", ".join(str(p.pid) for p in self.processes),
        )
        self._stopping = threading.Event()
        watch_followers(self.processes, self._stopping)
        # A program that ends without shutdown(): multiprocessing's exit handler (registered
        # before this one, so run after it) terminates the followers, which is no failure.
        atexit.register(self._stopping.set)
        try:
            self.groups = RankGroups.join(0, size, device_type, store)
        except BaseException:  # no groups: the followers go, and their exits are no failure
            self._stopping.set()
            for p in self.processes:
                p.kill()
            raise
        self._store = store  # the followers' rendezvous: kept for the groups' life
        self._leader: StepLeader | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def engine(self, config: EngineConfig, **kwargs) -> Engine:
        """Rank 0's engine of `config` (its tensor_parallel_size must be this group's),
        with every other rank following it. Closes the previous engine first."""
        if config.tensor_parallel_size != self.size:
            raise ValueError(
                f"config.tensor_parallel_size is {config.tensor_parallel_size}, these "
                f"workers are {self.size} ranks"
            )
        check_shardable(model_config(config.model), self.size)  # before any rank builds
        self.close_engine()
        self.groups.send(StartEngine(config))
        self._leader = StepLeader(self.groups)
        self._leader.abandon = self.abandon
        return Engine(rank_config(config, 0), tp=self._leader, **kwargs)

    def close_engine(self) -> None:
        if self._leader is not None:
            self._leader.close()
            self._leader = None

    def shutdown(self) -> None:
        """Every follower exits 0; idempotent."""
        if self._stopping.is_set():
            return
        self.close_engine()
        self._stopping.set()  # from here a follower's exit is expected
        self.groups.send(Shutdown())
        for p in self.processes:
            p.join(JOIN_TIMEOUT_S)
            if p.exitcode is None:
                p.kill()
        self.groups.leave()

    def abandon(self) -> None:
        """Kill every follower now (they may be inside a collective rank 0 left)."""
        self._stopping.set()  # their exits are expected: no failure report
        for p in self.processes:
            p.kill()
        for p in self.processes:
            p.join(JOIN_TIMEOUT_S)
        self.groups.leave()  # a later set of workers in this process starts its own groups

    def __enter__(self) -> TensorParallelWorkers:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.shutdown()
            return
        # Rank 0 failed. A follower that died is the better explanation (gloo reports only
        # "connection closed"): its exit ends the process here. Else rank 0's own error
        # propagates; the followers may be inside a collective, so they are killed.
        self._stopping.set()
        rank = first_exited(self.processes, wait_s=DEATH_NOTICE_S)
        if rank is not None:
            # rank 0's own error first: both may have failed the same check (stop_for exits)
            traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
            stop_for(self.processes, rank)
        for p in self.processes:
            p.kill()
