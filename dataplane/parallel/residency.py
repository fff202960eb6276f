"""Residency as it travels between ranks: rank 0's expert page table, diffed against what
it last sent, and a digest of it that every rank checks after applying the diff.

The diff is taken from the table itself, not from the adjuster's change lists, so every
path that moves an expert (the adjuster between rounds, make_room inside one, start-up
residency, a live policy push) reaches the other ranks alike. A follower applies loads
before evictions: an expert that moved is just loaded at its new pages, and no layer ever
has more experts offloaded than it had before or will have after (device copy-in refuses
more than its slots), which evictions first could break for a moment.

Ordering rules this keeps on every rank (rank 0 keeps them in its ResidencyTable):
  * a load copies into its pages before the page table points at them (ResidencyTable.place);
  * a page is reused only after the forward that last read it: rank 0 reuses a page id
    only once its own reclaim says so, and a follower reads step t+1's message only
    after its forward of step t has finished (follower.py synchronises the device).
"""

from __future__ import annotations

import hashlib

import torch

from rimuru.dataplane.adjust.adjuster import ChangeList, ExpertLoad
from rimuru.dataplane.engine.experts.residency_table import ResidencyTable
from rimuru.dataplane.memory.tables import NOT_PRESENT


def table_digest(table: torch.Tensor) -> str:
    """The expert page table [L, E, 3] int32 (host), as a short hash."""
    return hashlib.blake2b(table.numpy().tobytes(), digest_size=16).hexdigest()


class ResidencyDiff:
    """Rank 0's side: the table as last sent; `changes` returns what moved since."""

    def __init__(self, table: torch.Tensor):
        self._sent = torch.full_like(table, NOT_PRESENT)  # the other ranks start empty

    def changes(self, table: torch.Tensor) -> ChangeList:
        moved = (table != self._sent).any(dim=-1).nonzero().tolist()  # [(layer, expert)]
        evict = tuple(
            (layer, expert) for layer, expert in moved if table[layer, expert, 0] == NOT_PRESENT
        )
        load = tuple(
            ExpertLoad(layer, expert, tuple(table[layer, expert].tolist()))
            for layer, expert in moved
            if table[layer, expert, 0] != NOT_PRESENT
        )
        self._sent = table.clone()
        return ChangeList(evict=evict, load=load)


def apply_changes(residency: ResidencyTable, changes: ChangeList, step: int) -> None:
    """A follower's side: loads (moves included), then evictions (module doc)."""
    for load in changes.load:
        residency.place(load.layer, load.expert, load.pages)
    for layer, expert in changes.evict:
        residency.evict(layer, expert, step)
