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
from collections.abc import Sequence
from multiprocessing.process import BaseProcess

POLL_S = 0.2
EXIT_CODE = 1


def fatal(message: str) -> None:
    print(f"rimuru: {message}", file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)


def watch_followers(processes: Sequence[BaseProcess], stopping: threading.Event) -> None:
    """Rank 0: any follower that exits while `stopping` is unset stops every rank."""

    def run() -> None:
        while not stopping.wait(POLL_S):
            for rank, p in enumerate(processes, start=1):
                if p.exitcode is not None and not stopping.is_set():
                    for other in processes:
                        if other.exitcode is None:
                            other.kill()
                    fatal(
                        f"tensor-parallel rank {rank} (pid {p.pid}) exited with code "
                        f"{p.exitcode}: stopping every rank"
                    )

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
