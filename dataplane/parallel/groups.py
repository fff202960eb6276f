"""The process groups of one tensor-parallel engine, one process per rank on one host.

    compute   NCCL on CUDA, gloo on the CPU: the forward's all-reduces (reduce_ops.py)
    control   gloo, always on the CPU: rank 0's messages (messages.py), the plan's
              agreement, the reports at the end

Rendezvous is a TCPStore that rank 0 binds on a free port of 127.0.0.1 (port 0), so
ranks never race for a port. A collective on the compute group that waits longer than
COMPUTE_TIMEOUT fails (a rank alive but stuck). The control group waits as long as the
server idles between requests: a rank that dies is noticed by the watchdogs
(watchdog.py), not by a timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

COMPUTE_TIMEOUT = timedelta(minutes=10)  # a forward's collective, kernel compiles included
CONTROL_TIMEOUT = timedelta(days=365)  # the next step may be an idle server's next request
STORE_TIMEOUT = timedelta(minutes=5)  # every rank has joined by then, or start-up fails
HOST = "127.0.0.1"


def rank_zero_store(size: int) -> dist.TCPStore:
    """Rank 0's rendezvous, bound before the other ranks start (they need its port)."""
    return dist.TCPStore(
        HOST, 0, size, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT
    )


@dataclass(frozen=True)
class RankGroups:
    rank: int
    size: int
    compute: dist.ProcessGroup
    control: dist.ProcessGroup

    @classmethod
    def join(cls, rank: int, size: int, device_type: str, store: dist.Store) -> RankGroups:
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":  # NCCL binds a rank's communicator to the current GPU
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=size, timeout=COMPUTE_TIMEOUT
        )
        control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        return cls(rank, size, dist.group.WORLD, control)

    @staticmethod
    def connect(rank: int, size: int, port: int) -> dist.TCPStore:
        """A follower's view of rank 0's store."""
        return dist.TCPStore(HOST, port, size, is_master=False, timeout=STORE_TIMEOUT)

    def send(self, message: Any) -> None:
        """Rank 0: one message to every other rank."""
        dist.broadcast_object_list([message], src=0, group=self.control)

    def receive(self) -> Any:
        """A follower: the next message of rank 0 (blocks until it comes)."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def min_over_ranks(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's `value`, in rank order, on rank 0; None elsewhere."""
        out: list[Any] | None = [None] * self.size if self.rank == 0 else None
        dist.gather_object(value, out, dst=0, group=self.control)
        return out

    def leave(self) -> None:
        dist.destroy_process_group()
