"""Bounded failure: a rank that dies takes the others down within POLL_S, with a message.

Collectives alone do not bound it: NCCL waits for a dead peer until its timeout, and
a follower idle in a broadcast waits for rank 0 as long as the server idles. So rank 0
polls its followers' processes, and each follower polls rank 0 (its parent); whoever
sees a death prints why and leaves at once with exit code 1 (os._exit: a thread cannot
unblock the main thread's collective, and the process must not linger in it).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess

POLL_S = 0.2
EXIT_CODE = 1


def fatal(message: str) -> None:
    print(f"rimuru: {message}", file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)


def first_exited(processes: Sequence[BaseProcess], wait_s: float = 0.0) -> int | None:
    """The rank of the first follower seen exited within `wait_s`, or None."""
    deadline = time.monotonic() + wait_s
    while True:
        for rank, p in enumerate(processes, start=1):
            if p.exitcode is not None:
                return rank
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S / 4)


def stop_for(processes: Sequence[BaseProcess], rank: int) -> None:
    """Rank 0, once follower `rank` has exited: kill the others, say why, exit 1."""
    for p in processes:
        if p.exitcode is None:
            p.kill()
    p = processes[rank - 1]
    fatal(
        f"tensor-parallel rank {rank} (pid {p.pid}) exited with code {p.exitcode}: stopping every rank"
    )


def watch_followers(processes: Sequence[BaseProcess], stopping: threading.Event) -> None:
    """Rank 0: any follower that exits while `stopping` is unset stops every rank."""

    def run() -> None:
        while not stopping.wait(POLL_S):
            rank = first_exited(processes)
            if rank is not None and not stopping.is_set():
                stop_for(processes, rank)

    threading.Thread(target=run, name="rimuru-tp-watchdog", daemon=True).start()


def watch_parent(rank: int) -> None:
    """A follower: exit when rank 0, the process that started it, is gone."""
    parent = multiprocessing.parent_process()
    if parent is None:  # not started by rank 0 (a test driving a rank by hand)
        return

    def run() -> None:
        while parent.is_alive():
            threading.Event().wait(POLL_S)
        fatal(f"tensor-parallel rank {rank}: rank 0 (pid {parent.pid}) is gone, exiting")

    threading.Thread(target=run, name="rimuru-tp-parent-watch", daemon=True).start()
