"""Residency as it travels between ranks: the moves rank 0's residency table made since
the last step message, netted into one change list (engine/sched/round_moves.py), and a
digest of its expert page table that every rank checks after applying them.

Every path that moves an expert on rank 0 (the adjuster after a round, make_room inside
one, start-up residency, a live policy push) goes through the table's apply,
load_initial or release_all, which keep its moves, so all reach the other ranks alike;
the digest would catch one that did not. A follower applies loads before evictions: an
expert that moved is just loaded at its new pages, and no layer ever has more experts
offloaded than it had before or will have after (device copy-in refuses more than its
slots), which evictions first could break for a moment.

Ordering rules this keeps on every rank (rank 0 keeps them in its ResidencyTable):
  * a load copies into its pages before the page table points at them (ResidencyTable.place);
  * a page is reused only after the forward that last read it: rank 0 reuses a page id
    only once its own reclaim says so, and a follower reads step t+1's message only
    after its forward of step t has finished (follower.py synchronises the device).
"""

from __future__ import annotations

import hashlib

import torch

from rimuru.dataplane.adjust.adjuster import ChangeList
from rimuru.dataplane.engine.experts.residency_table import ResidencyTable


def table_digest(table: torch.Tensor) -> str:
    """The expert page table [L, E, 3] int32 (host), as a short hash."""
    return hashlib.blake2b(table.numpy().tobytes(), digest_size=16).hexdigest()


def apply_changes(residency: ResidencyTable, changes: ChangeList, step: int) -> None:
    """A follower's side: loads (moves included), then evictions (module doc)."""
    for load in changes.load:
        residency.place(load.layer, load.expert, load.pages)
    for layer, expert in changes.evict:
        residency.evict(layer, expert, step)
