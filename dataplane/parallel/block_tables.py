"""KV block tables as they travel to the other ranks: only the rows a rank lacks.

A request's table only grows (one row per 16-token block, a page per attention layer)
until it is preempted or finishes, when it is emptied whole. So rank 0 sends each
scheduled request's new rows, with its epoch (the request's preemptions so far: a
preempted request's table starts again from row 0), and the ids of requests whose tables
were emptied since (finished or preempted); a follower keeps the tables, empties the ones
it is told to forget (so that its device block-table store hands their rows back, as rank
0's does), and rebuilds each step's slices from them.
Sending whole tables instead would cost every running request's whole context, every
step (256 requests of 1,600 tokens, 48 layers: ~10 MB per step).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from rimuru.dataplane.engine.forward.paged_attention import SequenceSlice
from rimuru.dataplane.engine.sched.request import Request
from rimuru.dataplane.memory.tables import BlockTable

_TRAVELLING = BlockTable(0)  # a slice's table while it travels: the delta carries its rows


@dataclass(frozen=True)
class BlockRows:
    """One scheduled request's table rows start .. start + len(rows) - 1."""

    request_id: str
    epoch: int  # the request's preemptions so far
    start: int  # rows the followers already hold; 0 = the whole table
    rows: np.ndarray  # [n, L] int64 KV page ids


@dataclass(frozen=True)
class BlockTableDelta:
    forget: tuple[str, ...]  # requests finished or preempted since the last step
    rows: tuple[BlockRows, ...]  # one per scheduled request, in the batch's slice order


class BlockTableSender:
    """Rank 0: what each request's table was when last sent."""

    def __init__(self) -> None:
        self._sent: dict[str, tuple[Request, int, int]] = {}  # id -> (request, epoch, rows)

    def delta(self, requests: list[Request]) -> BlockTableDelta:
        forget = tuple(
            rid
            for rid, (r, epoch, _) in self._sent.items()
            if r.status.finished or r.num_preemptions != epoch
        )
        for rid in forget:
            del self._sent[rid]
        rows = []
        for r in requests:
            table = r.block_table.array()
            known = self._sent.get(r.request_id)
            start = known[2] if known and known[0] is r and known[1] == r.num_preemptions else 0
            rows.append(BlockRows(r.request_id, r.num_preemptions, start, table[start:].copy()))
            self._sent[r.request_id] = (r, r.num_preemptions, len(table))
        return BlockTableDelta(forget, tuple(rows))

    @staticmethod
    def bare(slices: list[SequenceSlice]) -> list[SequenceSlice]:
        """The slices without their tables (the delta carries them)."""
        return [replace(s, table=_TRAVELLING) for s in slices]


class BlockTableMirror:
    """A follower: every scheduled request's table, from the deltas."""

    def __init__(self) -> None:
        self._tables: dict[str, tuple[int, BlockTable]] = {}  # id -> (epoch, table)

    def slices(self, delta: BlockTableDelta, bare: list[SequenceSlice]) -> list[SequenceSlice]:
        for rid in delta.forget:
            self._forget(rid)
        out = []
        for s, d in zip(bare, delta.rows, strict=True):
            if d.start == 0:
                self._forget(d.request_id)
                epoch, table = d.epoch, BlockTable(d.rows.shape[1])
            else:
                epoch, table = self._tables.get(d.request_id, (None, None))
                if epoch != d.epoch or table is None or len(table) != d.start:
                    raise AssertionError(
                        f"request {d.request_id}: rank 0 sent rows from {d.start} (epoch "
                        f"{d.epoch}), this rank holds {0 if table is None else len(table)} "
                        f"(epoch {epoch})"
                    )
            for row in d.rows.tolist():
                table.append_block(row)
            self._tables[d.request_id] = (epoch, table)
            out.append(replace(s, table=table))
        return out

    def _forget(self, request_id: str) -> None:
        """Drop a request's table, emptied: the device store's row for it goes back."""
        _, table = self._tables.pop(request_id, (None, None))
        if table is not None:
            table.pop_blocks()

    def __len__(self) -> int:
        return len(self._tables)
